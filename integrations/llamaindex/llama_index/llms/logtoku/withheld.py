"""Drafts held back: while a :class:`WithheldCapture` is active,
:class:`~llama_index.llms.logtoku.LogTokULLM` answers ``stream()``/``astream()`` calls whole,
without streaming, so no ``LLMChatInProgressEvent``/``LLMCompletionInProgressEvent`` carries a
draft that a guard may still withdraw (``LogTokUQueryEngine(stream_mode="after_decision")``).

The capture channel itself is the core's, :mod:`logtoku_guard.guard.generation_capture`.
"""

from __future__ import annotations

from dataclasses import dataclass

from logtoku_guard.guard.generation_capture import GenerationCapture, active_captures

__all__ = ["WithheldCapture", "withheld"]


@dataclass
class WithheldCapture(GenerationCapture):
    """A capture whose generations are drafts held back until a guard decides: not streamed."""


def withheld() -> bool:
    """True when a :class:`WithheldCapture` is active (an LLM call made now must not stream)."""
    return any(isinstance(c, WithheldCapture) for c in active_captures())
