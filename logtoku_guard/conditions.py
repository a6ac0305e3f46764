"""The conditions of a policy rule: comparisons of a response statistic with a threshold, and
their ``all`` / ``any`` / ``not`` combinations, with how they are checked against a model
profile and evaluated on one answer's statistics (recording a :class:`Check` per comparison).

Thresholds are absolute numbers or ``{quantile: q}`` of the model's profile; a comparison may
name a ``fallback`` statistic (with its own ``fallback_value``) used when its own is
unavailable. Undefined statistics (NaN) count as the least reliable value unless the policy
says ``undefined: never_fires`` (see :mod:`logtoku_guard.policy`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from logtoku_guard.errors import ConfigurationError
from logtoku_guard.stats import HIGHER_IS_RELIABLE, MONOTONE_INCREASING, ResponseStats, StatName

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile

__all__ = [
    "AllOf",
    "AnyOf",
    "Check",
    "Compare",
    "Condition",
    "NotOf",
    "Op",
    "Quantile",
    "StrictModel",
    "check_quantiles",
    "collect_stats",
    "describe_checks",
    "evaluate",
    "has_quantile",
    "is_monotone",
]

Op = Literal[">", ">=", "<", "<="]
_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


class StrictModel(BaseModel):
    """Frozen, no unknown fields, aliases accepted: the base of every policy model."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Quantile(StrictModel):
    """A threshold placed at quantile ``quantile`` of the model profile's distribution of the stat."""

    quantile: float = Field(ge=0.0, le=1.0)


class Compare(StrictModel):
    """``stat op value``. ``fallback``: the statistic compared instead when ``stat`` is
    unavailable (its profile grid is missing or all NaN for a quantile threshold, its value NaN
    for a fixed one), e.g. ``guard_score`` falling back to ``reliability`` with a profile that
    holds no fitted guard; the recorded check names the statistic actually used."""

    stat: StatName
    op: Op
    value: Union[float, Quantile]  # noqa: UP007 - pydantic union
    fallback: Optional[StatName] = None  # noqa: UP045 - pydantic field on 3.10
    fallback_value: Optional[Union[float, Quantile]] = None  # noqa: UP007, UP045 - pydantic field on 3.10
    """The threshold of ``fallback`` when it differs from ``value`` (e.g. an absolute ``guard_score``
    probability falling back to a quantile of ``reliability``); default: ``value``."""

    @field_validator("value", "fallback_value")
    @classmethod
    def _finite(cls, v: float | Quantile | None) -> float | Quantile | None:
        if isinstance(v, float) and not math.isfinite(v):
            msg = f"threshold must be finite, got {v!r}"
            raise ValueError(msg)
        return v

    @model_validator(mode="after")
    def _fallback_value_needs_a_fallback(self) -> Compare:
        if self.fallback_value is not None and self.fallback is None:
            msg = f"fallback_value {self.fallback_value!r} is given without a fallback statistic; add fallback: <stat>"
            raise ValueError(msg)
        return self

    def threshold_of(self, stat: str) -> float | Quantile:
        """The threshold compared with ``stat`` (``value``, or ``fallback_value`` for the fallback)."""
        if stat != self.stat and self.fallback_value is not None:
            return self.fallback_value
        return self.value


class AllOf(StrictModel):
    all: list[Condition] = Field(min_length=1)


class AnyOf(StrictModel):
    any: list[Condition] = Field(min_length=1)


class NotOf(StrictModel):
    not_: Condition = Field(alias="not")


def _condition_kind(v: Any) -> str:
    if isinstance(v, BaseModel):
        return type(v).__name__
    if isinstance(v, Mapping):
        for key, tag in (("stat", "Compare"), ("all", "AllOf"), ("any", "AnyOf"), ("not", "NotOf")):
            if key in v:
                return tag
    return "Compare"  # reports the missing fields of a comparison


Condition = Annotated[
    Union[  # noqa: UP007
        Annotated[Compare, Tag("Compare")],
        Annotated[AllOf, Tag("AllOf")],
        Annotated[AnyOf, Tag("AnyOf")],
        Annotated[NotOf, Tag("NotOf")],
    ],
    Discriminator(_condition_kind),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()
NotOf.model_rebuild()


def is_monotone(c: Any) -> bool:
    if isinstance(c, Compare):
        return c.stat in MONOTONE_INCREASING and c.op in (">", ">=")
    if isinstance(c, AllOf):
        return all(is_monotone(x) for x in c.all)
    if isinstance(c, AnyOf):
        return all(is_monotone(x) for x in c.any)
    return False


@dataclass(frozen=True)
class Check:
    """One comparison a rule made: ``observed op threshold``.

    ``observed`` is None when the statistic is undefined (NaN); ``undefined`` then says why
    (``"empty answer"``, ``"NaN token scores"``, ...) and ``passed`` follows the policy's
    ``undefined`` setting (by default the value counts as the least reliable one).
    """

    stat: str
    op: str
    threshold: float
    observed: float | None
    passed: bool
    quantile: float | None = None
    undefined: str | None = None

    def describe(self) -> str:
        where = f" (q{self.quantile:g} of the profile)" if self.quantile is not None else ""
        if self.undefined is not None or self.observed is None:
            return f"{self.stat} {self.op} {self.threshold:.4g}{where}: undefined: {self.undefined}"
        return f"{self.stat} {self.observed:.4g} {self.op} {self.threshold:.4g}{where}"


def collect_stats(c: Any, found: set[str]) -> None:
    if isinstance(c, Compare):
        found.add(c.stat)
        if c.fallback is not None:
            found.add(c.fallback)
    elif isinstance(c, (AllOf, AnyOf)):
        for x in c.all if isinstance(c, AllOf) else c.any:
            collect_stats(x, found)
    else:
        collect_stats(c.not_, found)


def check_quantiles(c: Any, profile: ModelProfile | None) -> None:
    if isinstance(c, Compare):
        usable = c.fallback is None or not isinstance(c.value, Quantile) or (profile is not None and profile.has_stat(c.stat))
        _threshold(c, profile, c.stat if usable else c.fallback)
        if c.fallback is not None and isinstance(c.fallback_value, Quantile):  # the fallback may be needed per answer
            _threshold(c, profile, c.fallback)
    elif isinstance(c, (AllOf, AnyOf)):
        for x in c.all if isinstance(c, AllOf) else c.any:
            check_quantiles(x, profile)
    else:
        check_quantiles(c.not_, profile)


def has_quantile(c: Any) -> bool:
    if isinstance(c, Compare):
        return isinstance(c.value, Quantile) or isinstance(c.fallback_value, Quantile)
    if isinstance(c, AllOf):
        return any(has_quantile(x) for x in c.all)
    if isinstance(c, AnyOf):
        return any(has_quantile(x) for x in c.any)
    return has_quantile(c.not_)


def _stat_used(c: Compare, stats: ResponseStats, profile: ModelProfile | None) -> str:
    """``c.stat``, or ``c.fallback`` when ``c.stat`` is unavailable (see :class:`Compare`)."""
    if c.fallback is None:
        return c.stat
    if isinstance(c.value, Quantile):
        available = profile is not None and profile.has_stat(c.stat)
    else:
        available = math.isfinite(stats.get(c.stat))
    return c.stat if available else c.fallback


def _threshold(c: Compare, profile: ModelProfile | None, stat: str | None = None) -> tuple[float, float | None]:
    stat = stat or c.stat
    target = c.threshold_of(stat)
    if isinstance(target, Quantile):
        if profile is None:
            msg = (
                f"the rule on {c.stat!r} uses a quantile threshold but no model profile is loaded; "
                "run `logtoku-guard calibrate` or pass profile=..."
            )
            raise ConfigurationError(msg)
        value = float(profile.quantile(stat, target.quantile))
        if not math.isfinite(value):  # a validated profile never has one
            msg = f"the profile's {stat!r} grid is not finite at q{target.quantile:g}; re-run `logtoku-guard calibrate`"
            raise ConfigurationError(msg)
        return value, target.quantile
    return float(target), None


def evaluate(c: Any, stats: ResponseStats, profile: ModelProfile | None, checks: list[Check], undefined: str) -> bool:
    if isinstance(c, Compare):
        stat = _stat_used(c, stats, profile)
        threshold, q = _threshold(c, profile, stat)
        observed = stats.get(stat)
        why = stats.undefined_reason(stat) if math.isnan(observed) else None
        if undefined == "never_fires":
            ok = math.isfinite(observed) and _OPS[c.op](observed, threshold)
        else:  # NaN is the least reliable value: -inf for reliability, +inf for the rest
            value = (-math.inf if stat in HIGHER_IS_RELIABLE else math.inf) if why is not None else observed
            ok = _OPS[c.op](value, threshold)
        checks.append(Check(stat, c.op, threshold, None if why is not None else observed, ok, q, why))
        return ok
    if isinstance(c, AllOf):
        return all([evaluate(x, stats, profile, checks, undefined) for x in c.all])  # evaluate all: every check is recorded
    if isinstance(c, AnyOf):
        return any([evaluate(x, stats, profile, checks, undefined) for x in c.any])
    return not evaluate(c.not_, stats, profile, checks, undefined)


def describe_checks(checks: list[Check]) -> str:
    return "; ".join(c.describe() for c in checks)
