"""Response-level statistics a policy reads, computed from a generation's token scores.

Every statistic is named with its direction: ``reliability*`` higher = more reliable; every
``*_eu``/``*_au``/``*_share`` higher = more uncertain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, get_args

from logtoku_guard.types import Generation, ResponseScore, TokenScore
from logtoku_guard.uncertainty import DEFAULT_TOP_N, Quadrant, QuadrantThresholds

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
]
STAT_NAMES: tuple[str, ...] = get_args(StatName)
MONOTONE_INCREASING: frozenset[str] = frozenset({"max_eu", "max_au", "n_tokens"})
"""Statistics that can only grow as an answer gets longer: a ``>`` rule over them that fired on
a prefix fires on the whole answer (so streaming may stop early)."""

DEFAULT_FIRST_TOKENS = 5


@dataclass(frozen=True)
class ResponseStats:
    """The statistics of one answer (NaN where undefined, e.g. an empty answer).

    ``first_eu``: mean EU over the first ``first_tokens`` content tokens (whitespace-only and
    empty pieces skipped). ``quadrant_*_share``: share of tokens in quadrant I / II / I or II
    (``unreliable_share``) against the given quadrant thresholds (NaN without thresholds).
    """

    reliability: float
    reliability_mean: float
    probability_reliability: float
    entropy_reliability: float
    max_eu: float
    mean_eu: float
    max_au: float
    mean_au: float
    first_eu: float
    quadrant_i_share: float
    quadrant_ii_share: float
    unreliable_share: float
    n_tokens: float

    def get(self, name: str) -> float:
        return float(getattr(self, name))

    def as_dict(self) -> dict[str, float | None]:
        return {k: (v if math.isfinite(v) else None) for k, v in asdict(self).items()}

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[TokenScore],
        top_n: int = DEFAULT_TOP_N,
        quadrants: QuadrantThresholds | None = None,
        first_tokens: int = DEFAULT_FIRST_TOKENS,
    ) -> ResponseStats:
        score = ResponseScore.from_tokens(tokens, top_n)
        nan = math.nan
        n = len(tokens)
        au = [t.au for t in tokens]
        eu = [t.eu for t in tokens]
        content = [t.eu for t in tokens if t.text.strip()][:first_tokens]
        if quadrants is not None and n:
            labels = [quadrants.classify(t.au, t.eu) for t in tokens]
            q1 = sum(q is Quadrant.I for q in labels) / n
            q2 = sum(q is Quadrant.II for q in labels) / n
        else:
            q1 = q2 = nan
        return cls(
            reliability=score.reliability,
            reliability_mean=score.reliability_mean,
            probability_reliability=score.probability_reliability,
            entropy_reliability=score.entropy_reliability,
            max_eu=_max(eu),
            mean_eu=sum(eu) / n if n else nan,
            max_au=_max(au),
            mean_au=sum(au) / n if n else nan,
            first_eu=sum(content) / len(content) if content else nan,
            quadrant_i_share=q1,
            quadrant_ii_share=q2,
            unreliable_share=q1 + q2,
            n_tokens=float(n),
        )

    @classmethod
    def from_generation(
        cls, generation: Generation, quadrants: QuadrantThresholds | None = None, first_tokens: int = DEFAULT_FIRST_TOKENS
    ) -> ResponseStats:
        return cls.from_tokens(generation.tokens, generation.top_n, quadrants, first_tokens)


def _max(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)
