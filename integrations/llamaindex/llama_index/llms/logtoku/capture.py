"""The side channel that carries scored generations past ``llm.predict()`` (kept for imports).

It now lives in the core, :mod:`logtoku_guard.capture`, shared with the LangChain adapter;
this module re-exports it so ``from llama_index.llms.logtoku.capture import capture_generations``
keeps working::

    with capture_generations() as captured:
        answer = query_engine.query("Who founded the Zarnovian Institute?")
    captured.last.score.reliability, captured.last.tokens

:class:`WithheldCapture` is the LlamaIndex adapter's own: while one is active,
:class:`~llama_index.llms.logtoku.LogTokULLM` answers ``stream()``/``astream()`` calls whole,
without streaming, so no ``LLMChatInProgressEvent``/``LLMCompletionInProgressEvent`` carries a
draft that a guard may still withdraw (``LogTokUQueryEngine(stream_mode="after_decision")``).
"""

from __future__ import annotations

from dataclasses import dataclass

from logtoku_guard.capture import (
    GenerationCapture,
    active_captures,
    capture_generations,
    captured_aiter,
    captured_iter,
)

__all__ = [
    "GenerationCapture",
    "WithheldCapture",
    "active_captures",
    "capture_generations",
    "captured_aiter",
    "captured_iter",
    "withheld",
]


@dataclass
class WithheldCapture(GenerationCapture):
    """A capture whose generations are drafts held back until a guard decides: not streamed."""


def withheld() -> bool:
    """True when a :class:`WithheldCapture` is active (an LLM call made now must not stream)."""
    return any(isinstance(c, WithheldCapture) for c in active_captures())
