"""What a refit on reviewers' verdicts checks before it may replace the guard
(:func:`~logtoku_guard.calibration.review_labels.refit_on_reviews`).

* :func:`compare_auroc`: the AUROC of the refit against the current guard's on the same labelled
  answers (or against chance), with DeLong's one-sided lower bound of the difference (DeLong,
  DeLong and Clarke-Pearson 1988, paired: both guards score the same answers; placement values
  from mid-ranks, O(n log n)); a replacement needs that bound above 0, so a tie never replaces.
* :func:`upper_auroc`: the current guard's AUROC and its one-sided upper bound: under 0.5, the
  verdicts invert it.
* :func:`find_contradictions`: answers the guard cannot tell apart (identical statistics) judged
  both ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["CONFIDENCE", "AurocComparison", "Contradictions", "compare_auroc", "find_contradictions", "upper_auroc"]

CONFIDENCE = 0.95
"""Confidence of the one-sided bounds that decide a replacement (and an inversion)."""


def _midranks(x: np.ndarray) -> np.ndarray:
    import numpy as np

    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inverse.ravel()]


def _placements(scores: np.ndarray, correct: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """AUROC and DeLong's placement values: for each right answer the share of wrong ones scored
    below it, for each wrong answer the share of right ones scored above it (ties: one half)."""
    import numpy as np

    s = np.where(np.isnan(scores), -np.inf, scores)  # undefined ranks lowest, as auroc() does
    pos, neg = s[correct], s[~correct]
    m, n = pos.size, neg.size
    both = _midranks(np.concatenate([pos, neg]))
    v10 = (both[:m] - _midranks(pos)) / n
    v01 = 1.0 - (both[m:] - _midranks(neg)) / m
    return float(v10.mean()), v10, v01


@dataclass(frozen=True)
class AurocComparison:
    """The AUROC of ``after`` minus that of ``before`` on the same labelled answers (or of ``after``
    minus 0.5, chance, without ``before``), with the one-sided lower bound of that difference at
    :data:`CONFIDENCE` (DeLong et al. 1988, paired when both score the same answers)."""

    before: float | None
    after: float
    difference: float
    lower: float
    se: float
    n: int

    @property
    def significant(self) -> bool:
        """True when the lower bound is above 0: ``after`` is strictly better by a margin the labels support."""
        return self.lower > 0.0

    def describe(self) -> str:
        against = "the current guard" if self.before is not None else "chance (0.5)"
        return (
            f"refit minus {against}: AUROC {self.difference:+.3f}, one-sided {100 * CONFIDENCE:.0f}% lower bound "
            f"{self.lower:+.3f} (DeLong's {'paired ' if self.before is not None else ''}test on {self.n} answers)"
        )


def _z() -> float:
    return NormalDist().inv_cdf(CONFIDENCE)


def compare_auroc(after: np.ndarray, correct: np.ndarray, before: np.ndarray | None = None) -> AurocComparison:
    """:class:`AurocComparison` of two guards' scores of the same answers (``before`` None: against chance)."""
    import numpy as np

    y = np.asarray(correct, dtype=bool)
    a_auc, a10, a01 = _placements(np.asarray(after, dtype=np.float64), y)
    m, n = a10.size, a01.size
    if before is None:
        b_auc, d10, d01 = None, a10, a01
        diff = a_auc - 0.5
    else:
        b_auc, b10, b01 = _placements(np.asarray(before, dtype=np.float64), y)
        d10, d01 = a10 - b10, a01 - b01
        diff = a_auc - b_auc
    var = float(np.var(d10, ddof=1)) / m + float(np.var(d01, ddof=1)) / n
    se = math.sqrt(max(var, 0.0))
    return AurocComparison(b_auc, a_auc, diff, diff - _z() * se, se, m + n)


def upper_auroc(scores: np.ndarray, correct: np.ndarray) -> tuple[float, float]:
    """AUROC and its one-sided upper bound at :data:`CONFIDENCE` (DeLong)."""
    import numpy as np

    auc, v10, v01 = _placements(scores, correct)
    se = math.sqrt(float(np.var(v10, ddof=1)) / v10.size + float(np.var(v01, ddof=1)) / v01.size)
    return auc, auc + _z() * se


@dataclass(frozen=True)
class Contradictions:
    """Answers the guard cannot tell apart (identical statistics) that reviewers judged both ways.

    ``groups``: sets of identical answers with both verdicts; ``answers``: how many answers they
    hold, ``approved`` / ``rejected`` of them; ``examples``: a few of their review item ids."""

    groups: int
    answers: int
    approved: int
    rejected: int
    examples: tuple[int, ...]

    def describe(self) -> str:
        ids = ", ".join(str(i) for i in self.examples)
        return (
            f"warning: contradictory verdicts: {self.groups} set(s) of answers with identical statistics (the guard "
            f"cannot tell them apart) got both verdicts: {self.answers} answers, {self.approved} approved as written "
            f"and {self.rejected} rejected or edited (review items {ids}, ...); check those verdicts"
        )


def find_contradictions(x: np.ndarray, correct: np.ndarray, review_ids: np.ndarray) -> Contradictions | None:
    """:class:`Contradictions` among the rows of ``x`` (the guard's features), None when there are none."""
    import numpy as np

    if x.shape[0] == 0:
        return None
    keyed = np.where(np.isnan(x), np.inf, x)  # undefined equals undefined here (NaN != NaN)
    _, group = np.unique(keyed, axis=0, return_inverse=True)
    group = group.ravel()
    n_groups = int(group.max()) + 1
    right = np.bincount(group, weights=correct.astype(np.float64), minlength=n_groups)
    total = np.bincount(group, minlength=n_groups)
    mixed = (right > 0) & (right < total)
    if not mixed.any():
        return None
    rows = mixed[group]
    examples = tuple(int(i) for i in review_ids[rows][:5])
    approved = int(correct[rows].sum())
    return Contradictions(int(mixed.sum()), int(rows.sum()), approved, int(rows.sum()) - approved, examples)
