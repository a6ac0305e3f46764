"""Labels from reviewers: the audit store's human verdicts refit the guard on the user's own answers.

Each decided review item is a labelled answer: **approved** as written means the answer was
right; **rejected**, or approved only after the reviewer **edited** it, means it was wrong. The
statistics the guard reads are those its audit record kept (the answer the reviewer saw, exactly:
nothing is generated again), so a refit needs no model.

:func:`read_label_matrix` streams the verdicts out of the store (a batch of rows at a time, only
the statistics the guard reads: memory stays flat however large the store, see
``benchmarks/bench_refit_memory.py``); a row that cannot be read is reported and left out.

:func:`refit_on_reviews` fits a new guard on those labels (5-fold cross-validated) and compares
it with the current one on the same answers, both out of sample: the current guard never saw
them, the new one is scored out of fold. Verdicts can be wrong, so nothing is replaced on faith:

* the new guard replaces the current one only if it ranks right above wrong answers **strictly
  better**, by a margin these labels support: the one-sided 95% lower bound of the AUROC
  difference (DeLong's paired test, the same answers under both guards) must be above 0, so a tie
  or a difference within noise keeps the current guard. Without a current guard, the refit must
  beat chance (AUROC 0.5) by the same rule;
* a constant or degenerate refit (every answer the same score: the statistics do not separate the
  verdicts) is refused, whatever the comparison says;
* answers the guard cannot tell apart (identical statistics) that got both verdicts are reported
  (:class:`Contradictions`), and verdicts that **invert** the current guard (it ranks the approved
  answers significantly below the rejected ones: the 95% upper bound of its AUROC under 0.5) are
  reported and block the replacement unless ``allow_inverted`` (``--allow-inverted``): approve
  may have been used for "the answer is wrong".

:class:`Refit` holds the numbers and says what it found, one line each (:meth:`Refit.lines`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from logtoku_guard.calibration.review_checks import (
    CONFIDENCE,
    AurocComparison,
    Contradictions,
    compare_auroc,
    find_contradictions,
    upper_auroc,
)
from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    import numpy as np

    from logtoku_guard.audit.queue import ReviewQueue
    from logtoku_guard.audit.records import SkippedRow
    from logtoku_guard.scoring.guard_score import GuardModel

__all__ = [
    "DEFAULT_MIN_LABELS",
    "AurocComparison",
    "Contradictions",
    "LabelMatrix",
    "Refit",
    "ReviewLabel",
    "StoredStats",
    "compare_auroc",
    "read_label_matrix",
    "refit_on_reviews",
    "reviewer_labels",
]

DEFAULT_MIN_LABELS = 30
"""Fewest reviewer labels a refit accepts (and at least 5 right and 5 wrong among them)."""
MIN_PER_CLASS = 5
_SPREAD = 1e-9
"""Scores closer together than this are one score: a refit whose scores all are is constant."""


@dataclass(frozen=True)
class StoredStats:
    """An answer's statistics as its audit record kept them (None or a non-number: undefined, NaN)."""

    values: Mapping[str, object]

    def get(self, name: str) -> float:
        v = self.values.get(name)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan

    @property
    def reliability(self) -> float:
        return self.get("reliability")

    @property
    def n_tokens(self) -> float:
        return self.get("n_tokens")


@dataclass(frozen=True)
class ReviewLabel:
    """One reviewer verdict as a label: ``correct`` (approved as written) or not (rejected, or edited)."""

    review_id: int
    trace_id: str
    stats: StoredStats
    correct: bool
    decided_at: datetime | None


def reviewer_labels(queue: ReviewQueue, model: str, *, since: datetime | None = None) -> list[ReviewLabel]:
    """The decided review items of answers by ``model`` (decided at or after ``since``) as labels
    (one object each, every statistic kept: for small stores and inspection; a refit reads
    :func:`read_label_matrix`). Unreadable rows are left out (logged)."""
    return [
        ReviewLabel(v.review_id, v.trace_id, StoredStats(v.stats), v.correct, v.decided_at)
        for v in queue.verdicts(model=model, since=since)
    ]


class _LabelRow:
    """One row of a :class:`LabelMatrix` as the :class:`~logtoku_guard.scoring.guard_score.StatsLike` a fit reads."""

    __slots__ = ("_i", "_m")

    def __init__(self, matrix: LabelMatrix, i: int) -> None:
        self._m, self._i = matrix, i

    def get(self, name: str) -> float:
        j = self._m.column_index.get(name)
        return math.nan if j is None else float(self._m.values[self._i, j])

    @property
    def reliability(self) -> float:
        return self.get("reliability")

    @property
    def n_tokens(self) -> float:
        return self.get("n_tokens")


@dataclass(frozen=True)
class LabelMatrix:
    """Reviewer labels as arrays, nothing more than a refit reads.

    ``values``: ``(n, len(columns))`` raw statistics (NaN: undefined); ``correct``: the labels;
    ``review_ids``: each row's review item; ``skipped``: the store's rows that could not be read.
    """

    columns: tuple[str, ...]
    values: np.ndarray
    correct: np.ndarray
    review_ids: np.ndarray
    skipped: tuple[SkippedRow, ...] = ()
    column_index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "column_index", {c: j for j, c in enumerate(self.columns)})

    def __len__(self) -> int:
        return int(self.correct.size)

    def rows(self) -> list[_LabelRow]:
        """One light view per row (what :func:`~logtoku_guard.scoring.guard_score.fit_guard` reads)."""
        return [_LabelRow(self, i) for i in range(len(self))]

    def features(self, names: Sequence[str]) -> np.ndarray:
        """``(n, len(names))`` feature values as the guard reads them (``n_tokens`` as ``log(1 + n)``)."""
        import numpy as np

        out = np.full((len(self), len(names)), np.nan)
        for j, name in enumerate(names):
            k = self.column_index.get(name)
            if k is not None:
                out[:, j] = np.log1p(self.values[:, k]) if name == "n_tokens" else self.values[:, k]
        return out

    @classmethod
    def from_labels(cls, labels: Sequence[ReviewLabel], columns: Sequence[str]) -> LabelMatrix:
        import numpy as np

        cols = _columns(columns)
        values = np.array([[lab.stats.get(c) for c in cols] for lab in labels], dtype=np.float64).reshape(len(labels), len(cols))
        return cls(
            cols,
            values,
            np.array([lab.correct for lab in labels], dtype=bool),
            np.array([lab.review_id for lab in labels], dtype=np.int64),
        )


def _columns(features: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*features, "reliability", "n_tokens"]))  # the length fit reads these two


def _number(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def read_label_matrix(
    queue: ReviewQueue,
    model: str,
    *,
    features: Sequence[str] | None = None,
    since: datetime | None = None,
    batch_size: int = 1000,
) -> LabelMatrix:
    """The verdicts on answers by ``model`` (decided at or after ``since``) as a :class:`LabelMatrix`
    of ``features`` (default: the guard's), streamed from the store ``batch_size`` rows at a time."""
    import numpy as np

    from logtoku_guard.scoring.guard_score import FEATURES

    cols = _columns(features if features is not None else FEATURES)
    skipped: list[SkippedRow] = []
    chunks: list[np.ndarray] = []
    batch: list[list[float]] = []
    correct = array("b")
    ids = array("q")
    for v in queue.verdicts(model=model, since=since, skipped=skipped, batch_size=batch_size):
        stats = v.stats
        batch.append([_number(stats.get(c)) for c in cols])
        correct.append(v.correct)
        ids.append(v.review_id)
        if len(batch) >= batch_size:
            chunks.append(np.array(batch, dtype=np.float64))
            batch = []
    if batch or not chunks:
        chunks.append(np.array(batch, dtype=np.float64).reshape(len(batch), len(cols)))
    values = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    return LabelMatrix(
        cols,
        values,
        np.frombuffer(correct, dtype=np.int8).astype(bool),
        np.frombuffer(ids, dtype=np.int64).copy(),
        tuple(skipped),
    )


def guard_scores(guard: GuardModel, labels: LabelMatrix) -> np.ndarray:
    """``guard``'s score of every row of ``labels`` (vectorised :meth:`GuardModel.predict`: NaN = the mean)."""
    import numpy as np

    x = labels.features(guard.features)
    means, stds, coef = (np.asarray(v, dtype=np.float64) for v in (guard.means, guard.stds, guard.coef))
    terms = np.where(np.isfinite(x), coef * (x - means) / stds, 0.0)
    z = guard.intercept + terms.sum(axis=1)
    return np.where(z > -700, 1.0 / (1.0 + np.exp(-np.clip(z, -700, 700))), 0.0)


# -- the refit ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refit:
    """A guard refit on reviewer labels against the current guard, on the same labelled answers.

    ``before_auroc``: the current guard's AUROC on them (None without a current guard);
    ``after_auroc``: the new guard's out-of-fold AUROC. ``before_flags`` / ``after_flags``: the
    share of right (``correct``) and wrong (``incorrect``) answers each flags at its default-policy
    threshold (empty when that threshold cannot be placed). ``comparison``: the AUROC difference
    and its lower bound (None for a refused refit). ``refused``: why the refit cannot be used at
    all (constant or degenerate), else None. ``contradictions``: identical answers judged both
    ways (None: none). ``inverted``: the verdicts rank the current guard backwards (significantly).
    ``replace``: whether the new guard replaces the current one.
    """

    guard: GuardModel
    current: GuardModel | None
    n_correct: int
    n_wrong: int
    before_auroc: float | None
    after_auroc: float
    before_flags: dict[str, float]
    after_flags: dict[str, float]
    replace: bool
    comparison: AurocComparison | None = None
    refused: str | None = None
    contradictions: Contradictions | None = None
    inverted: str | None = None
    allow_inverted: bool = False

    def warnings(self) -> list[str]:
        """What the labels themselves look like, reported before any verdict on the refit."""
        out = []
        if self.contradictions is not None:
            out.append(self.contradictions.describe())
        if self.inverted is not None:
            out.append(self.inverted)
        return out

    def lines(self) -> list[str]:
        """What the refit found, one line each: the warnings, the data, before and after, the comparison, the verdict."""

        def flags(rates: dict[str, float]) -> str:
            return ", ".join(f"{g} {100 * r:.0f}% flagged" for g, r in sorted(rates.items())) or "threshold not placed"

        before = "no current guard" if self.before_auroc is None else f"AUROC {self.before_auroc:.3f}; {flags(self.before_flags)}"
        out = [
            *self.warnings(),
            f"reviewer labels: {self.n_correct} approved as written (right), {self.n_wrong} rejected or edited (wrong)",
            f"before (current guard on these answers): {before}",
            f"after (refit, out of fold): AUROC {self.after_auroc:.3f}; {flags(self.after_flags)}",
        ]
        if self.comparison is not None:
            out.append(self.comparison.describe())
        out.append(self.verdict())
        return out

    def verdict(self) -> str:
        """The one line that says whether the refit replaces the current guard, and why."""
        kept = "the current guard is kept" if self.current is not None else "no guard is made (there is no current one)"
        if self.refused is not None:
            return f"the refit is refused: {self.refused}; {kept}"
        if self.replace:
            why = "strictly better out of fold" if self.current is not None else "better than chance"
            extra = " although the verdicts invert the current guard (allowed)" if self.inverted else ""
            return f"the refit replaces the current guard ({why}, by a margin these labels support){extra}"
        if self.inverted is not None and self.comparison is not None and self.comparison.significant:
            return (
                f"{kept}: the verdicts invert it (see above); pass allow_inverted=True (CLI: --allow-inverted) "
                "to use the refit anyway"
            )
        c = self.comparison
        if c is not None and c.difference <= 0:
            how = "worse" if c.difference < 0 else "no better (a tie)"
            return f"{kept} (the refit is {how})"
        return f"{kept}: the refit is not better by a margin these {self.n_correct + self.n_wrong} labels support"


def refit_on_reviews(
    current: GuardModel | None,
    labels: LabelMatrix | Sequence[ReviewLabel],
    *,
    min_labels: int = DEFAULT_MIN_LABELS,
    allow_inverted: bool = False,
) -> Refit:
    """Fit a guard on reviewer ``labels`` and compare it with ``current`` (see the module docstring)."""
    from logtoku_guard.scoring.guard_score import FEATURES, fit_guard

    features = list(current.features) if current is not None else list(FEATURES)
    matrix = labels if isinstance(labels, LabelMatrix) else LabelMatrix.from_labels(labels, features)
    y = matrix.correct
    n_correct = int(y.sum())
    n_wrong = len(matrix) - n_correct
    if len(matrix) < min_labels or min(n_correct, n_wrong) < MIN_PER_CLASS:
        msg = (
            f"a refit needs at least {min_labels} reviewer labels with {MIN_PER_CLASS} right and {MIN_PER_CLASS} wrong "
            f"among them; the store has {n_correct} approved as written and {n_wrong} rejected or edited for this model"
        )
        raise ConfigurationError(msg)
    x = matrix.features(features)
    contradictions = find_contradictions(x, y, matrix.review_ids)
    new = fit_guard(matrix.rows(), y.tolist(), ["reviewer labels"], features=features)
    oof = _out_of_fold(new, y)
    after = new.cv_auroc if new.cv_auroc is not None else math.nan
    before_auroc = None
    before_flags: dict[str, float] = {}
    before_scores = None
    inverted = None
    if current is not None:
        before_scores = guard_scores(current, matrix)
        before_auroc, upper = upper_auroc(before_scores, y)
        if upper < 0.5:
            inverted = (
                f"warning: the verdicts invert the current guard: it scores the answers reviewers rejected above "
                f"those they approved (AUROC {before_auroc:.3f}, one-sided {100 * CONFIDENCE:.0f}% upper bound "
                f"{upper:.3f} < 0.5); check that approve was used for right answers and reject for wrong ones"
            )
        t = _default_threshold(current)
        if t is not None:
            before_flags = _flag_rates(before_scores, y, t)
    t_new = _default_threshold(new)
    after_flags = new.expected_flag_rates(t_new) if t_new is not None else {}
    refused = _degenerate(x, new, matrix)
    comparison = None if refused is not None else compare_auroc(oof, y, before_scores)
    replace = comparison is not None and comparison.significant and (inverted is None or allow_inverted)
    return Refit(
        new,
        current,
        n_correct,
        n_wrong,
        before_auroc,
        after,
        before_flags,
        after_flags,
        replace,
        comparison,
        refused,
        contradictions,
        inverted,
        allow_inverted,
    )


def _out_of_fold(guard: GuardModel, correct: np.ndarray) -> np.ndarray:
    """The refit's out-of-fold scores in row order (:func:`~logtoku_guard.scoring.guard_score.fit_guard`
    keeps them by label, ``correct`` and ``incorrect``, each in row order)."""
    import numpy as np

    scores = np.empty(correct.size)
    scores[correct] = guard.reference_scores.get("correct", [])
    scores[~correct] = guard.reference_scores.get("incorrect", [])
    return scores


def _degenerate(x: np.ndarray, new: GuardModel, matrix: LabelMatrix) -> str | None:
    """Why the refit cannot be used at all (None: it can): every answer looks the same to it, or it
    gives every answer the same score (it would flag all or none, whatever the answer)."""
    import numpy as np

    keyed = np.where(np.isnan(x), np.inf, x)
    distinct = np.unique(keyed, axis=0).shape[0]
    if distinct < 2:
        return (
            f"all {len(matrix)} labelled answers have identical statistics, so no guard can separate the approved "
            "from the rejected: the fit is constant"
        )
    scores = guard_scores(new, matrix)
    finite = scores[np.isfinite(scores)]
    if finite.size == 0 or float(np.ptp(finite)) <= _SPREAD:
        score = float(finite[0]) if finite.size else math.nan
        return f"it gives every one of the {len(matrix)} labelled answers the same score ({score:.4f}): it is constant"
    oof = np.array([v for vs in new.reference_scores.values() for v in vs])
    if oof.size and float(np.ptp(oof)) <= _SPREAD:
        return "its out-of-fold scores are all the same: it is constant"
    return None


def _default_threshold(guard: GuardModel) -> float | None:
    """Where the default policy's stated risk puts ``guard``'s threshold (None: its labels cannot support it)."""
    from logtoku_guard.decision.conditions import Risk, risk_threshold_for
    from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE

    chosen = risk_threshold_for(Risk(coverage=DEFAULT_COVERAGE, confidence=DEFAULT_CONFIDENCE), guard)
    return chosen.threshold if chosen is not None and chosen.met else None


def _flag_rates(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float]:
    out = {}
    for name, want in (("correct", True), ("incorrect", False)):
        group = scores[labels == want]
        out[name] = float((~(group >= threshold)).sum()) / group.size
    return out
