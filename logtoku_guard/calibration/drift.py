"""Drift you can see: the guard's flag rates and score quantiles per day or week, against the profile.

:func:`drift_report` groups the audit store's decisions (:meth:`~logtoku_guard.audit.AuditStore.decisions`)
by model and period (a UTC day, or an ISO week) and gives, for each: the answers seen, the share
each rule flagged and the share flagged at all (any action but ``pass``), the quantiles (10%, 50%,
90%) of ``guard_score`` and ``max_eu``, and, when the model's profile says what to expect, the
expected flag rate: the share of the profile's calibration answers below the default policy's
``guard_score`` threshold (:func:`expected_flag_rate`). A period is flagged as **drift** when that
expected rate lies outside the 95% Clopper-Pearson interval of the period's observed rate: the
traffic no longer looks like the calibration answers (new kinds of questions, another model, a
broken retriever...). The statistics are read from the records as they were decided.

The decisions are read once, as a stream: per model and period only counts are kept, and with
``ranked`` (``audit stats`` passes the store's :meth:`~logtoku_guard.audit.AuditStore.ranked_decisions`)
each quantile is the k-th value of a stream the database sorts, so memory stays flat however large
the store.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from logtoku_guard.audit.records import DecisionRow
    from logtoku_guard.calibration import ModelProfile

__all__ = ["Period", "drift_report", "expected_flag_rate", "period_of"]

By = Literal["day", "week"]
QUANTILES = (0.1, 0.5, 0.9)
STATS = ("guard_score", "max_eu")
"""The statistics whose quantiles a period reports."""
Ranked = Callable[[str, str, datetime, datetime], Iterable["DecisionRow"]]
"""``ranked(stat, model, first, last)``: the decisions of ``model`` created from ``first`` to ``last``
(inclusive), ascending by ``stat`` among those where it is a number (as
:meth:`~logtoku_guard.audit.AuditStore.ranked_decisions`)."""


def period_of(when: datetime, by: By) -> str:
    """``2026-11-26`` (a UTC day) or ``2026-W48`` (its ISO week)."""
    if by == "day":
        return when.date().isoformat()
    year, week, _ = when.isocalendar()
    return f"{year}-W{week:02d}"


@dataclass(frozen=True)
class Period:
    """One model's decisions in one period; see the module docstring."""

    period: str
    model: str
    n: int
    flagged: int
    by_rule: dict[str, int]
    guard_score: tuple[float | None, ...]
    max_eu: tuple[float | None, ...]
    interval: tuple[float, float]
    expected: float | None = None
    drift: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def flag_rate(self) -> float:
        return self.flagged / self.n

    def as_json(self) -> dict[str, object]:
        return {
            "period": self.period,
            "model": self.model,
            "answers": self.n,
            "flagged": self.flagged,
            "flag_rate": self.flag_rate,
            "flag_rate_interval": list(self.interval),
            "expected_flag_rate": self.expected,
            "drift": self.drift,
            "rule_flag_rates": {rule: k / self.n for rule, k in sorted(self.by_rule.items())},
            "guard_score_quantiles": dict(zip(("q10", "q50", "q90"), self.guard_score)),
            "max_eu_quantiles": dict(zip(("q10", "q50", "q90"), self.max_eu)),
        }

    def warning(self) -> str | None:
        """The drift line, or None."""
        if not self.drift or self.expected is None:
            return None
        lo, hi = self.interval
        return (
            f"drift: {self.model}, {self.period}: {100 * self.flag_rate:.0f}% of {self.n} answers flagged "
            f"[{100 * lo:.0f}, {100 * hi:.0f}], the profile expects {100 * self.expected:.0f}%"
        )


def expected_flag_rate(profile: ModelProfile | None) -> float | None:
    """The share of the profile's calibration answers below the default policy's ``guard_score``
    threshold (None without a guard grid, or when the threshold cannot be placed on it)."""
    from logtoku_guard.decision.conditions import Compare, resolve_threshold
    from logtoku_guard.decision.policy import default_policy
    from logtoku_guard.errors import ConfigurationError

    if profile is None or profile.guard is None or not profile.has_stat("guard_score"):
        return None
    (rule,) = default_policy().rules
    if not isinstance(rule.when, Compare):
        return None
    try:
        threshold = resolve_threshold(rule.when, profile)[0]
    except ConfigurationError:
        return None
    return float(profile.percentile("guard_score", threshold))


def drift_report(
    rows: Iterable[DecisionRow],
    by: By = "week",
    expected: Callable[[str], float | None] | None = None,
    ranked: Ranked | None = None,
) -> list[Period]:
    """One :class:`Period` per model and period, oldest first; ``expected(model)``: its expected flag rate.

    ``rows`` is read once. Without ``ranked``, each group's values of :data:`STATS` are kept for their
    quantiles; with it, only how many there are, and each quantile is read off ``ranked``'s stream.
    """
    from logtoku_guard.scoring.risk import clopper_pearson

    groups: dict[tuple[str, str], _Group] = {}
    for row in rows:
        key = (period_of(row.created_at, by), row.model)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group(row, keep=ranked is None)
        group.add(row)
    out = []
    for (period, model), g in sorted(groups.items()):
        n, flagged = g.n, g.flagged
        interval = (clopper_pearson(flagged, n, 0.025, "lower"), clopper_pearson(flagged, n, 0.025, "upper"))
        want = expected(model) if expected is not None else None
        drift = want is not None and not interval[0] <= want <= interval[1]

        def member(r: DecisionRow, key: tuple[str, str] = (period, model)) -> bool:
            return (period_of(r.created_at, by), r.model) == key

        scores, eus = (g.quantiles(stat, ranked, member) for stat in STATS)
        out.append(Period(period, model, n, flagged, g.by_rule, scores, eus, interval, want, drift))
    return out


def _value(row: DecisionRow, stat: str) -> float | None:
    """``stat``'s value in ``row`` when it is a finite number, else None."""
    v = row.stats.get(stat)
    if isinstance(v, int):  # compared exactly: PostgreSQL's JSONB keeps 1e400 as an integer past float's range
        return v if abs(v) <= sys.float_info.max else None
    return v if isinstance(v, float) and math.isfinite(v) else None


class _Group:
    """One model's decisions in one period as they stream past: counts, time span and (``keep``) values."""

    def __init__(self, row: DecisionRow, *, keep: bool) -> None:
        self.model = row.model
        self.n = self.flagged = 0
        self.by_rule: dict[str, int] = {}
        self.first = self.last = row.created_at
        self.counts = dict.fromkeys(STATS, 0)
        self.values: dict[str, list[float]] | None = {stat: [] for stat in STATS} if keep else None

    def add(self, row: DecisionRow) -> None:
        self.n += 1
        if row.action != "pass":
            self.flagged += 1
            if row.rule is not None:
                self.by_rule[row.rule] = self.by_rule.get(row.rule, 0) + 1
        self.first, self.last = min(self.first, row.created_at), max(self.last, row.created_at)
        for stat in STATS:
            if (v := _value(row, stat)) is not None:
                self.counts[stat] += 1
                if self.values is not None:
                    self.values[stat].append(v)

    def quantiles(self, stat: str, ranked: Ranked | None, member: Callable[[DecisionRow], bool]) -> tuple[float | None, ...]:
        """The :data:`QUANTILES` of the group's values of ``stat``: of the kept values, else the k-th values of
        ``ranked``'s stream (the rows ``member`` says are the group's). A stream that is not the counted values
        in ascending order (a row edited by hand that the database reads otherwise) is sorted here instead."""
        if self.values is not None or ranked is None:
            return _pick(sorted(self.values[stat] if self.values is not None else []))
        count = self.counts[stat]
        if count == 0:
            return (None,) * len(QUANTILES)

        def stream() -> Iterator[float]:
            for r in ranked(stat, self.model, self.first, self.last):
                if member(r) and (v := _value(r, stat)) is not None:
                    yield v

        want = {_rank(q, count) for q in QUANTILES}
        picked: dict[int, float] = {}
        seen, previous = 0, -math.inf
        for v in stream():
            if v < previous:
                return _pick(sorted(stream()))
            if seen in want:
                picked[seen] = v
            seen, previous = seen + 1, v
        if seen != count:
            return _pick(sorted(stream()))
        return tuple(picked[_rank(q, count)] for q in QUANTILES)


def _rank(q: float, count: int) -> int:
    """The position of the ``q`` quantile among ``count`` sorted values."""
    return min(count - 1, int(q * count))


def _pick(values: list[float]) -> tuple[float | None, ...]:
    if not values:
        return (None,) * len(QUANTILES)
    return tuple(values[_rank(q, len(values))] for q in QUANTILES)
