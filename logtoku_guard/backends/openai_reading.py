"""Reading an OpenAI-compatible server's chat responses (for
:class:`~logtoku_guard.backends.openai_compat.OpenAICompatibleBackend`): a stream's state, a chunk or an
error event, a choice's token entries, the top-K statistics the wire allows."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from logtoku_guard.scoring.uncertainty import row_lse_entropy
from logtoku_guard.types import TokenScore
from logtoku_guard.wire import openai_protocol as proto

__all__ = ["CHUNK_OR_ERROR", "StreamState", "as_float", "token_entries", "topk_stats"]


class StreamState:
    """What a streamed chat completion has delivered so far (tokens, text, refusal, its last chunk's fields)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first_s: float | None = None
        self.text = ""
        self.tokens: list[TokenScore] = []
        self.finish: Any = None
        self.stop: Any = None
        self.prompt_tokens = 0
        self.cancelled = False
        self.checked = False
        self.sent = 0
        self.summary: Any = None
        self.refusal: str | None = None


CHUNK_OR_ERROR: TypeAdapter[proto.ChatCompletionChunk | proto.ErrorResponse] = TypeAdapter(
    proto.ChatCompletionChunk | proto.ErrorResponse
)
"""A server-sent event of a chat stream: a chunk, or the error the server sent mid-stream."""


def token_entries(logprobs: proto.ChatLogprobs | None) -> list[proto.ChatTokenLogprob]:
    """The token entries of a choice's ``logprobs`` (none when it has none)."""
    return (logprobs.content or []) if logprobs is not None else []


def as_float(x: Any) -> float:
    """``x`` as a float, NaN for a JSON null."""
    return math.nan if x is None else float(x)


def topk_stats(chosen: float, z: Sequence[float]) -> tuple[float, float]:
    """``(log p, entropy)`` under the softmax of the K raw logits ``z`` (the wire has no more)."""
    (lse,), (entropy,) = row_lse_entropy([z])
    return (chosen - lse if math.isfinite(chosen) else math.nan), entropy
