"""The side channel that carries scored generations past ``llm.predict()`` (kept for imports).

It now lives in the core, :mod:`logtoku_guard.capture`, shared with the LangChain adapter;
this module re-exports it so ``from llama_index.llms.logtoku.capture import capture_generations``
keeps working::

    with capture_generations() as captured:
        answer = query_engine.query("Who founded the Zarnovian Institute?")
    captured.last.score.reliability, captured.last.tokens
"""

from __future__ import annotations

from logtoku_guard.capture import (
    GenerationCapture,
    active_captures,
    capture_generations,
    captured_aiter,
    captured_iter,
)

__all__ = ["GenerationCapture", "active_captures", "capture_generations", "captured_aiter", "captured_iter"]
