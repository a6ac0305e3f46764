"""LlamaIndex integration of logtoku_guard: an LLM whose tokens carry LogTokU scores, and a
query engine that passes, warns, re-queries with more context, abstains or asks a human.

    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.llms.logtoku import LogTokULLM, LogTokUQueryEngine

    Settings.llm = LogTokULLM()                      # the embedded SmolLM2 model, loaded on first use
    engine = LogTokUQueryEngine.from_index(index)    # default policy: quantiles of the model's profile
    response = engine.query("Who founded the Zarnovian Institute?")
    response.metadata["logtoku"]["action"], response.metadata["logtoku"]["reason"]

``llama_index`` and ``llama_index.llms`` are namespace packages shared with llama-index-core.
"""

from llama_index.llms.logtoku.base import LogTokULLM, summary_payload, to_core_messages, token_payload
from llama_index.llms.logtoku.events import LogTokUDecisionEvent
from llama_index.llms.logtoku.query_engine import LogTokUQueryEngine
from logtoku_guard.guard.generation_capture import GenerationCapture, capture_generations, captured_aiter, captured_iter

__all__ = [
    "GenerationCapture",
    "LogTokUDecisionEvent",
    "LogTokULLM",
    "LogTokUQueryEngine",
    "capture_generations",
    "captured_aiter",
    "captured_iter",
    "summary_payload",
    "to_core_messages",
    "token_payload",
]
