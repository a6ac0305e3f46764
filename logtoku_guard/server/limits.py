"""What a request is held to: :class:`Limits` (the largest and default ``max_tokens``, the top-K, the
most alternatives per token, what ``logprob`` holds, the default temperature), checked once when
built; :mod:`~logtoku_guard.server.wire` applies them to each request.

A request that leaves out ``temperature`` or ``max_tokens`` is decoded as the guard was calibrated
(greedy, with the answer length its profile's guard was fitted on, else ``ask``'s 64 tokens), not
with OpenAI's defaults: vLLM likewise takes omitted sampling parameters from the model's own
generation config. Sampled at OpenAI's temperature 1 the shipped guard flags 179 of 180 answers
(docs/SERVING.md); ``serve --default-temperature 1 --default-max-tokens 256`` gives OpenAI's back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from logtoku_guard.backends.base import Backend
from logtoku_guard.errors import ConfigurationError, short_repr

if TYPE_CHECKING:
    from logtoku_guard.calibration.profiles import ModelProfile

__all__ = [
    "CALIBRATION_MAX_TOKENS",
    "LOGPROBS_MODES",
    "OPENAI_MAX_TOP_LOGPROBS",
    "Limits",
    "LogprobsMode",
    "calibrated_max_tokens",
    "kept_alternatives",
]

LogprobsMode = Literal["raw_logprobs", "raw_logits"]
LOGPROBS_MODES: tuple[LogprobsMode, ...] = ("raw_logprobs", "raw_logits")
"""What ``logprob`` holds: log-probabilities (OpenAI's meaning, the default) or raw logits (vLLM's opt-in)."""
OPENAI_MAX_TOP_LOGPROBS = 20
"""OpenAI's largest ``top_logprobs``."""


CALIBRATION_MAX_TOKENS = 64
"""The answer length ``ask`` and ``calibrate`` use and the shipped guards were fitted on: the
``max_tokens`` of a request that sends none, unless the profile's guard records another length or
``--default-max-tokens`` says otherwise."""


def calibrated_max_tokens(profile: ModelProfile | None) -> int:
    """The answer length ``profile``'s guard was fitted on (its ``max_tokens``); :data:`CALIBRATION_MAX_TOKENS`
    (``ask``'s and ``calibrate``'s default) when there is no profile, or its guard does not record one."""
    n = getattr(getattr(profile, "guard", None), "max_tokens", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else CALIBRATION_MAX_TOKENS


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the largest ``max_tokens``; the ``max_tokens`` of a request that
    sends none (``default_max_tokens``; None: ``calibrated_max_tokens``, the length the guard was
    fitted on, or ``max_tokens`` if lower: :attr:`omitted_max_tokens`); the top-K of AU/EU; the most
    alternatives per token (``top_logprobs``: what the backend keeps, at most OpenAI's 20); what
    ``logprob`` holds; and the temperature of a request that sends none (0: greedy, as the guard was
    calibrated; OpenAI's default is 1, sampled). Both defaults apply to ``/v1/chat/completions`` and
    ``/v1/completions`` alike."""

    max_tokens: int = 1024
    default_max_tokens: int | None = None
    k: int = 2
    max_top_logprobs: int = OPENAI_MAX_TOP_LOGPROBS
    logprobs_mode: LogprobsMode = "raw_logprobs"
    default_temperature: float = 0.0
    calibrated_max_tokens: int = CALIBRATION_MAX_TOKENS
    """The answer length the guard was calibrated on (:func:`calibrated_max_tokens` of the served profile)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            msg = f"--max-tokens must be a whole number >= 1, got {short_repr(self.max_tokens)}; the default is 1024"
            raise ConfigurationError(msg)
        n = self.default_max_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.max_tokens):
            msg = f"--default-max-tokens must be from 1 to --max-tokens ({self.max_tokens}), got {short_repr(n)}"
            raise ConfigurationError(msg)
        c = self.calibrated_max_tokens
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            msg = f"calibrated_max_tokens must be a whole number of tokens >= 1, got {short_repr(c)}"
            raise ConfigurationError(msg)
        if self.logprobs_mode not in LOGPROBS_MODES:
            msg = f"--logprobs-mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            raise ConfigurationError(msg)
        t = self.default_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0):
            msg = f"--default-temperature must be a finite number >= 0 (0: greedy), got {short_repr(t)}"
            raise ConfigurationError(msg)

    @property
    def omitted_max_tokens(self) -> int:
        """The ``max_tokens`` of a request that sends none: ``default_max_tokens``, else the calibrated
        length (at most ``max_tokens``)."""
        if self.default_max_tokens is not None:
            return self.default_max_tokens
        return min(self.calibrated_max_tokens, self.max_tokens)


def kept_alternatives(backend: Backend) -> int:
    """How many alternatives per token ``backend`` keeps for ``top_logprobs`` (its ``max_logprobs``, else K), at most 20."""
    kept = getattr(backend, "max_logprobs", None)
    return min(OPENAI_MAX_TOP_LOGPROBS, int(kept) if isinstance(kept, int) and kept > 0 else int(backend.k))
