"""What a request is held to: :class:`Limits` (the largest and default ``max_tokens``, the top-K, the
most alternatives per token, what ``logprob`` holds, the default temperature), checked once when
built; :mod:`~logtoku_guard.server.wire` applies them to each request."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, short_repr

__all__ = [
    "CHAT_DEFAULT_MAX_TOKENS",
    "COMPLETION_DEFAULT_MAX_TOKENS",
    "LOGPROBS_MODES",
    "OPENAI_MAX_TOP_LOGPROBS",
    "Limits",
    "LogprobsMode",
    "kept_alternatives",
]

LogprobsMode = Literal["raw_logprobs", "raw_logits"]
LOGPROBS_MODES: tuple[LogprobsMode, ...] = ("raw_logprobs", "raw_logits")
"""What ``logprob`` holds: log-probabilities (OpenAI's meaning, the default) or raw logits (vLLM's opt-in)."""
OPENAI_MAX_TOP_LOGPROBS = 20
"""OpenAI's largest ``top_logprobs``."""


CHAT_DEFAULT_MAX_TOKENS = 256
"""``max_tokens`` of a chat request that sends none, unless ``--default-max-tokens`` says otherwise."""


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the largest ``max_tokens`` and the default one (None: 256, or
    ``max_tokens`` if lower), the top-K of AU/EU, the most
    alternatives per token (``top_logprobs``: what the backend keeps, at most OpenAI's 20), what
    ``logprob`` holds, and the temperature of a request that sends none (OpenAI's 1: sampled)."""

    max_tokens: int = 1024
    default_max_tokens: int = None  # type: ignore[assignment]  # None: CHAT_DEFAULT_MAX_TOKENS, or max_tokens if lower
    k: int = 2
    max_top_logprobs: int = OPENAI_MAX_TOP_LOGPROBS
    logprobs_mode: LogprobsMode = "raw_logprobs"
    default_temperature: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            msg = f"--max-tokens must be a whole number >= 1, got {short_repr(self.max_tokens)}; the default is 1024"
            raise ConfigurationError(msg)
        if self.default_max_tokens is None:
            object.__setattr__(self, "default_max_tokens", min(CHAT_DEFAULT_MAX_TOKENS, self.max_tokens))
        n = self.default_max_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_tokens:
            msg = f"--default-max-tokens must be from 1 to --max-tokens ({self.max_tokens}), got {short_repr(n)}"
            raise ConfigurationError(msg)
        if self.logprobs_mode not in LOGPROBS_MODES:
            msg = f"--logprobs-mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            raise ConfigurationError(msg)
        if not (math.isfinite(self.default_temperature) and self.default_temperature >= 0):
            msg = f"--default-temperature must be a finite number >= 0 (0: greedy), got {self.default_temperature!r}"
            raise ConfigurationError(msg)


def kept_alternatives(backend: Backend) -> int:
    """How many alternatives per token ``backend`` keeps for ``top_logprobs`` (its ``max_logprobs``, else K), at most 20."""
    kept = getattr(backend, "max_logprobs", None)
    return min(OPENAI_MAX_TOP_LOGPROBS, int(kept) if isinstance(kept, int) and kept > 0 else int(backend.k))


COMPLETION_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` of ``/v1/completions``."""
