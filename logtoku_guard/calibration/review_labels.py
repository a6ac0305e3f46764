"""Labels from reviewers: the audit store's human verdicts refit the guard on the user's own answers.

Each decided review item is a labelled answer: **approved** as written means the answer was
right; **rejected**, or approved only after the reviewer **edited** it, means it was wrong. The
statistics the guard reads are those its audit record kept (the answer the reviewer saw, exactly:
nothing is generated again), so a refit needs no model.

:func:`refit_on_reviews` fits a new guard on those labels (5-fold cross-validated) and compares
it with the current one on the same answers, both out of sample: the current guard never saw
them, the new one is scored out of fold. The new guard replaces the current one only if it ranks
right above wrong answers at least as well (AUROC); :class:`Refit` also holds, for each, the share
of right and of wrong answers the default policy's threshold would flag, before and after.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    from logtoku_guard.audit.queue import ReviewQueue
    from logtoku_guard.scoring.guard_score import GuardModel

__all__ = ["DEFAULT_MIN_LABELS", "Refit", "ReviewLabel", "StoredStats", "refit_on_reviews", "reviewer_labels"]

DEFAULT_MIN_LABELS = 30
"""Fewest reviewer labels a refit accepts (and at least 5 right and 5 wrong among them)."""
MIN_PER_CLASS = 5


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
    """The decided review items of answers by ``model`` (decided at or after ``since``) as labels."""
    out = []
    for item in queue.decided(since=since):
        if item.record.model != model:
            continue
        correct = item.status == "approved" and item.edited_answer is None
        out.append(ReviewLabel(item.id, item.trace_id, StoredStats(dict(item.record.stats)), correct, item.decided_at))
    return out


@dataclass(frozen=True)
class Refit:
    """A guard refit on reviewer labels against the current guard, on the same labelled answers.

    ``before_auroc``: the current guard's AUROC on them (None without a current guard);
    ``after_auroc``: the new guard's out-of-fold AUROC. ``before_flags`` / ``after_flags``: the
    share of right (``correct``) and wrong (``incorrect``) answers each flags at its default-policy
    threshold (empty when that threshold cannot be placed). ``replace``: whether the new guard is
    at least as good, and so replaces the current one.
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

    def lines(self) -> list[str]:
        """What the refit found, one line each: the data, before and after, the verdict."""

        def flags(rates: dict[str, float]) -> str:
            return ", ".join(f"{g} {100 * r:.0f}% flagged" for g, r in sorted(rates.items())) or "threshold not placed"

        before = "no current guard" if self.before_auroc is None else f"AUROC {self.before_auroc:.3f}; {flags(self.before_flags)}"
        verdict = "the refit replaces the current guard" if self.replace else "the current guard is kept (the refit is worse)"
        return [
            f"reviewer labels: {self.n_correct} approved as written (right), {self.n_wrong} rejected or edited (wrong)",
            f"before (current guard on these answers): {before}",
            f"after (refit, out of fold): AUROC {self.after_auroc:.3f}; {flags(self.after_flags)}",
            verdict,
        ]


def refit_on_reviews(current: GuardModel | None, labels: Sequence[ReviewLabel], *, min_labels: int = DEFAULT_MIN_LABELS) -> Refit:
    """Fit a guard on reviewer ``labels`` and compare it with ``current`` (see the module docstring)."""
    from logtoku_guard.scoring.guard_score import FEATURES, auroc, feature_matrix, fit_guard

    n_correct = sum(1 for lab in labels if lab.correct)
    n_wrong = len(labels) - n_correct
    if len(labels) < min_labels or min(n_correct, n_wrong) < MIN_PER_CLASS:
        msg = (
            f"a refit needs at least {min_labels} reviewer labels with {MIN_PER_CLASS} right and {MIN_PER_CLASS} wrong "
            f"among them; the store has {n_correct} approved as written and {n_wrong} rejected or edited for this model"
        )
        raise ConfigurationError(msg)
    rows = [lab.stats for lab in labels]
    y = [lab.correct for lab in labels]
    features = current.features if current is not None else list(FEATURES)
    new = fit_guard(rows, y, ["reviewer labels"], features=features)
    after = new.cv_auroc if new.cv_auroc is not None else math.nan
    before_auroc = None
    before_flags: dict[str, float] = {}
    if current is not None:
        scores = [current.predict(x.tolist()) for x in feature_matrix(rows, current.features)]
        before_auroc = auroc(scores, y)
        t = _default_threshold(current)
        if t is not None:
            before_flags = _flag_rates(scores, y, t)
    t_new = _default_threshold(new)
    after_flags = new.expected_flag_rates(t_new) if t_new is not None else {}
    replace = before_auroc is None or after >= before_auroc
    return Refit(new, current, n_correct, n_wrong, before_auroc, after, before_flags, after_flags, replace)


def _default_threshold(guard: GuardModel) -> float | None:
    """Where the default policy's stated risk puts ``guard``'s threshold (None: its labels cannot support it)."""
    from logtoku_guard.decision.conditions import Risk, risk_threshold_for
    from logtoku_guard.decision.policy import DEFAULT_CONFIDENCE, DEFAULT_COVERAGE

    chosen = risk_threshold_for(Risk(coverage=DEFAULT_COVERAGE, confidence=DEFAULT_CONFIDENCE), guard)
    return chosen.threshold if chosen is not None and chosen.met else None


def _flag_rates(scores: Sequence[float], labels: Sequence[bool], threshold: float) -> dict[str, float]:
    out = {}
    for name, want in (("correct", True), ("incorrect", False)):
        group = [s for s, y in zip(scores, labels) if y is want]
        out[name] = sum(1 for s in group if not s >= threshold) / len(group)
    return out
