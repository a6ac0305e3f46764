"""Prompt-side statistics: how surprising the question itself was to the model.

The backend scores the user's question teacher-forced at the prefill pass
(:attr:`~logtoku_guard.types.Generation.prompt_scores`, made by
:mod:`logtoku_guard.backends.prompt_scoring`). :class:`PromptStats` summarises those tokens:

* ``prompt_max_eu`` / ``prompt_mean_eu``: LogTokU EU of the distributions that predicted each
  question token (higher = the model knew less about what came next);
* ``prompt_mean_logprob`` / ``prompt_min_logprob``: log-probability of the question's tokens
  (higher = less surprising; an invented name has very unlikely sub-words).

:func:`focus_tokens` keeps the tokens of one substring (the evaluation prompts wrap the
question in an instruction: only the question's tokens are summarised). All NaN when the
generation has no prompt scores (an OpenAI-compatible server, a scripted backend).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from logtoku_guard.types import TokenScore

__all__ = ["PromptStats", "focus_tokens"]


def focus_tokens(tokens: Sequence[TokenScore], focus: str | None) -> tuple[TokenScore, ...]:
    """The tokens overlapping the last occurrence of ``focus`` in their joined text.

    ``None`` or a substring that is not there: every token.
    """
    if not focus:
        return tuple(tokens)
    text = "".join(t.text for t in tokens)
    start = text.rfind(focus)
    if start < 0:
        return tuple(tokens)
    end = start + len(focus)
    kept, offset = [], 0
    for t in tokens:
        a, offset = offset, offset + len(t.text)
        if offset > start and a < end and t.text.strip():
            kept.append(t)
    return tuple(kept)


@dataclass(frozen=True)
class PromptStats:
    """Summary of the question's teacher-forced token scores (NaN when there are none)."""

    prompt_max_eu: float
    prompt_mean_eu: float
    prompt_mean_logprob: float
    prompt_min_logprob: float

    @classmethod
    def from_tokens(cls, tokens: Sequence[TokenScore]) -> PromptStats:
        eu = [t.eu for t in tokens]
        lp = [t.logprob for t in tokens]
        if not tokens:
            return cls(math.nan, math.nan, math.nan, math.nan)
        nan_eu = any(math.isnan(v) for v in eu)
        return cls(
            prompt_max_eu=math.nan if nan_eu else max(eu),
            prompt_mean_eu=sum(eu) / len(eu),
            prompt_mean_logprob=sum(lp) / len(lp),
            prompt_min_logprob=min(lp),
        )
