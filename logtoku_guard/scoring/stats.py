"""Response-level statistics a policy reads, computed from a generation's token scores.

Every statistic is named with its direction: ``reliability*`` higher = more reliable; every
``*_eu``/``*_au``/``*_share`` higher = more uncertain (:data:`HIGHER_IS_RELIABLE`). A NaN
statistic is undefined; :meth:`ResponseStats.undefined_reason` says why (an empty answer,
NaN token scores), and policies count it as the least reliable value by default.

Quadrants follow :mod:`logtoku_guard.scoring.uncertainty` (:func:`~logtoku_guard.scoring.quadrants.quadrant_of`,
:func:`~logtoku_guard.scoring.quadrants.quadrant_shares`): a token whose AU or EU is undefined (NaN, raw
evidence mode) is in no quadrant, and shares divide by *all* tokens of the answer, so the
policy's ``quadrant_*_share`` statistics agree with every JSON payload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.claims import ClaimStats
from logtoku_guard.scoring.prompt_stats import PromptStats
from logtoku_guard.scoring.quadrants import Quadrant, QuadrantThresholds, quadrant_shares
from logtoku_guard.scoring.uncertainty import DEFAULT_TOP_N, word_scores
from logtoku_guard.types import Generation, ResponseScore, TokenScore

StatName = Literal[
    "reliability",
    "reliability_mean",
    "probability_reliability",
    "entropy_reliability",
    "max_eu",
    "mean_eu",
    "max_au",
    "mean_au",
    "first_eu",
    "quadrant_i_share",
    "quadrant_ii_share",
    "unreliable_share",
    "n_tokens",
    "first_max_eu",
    "word_mean_eu",
    "prompt_max_eu",
    "prompt_mean_eu",
    "prompt_mean_logprob",
    "prompt_min_logprob",
    "reliability_debiased",
    "guard_score",
    "claim_max_eu",
    "claim_mean_eu",
    "claim_min_logprob",
    "claim_mean_logprob",
    "question_echo",
]
STAT_NAMES: tuple[str, ...] = get_args(StatName)
HIGHER_IS_RELIABLE: frozenset[str] = frozenset(
    {
        "reliability",
        "reliability_mean",
        "probability_reliability",
        "entropy_reliability",
        "reliability_debiased",
        "guard_score",
        "prompt_mean_logprob",
        "prompt_min_logprob",
        "claim_min_logprob",
        "claim_mean_logprob",
        "question_echo",
    }
)
"""Statistics where higher means more reliable; every other one (``*_eu``, ``*_au``,
``*_share``, ``n_tokens``) is higher = more uncertain (or longer). A policy's
``undefined: least_reliable`` reads a NaN as ``-inf`` for these and ``+inf`` for the others."""
MONOTONE_INCREASING: frozenset[str] = frozenset({"max_eu", "max_au", "n_tokens"})
"""Statistics that can only grow as an answer gets longer: a ``>`` rule over them that fired on
a prefix fires on the whole answer (so streaming may stop early)."""

DEFAULT_FIRST_TOKENS = 5


@dataclass(frozen=True)
class ResponseStats:
    """The statistics of one answer (NaN where undefined, e.g. an empty answer).

    ``score``: the answer's :class:`~logtoku_guard.types.ResponseScore`, the one holder of the
    four reliability numbers; ``reliability``, ``reliability_mean``,
    ``probability_reliability`` and ``entropy_reliability`` read through to it.
    ``first_eu``: mean EU over the first ``first_tokens`` content tokens (whitespace-only and
    empty pieces skipped). ``quadrant_*_share``: share of *all* tokens in quadrant I / II / I or
    II (``unreliable_share``) against the given quadrant thresholds (NaN without thresholds); a
    token with undefined AU/EU is in no quadrant (see :func:`~logtoku_guard.scoring.quadrants.quadrant_shares`).
    ``first_max_eu``: max EU over those first content tokens; ``word_mean_eu``: mean over the
    answer's words of each word's max EU (:func:`~logtoku_guard.scoring.uncertainty.word_scores`).
    ``prompt_*``: the question's own tokens, teacher-forced at the prefill pass
    (:class:`~logtoku_guard.scoring.prompt_stats.PromptStats`; NaN without prompt scores).
    ``claim_*``: the words the answer asserts beyond the question (:mod:`logtoku_guard.scoring.claims`:
    max/mean word EU, min/mean log-probability; NaN when it asserts no new content word);
    ``question_echo``: the share of the question's content words the answer repeats (NaN when
    the question has none; higher = the answer addresses the question).
    ``reliability_debiased`` and ``guard_score`` need a fitted guard model
    (:func:`logtoku_guard.scoring.guard_score.with_guard_score`; NaN otherwise): reliability minus its
    expected value at this answer length, and the predicted probability that the answer is
    correct/known (both higher = more reliable).
    """

    score: ResponseScore
    max_eu: float
    mean_eu: float
    max_au: float
    mean_au: float
    first_eu: float
    quadrant_i_share: float
    quadrant_ii_share: float
    unreliable_share: float
    n_tokens: float
    first_max_eu: float = math.nan
    word_mean_eu: float = math.nan
    prompt_max_eu: float = math.nan
    prompt_mean_eu: float = math.nan
    prompt_mean_logprob: float = math.nan
    prompt_min_logprob: float = math.nan
    reliability_debiased: float = math.nan
    guard_score: float = math.nan
    claim_max_eu: float = math.nan
    claim_mean_eu: float = math.nan
    claim_min_logprob: float = math.nan
    claim_mean_logprob: float = math.nan
    question_echo: float = math.nan

    @property
    def reliability(self) -> float:
        return self.score.reliability

    @property
    def reliability_mean(self) -> float:
        return self.score.reliability_mean

    @property
    def probability_reliability(self) -> float:
        return self.score.probability_reliability

    @property
    def entropy_reliability(self) -> float:
        return self.score.entropy_reliability

    def get(self, name: str) -> float:
        """The statistic ``name`` (one of :data:`STAT_NAMES`) as a float."""
        if name not in STAT_NAMES:
            msg = f"unknown response statistic {name!r}; choose one of {list(STAT_NAMES)}"
            raise ConfigurationError(msg)
        return float(getattr(self, name))

    def undefined_reason(self, name: str) -> str | None:
        """Why statistic ``name`` is undefined (NaN), or None when it is a number.

        ``"empty answer"`` (no tokens), ``"no quadrant thresholds (no profile)"`` for the
        quadrant shares computed without thresholds, ``"no content tokens or NaN token scores"``
        for ``first_eu``, else ``"NaN token scores"`` (raw evidence mode).
        """
        if not math.isnan(self.get(name)):
            return None
        if self.n_tokens == 0:
            return "empty answer"
        if name in ("quadrant_i_share", "quadrant_ii_share", "unreliable_share") and math.isnan(self.quadrant_i_share):
            return "no quadrant thresholds (no profile)"
        if name in ("first_eu", "first_max_eu"):
            return "no content tokens or NaN token scores"
        if name.startswith("claim_"):
            return "the answer asserts no content word beyond the question"
        if name == "question_echo":
            return "the question has no content word"
        if name.startswith("prompt_"):
            return "no prompt scores (the backend does not see the prompt's logits)"
        if name in ("guard_score", "reliability_debiased") and math.isnan(self.guard_score):
            return "no fitted guard score in the profile"
        return "NaN token scores"

    def as_dict(self) -> dict[str, float | None]:
        """Every statistic by name, undefined ones as ``None`` (:func:`logtoku_guard.wire.payloads.stats_payload`)."""
        values = {name: self.get(name) for name in STAT_NAMES}
        return {name: (v if math.isfinite(v) else None) for name, v in values.items()}

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[TokenScore],
        top_n: int = DEFAULT_TOP_N,
        quadrants: QuadrantThresholds | None = None,
        first_tokens: int = DEFAULT_FIRST_TOKENS,
        *,
        score: ResponseScore | None = None,
        prompt_tokens: Sequence[TokenScore] = (),
        question: str = "",
    ) -> ResponseStats:
        """The statistics of ``tokens`` (``score``: their ResponseScore, when already computed;
        ``prompt_tokens``: the question's teacher-forced scores, for the ``prompt_*`` statistics;
        ``question``: its text, whose words are not part of the answer's claim)."""
        score = score if score is not None else ResponseScore.from_tokens(tokens, top_n)
        nan = math.nan
        n = len(tokens)
        au = [t.au for t in tokens]
        eu = [t.eu for t in tokens]
        content = [t.eu for t in tokens if t.text.strip()][:first_tokens]
        shares = quadrant_shares(tokens, quadrants)
        q1 = shares[Quadrant.I.value] if shares is not None else nan
        q2 = shares[Quadrant.II.value] if shares is not None else nan
        return cls(
            score=score,
            max_eu=_max(eu),
            mean_eu=sum(eu) / n if n else nan,
            max_au=_max(au),
            mean_au=sum(au) / n if n else nan,
            first_eu=sum(content) / len(content) if content else nan,
            quadrant_i_share=q1,
            quadrant_ii_share=q2,
            unreliable_share=q1 + q2,
            n_tokens=float(n),
            first_max_eu=_max(content),
            word_mean_eu=_word_mean_eu(tokens),
            **vars(PromptStats.from_tokens(prompt_tokens)),
            **vars(ClaimStats.from_tokens(tokens, question)),
        )

    @classmethod
    def from_generation(
        cls, generation: Generation, quadrants: QuadrantThresholds | None = None, first_tokens: int = DEFAULT_FIRST_TOKENS
    ) -> ResponseStats:
        """The statistics of a generation (its cached ``score`` is reused)."""
        return cls.from_tokens(
            generation.tokens,
            generation.top_n,
            quadrants,
            first_tokens,
            score=generation.score,
            prompt_tokens=generation.prompt_scores,
            question=generation.prompt,
        )


def _max(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


def _word_mean_eu(tokens: Sequence[TokenScore]) -> float:
    """Mean over words of each word's max EU (NaN: no word, or a NaN EU)."""
    words = word_scores([t.text for t in tokens], [t.au for t in tokens], [t.eu for t in tokens])
    if not words:
        return math.nan
    return sum(w.eu for w in words) / len(words)
