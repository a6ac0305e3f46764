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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from logtoku_guard.audit.records import DecisionRow
    from logtoku_guard.calibration import ModelProfile

__all__ = ["Period", "drift_report", "expected_flag_rate", "period_of"]

By = Literal["day", "week"]
QUANTILES = (0.1, 0.5, 0.9)


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
    rows: Sequence[DecisionRow], by: By = "week", expected: Callable[[str], float | None] | None = None
) -> list[Period]:
    """One :class:`Period` per model and period, oldest first; ``expected(model)``: its expected flag rate."""
    from logtoku_guard.scoring.risk import clopper_pearson

    groups: dict[tuple[str, str], list[DecisionRow]] = {}
    for row in rows:
        groups.setdefault((period_of(row.created_at, by), row.model), []).append(row)
    out = []
    for (period, model), part in sorted(groups.items()):
        n = len(part)
        flagged = sum(1 for r in part if r.action != "pass")
        by_rule: dict[str, int] = {}
        for r in part:
            if r.rule is not None and r.action != "pass":
                by_rule[r.rule] = by_rule.get(r.rule, 0) + 1
        interval = (clopper_pearson(flagged, n, 0.025, "lower"), clopper_pearson(flagged, n, 0.025, "upper"))
        want = expected(model) if expected is not None else None
        drift = want is not None and not interval[0] <= want <= interval[1]
        scores, eus = _quantiles(part, "guard_score"), _quantiles(part, "max_eu")
        out.append(Period(period, model, n, flagged, by_rule, scores, eus, interval, want, drift))
    return out


def _quantiles(rows: Sequence[DecisionRow], stat: str) -> tuple[float | None, ...]:
    values = sorted(v for r in rows if isinstance(v := r.stats.get(stat), (int, float)) and math.isfinite(v))
    if not values:
        return (None,) * len(QUANTILES)
    return tuple(values[min(len(values) - 1, int(q * len(values)))] for q in QUANTILES)
