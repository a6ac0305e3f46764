"""The conditions of a policy rule: comparisons of a response statistic with a threshold, and
their ``all`` / ``any`` / ``not`` combinations. Each node evaluates itself on one answer's
statistics (:meth:`Compare.evaluate`, recording a :class:`Check` per comparison), checks its
quantile thresholds against a model profile, and says which statistics it reads, whether it
uses a quantile, and whether it is monotone (can fire on a prefix of the answer).

Thresholds are absolute numbers, ``{quantile: q}`` of the model's profile, or, for ``guard_score <``,
a risk target on the profile's fitted guard (``{coverage: 0.85, confidence: 0.9}`` or
``{selective_risk: 0.2, confidence: 0.9}``: :class:`Risk`, :mod:`logtoku_guard.scoring.risk`); a comparison may
name a ``fallback`` statistic (with its own ``fallback_value``) used when its own is
unavailable. Undefined statistics (NaN) count as the least reliable value unless the policy
says ``undefined: never_fires`` (see :mod:`logtoku_guard.decision.policy`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from logtoku_guard.decision.rules import (
    AllOfParts,
    AnyOfParts,
    Combinator,
    Negation,
    Op,
    RuleContext,
    StrictModel,
    combinator_kind,
    compare,
    leaves,
    refuse_non_number,
)
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.scoring.second_look import LOOK_OF, SECOND_LOOK_HIGHER_IS_RELIABLE, LookedStats, SecondLookStat
from logtoku_guard.scoring.stats import HIGHER_IS_RELIABLE, MONOTONE_INCREASING, ResponseStats, StatName

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.scoring.guard_score import GuardModel
    from logtoku_guard.scoring.risk import RiskThreshold

__all__ = [
    "AllOf",
    "AnyOf",
    "Check",
    "Compare",
    "Condition",
    "NotOf",
    "Quantile",
    "Risk",
    "RiskTargetWarning",
    "describe_checks",
    "is_monotone",
    "resolve_threshold",
    "risk_threshold_for",
    "settled",
    "unmeasured",
]


class Quantile(StrictModel):
    """A threshold placed at quantile ``quantile`` of the model profile's distribution of the stat."""

    quantile: float = Field(ge=0.0, le=1.0)


class Risk(StrictModel):
    """A ``guard_score`` threshold chosen for a stated risk, with a finite-sample guarantee on the
    profile guard's labelled out-of-fold scores (:func:`~logtoku_guard.scoring.risk.choose_threshold`).

    Exactly one target: ``coverage`` (at least this share of correct answers pass) or
    ``selective_risk`` (at most this share of passed answers are wrong), at ``confidence``.
    """

    coverage: Optional[float] = Field(default=None, gt=0.0, lt=1.0)  # noqa: UP045 - pydantic field on 3.10
    selective_risk: Optional[float] = Field(default=None, gt=0.0, lt=1.0)  # noqa: UP045 - pydantic field on 3.10
    confidence: float = Field(default=0.9, gt=0.0, lt=1.0)

    @field_validator("coverage", "selective_risk", "confidence", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        return refuse_non_number(v)

    @model_validator(mode="after")
    def _one_target(self) -> Risk:
        if (self.coverage is None) == (self.selective_risk is None):
            msg = "a risk threshold states one target: {coverage: 0.85, confidence: 0.9} or {selective_risk: 0.2, ...}"
            raise ValueError(msg)
        return self

    @property
    def kind(self) -> Literal["coverage", "selective_risk"]:
        return "coverage" if self.coverage is not None else "selective_risk"

    @property
    def target(self) -> float:
        return self.coverage if self.coverage is not None else float(self.selective_risk or 0.0)


class Compare(StrictModel):
    """``stat op value``. ``fallback``: the statistic compared instead when ``stat`` is
    unavailable (its profile grid is missing or all NaN for a quantile threshold, its value NaN
    for a fixed one), e.g. ``guard_score`` falling back to ``reliability`` with a profile that
    holds no fitted guard; the recorded check names the statistic actually used."""

    stat: Union[StatName, SecondLookStat]  # noqa: UP007 - pydantic union
    op: Op
    value: Union[float, Quantile, Risk]  # noqa: UP007 - pydantic union
    fallback: Optional[Union[StatName, SecondLookStat]] = None  # noqa: UP007, UP045 - pydantic field on 3.10
    fallback_value: Optional[Union[float, Quantile]] = None  # noqa: UP007, UP045 - pydantic field on 3.10
    """The threshold of ``fallback`` when it differs from ``value`` (e.g. an absolute ``guard_score``
    probability falling back to a quantile of ``reliability``); default: ``value``."""

    @field_validator("value", "fallback_value", mode="before")
    @classmethod
    def _a_number(cls, v: Any) -> Any:
        return refuse_non_number(v)

    @field_validator("value", "fallback_value")
    @classmethod
    def _finite(cls, v: float | Quantile | None) -> float | Quantile | None:
        if isinstance(v, float) and not math.isfinite(v):
            msg = f"threshold must be finite, got {v!r}"
            raise ValueError(msg)
        return v

    @model_validator(mode="after")
    def _risk_on_guard_score(self) -> Compare:
        if isinstance(self.value, Risk) and (self.stat != "guard_score" or self.op not in ("<", "<=")):
            msg = (
                f"a risk threshold ({self.value.kind}) sets when guard_score flags an answer: write "
                f"'stat: guard_score, op: \"<\"', not 'stat: {self.stat}, op: \"{self.op}\"'"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _second_look_thresholds_are_numbers(self) -> Compare:
        for stat in self.stats():
            if stat in LOOK_OF and isinstance(self.threshold_of(stat), (Quantile, Risk)):
                msg = (
                    f"{stat} is a second-look statistic, which a model profile does not hold: give it an absolute "
                    f"threshold such as 'value: 0.5', not {self.threshold_of(stat)!r}"
                )
                raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _fallback_value_needs_a_fallback(self) -> Compare:
        if self.fallback_value is not None and self.fallback is None:
            msg = f"fallback_value {self.fallback_value!r} is given without a fallback statistic; add fallback: <stat>"
            raise ValueError(msg)
        return self

    def threshold_of(self, stat: str) -> float | Quantile | Risk:
        """The threshold compared with ``stat`` (``value``, or ``fallback_value`` for the fallback)."""
        if stat != self.stat and self.fallback_value is not None:
            return self.fallback_value
        return self.value

    def stats(self) -> set[str]:
        """The statistics this comparison may read (its own and its fallback)."""
        return {self.stat} if self.fallback is None else {self.stat, self.fallback}

    def has_quantile(self) -> bool:
        """Whether a threshold comes from the profile (a quantile, or a risk target on its guard)."""
        return isinstance(self.value, (Quantile, Risk)) or isinstance(self.fallback_value, Quantile)

    def is_monotone(self) -> bool:
        """Whether, once true on a prefix of an answer, it stays true (an ``early_stop`` condition)."""
        return self.stat in MONOTONE_INCREASING and self.op in (">", ">=")

    def check_quantiles(self, profile: ModelProfile | None) -> None:
        """Raise :class:`ConfigurationError` when a quantile threshold cannot be placed on ``profile``
        (a risk target the profile's labels cannot support, with a fallback: warn, naming the best
        bound, and compare the fallback instead)."""
        usable = self.fallback is None or not isinstance(self.value, (Quantile, Risk)) or _profiled(self, profile)
        if not usable and isinstance(self.value, Risk) and profile is not None and profile.guard is not None:
            _warn_unsupported(self.value, profile, self.fallback)  # no guard at all: the documented fallback, silently
        resolve_threshold(self, profile, self.stat if usable else self.fallback)
        if self.fallback is not None and isinstance(self.fallback_value, Quantile):  # the fallback may be needed per answer
            resolve_threshold(self, profile, self.fallback)

    def evaluate(self, stats: ResponseStats, ctx: RuleContext, checks: list[Check]) -> bool:
        """Compare on ``stats``, appending the :class:`Check` to ``checks``; an undefined value is
        the least reliable one unless the policy says ``undefined: never_fires``
        (:func:`~logtoku_guard.decision.rules.compare`)."""
        stat = _stat_used(self, stats, ctx.profile)
        threshold, q, guarantee = resolve_threshold(self, ctx.profile, stat)
        observed, why = _observe(stats, stat)
        least_reliable = -math.inf if stat in HIGHER_IS_RELIABLE or stat in SECOND_LOOK_HIGHER_IS_RELIABLE else math.inf
        ok = compare(None if why is not None else observed, self.op, threshold, ctx, least_reliable)
        checks.append(Check(stat, self.op, threshold, None if why is not None else observed, ok, q, why, guarantee))
        return ok


class AllOf(AllOfParts):
    all: list[Condition] = Field(min_length=1)

    def parts(self) -> list[Condition]:
        return self.all


class AnyOf(AnyOfParts):
    any: list[Condition] = Field(min_length=1)

    def parts(self) -> list[Condition]:
        return self.any


class NotOf(Negation):
    not_: Condition = Field(alias="not")

    def part(self) -> Condition:
        return self.not_


def is_monotone(node: Condition) -> bool:
    """Whether ``node``, once true on a prefix of an answer, stays true as it grows (an ``early_stop``
    condition): monotone comparisons joined by ``all``/``any``; never a ``not`` (a negation of a
    growing statistic can stop being true)."""
    if isinstance(node, Negation):
        return False
    if isinstance(node, Combinator):
        return all(is_monotone(part) for part in node.parts())
    return node.is_monotone()


def _observe(stats: ResponseStats, stat: str) -> tuple[float, str | None]:
    """``stat``'s value on ``stats`` and why it is undefined (None: a number); a second-look statistic on
    statistics that hold no second look (:class:`~logtoku_guard.scoring.second_look.LookedStats`) is undefined."""
    if stat in LOOK_OF and not isinstance(stats, LookedStats):
        return math.nan, "not measured: no second look was taken for this answer"
    observed = stats.get(stat)
    return observed, (stats.undefined_reason(stat) if math.isnan(observed) else None)


def _pending(c: Compare, stats: ResponseStats) -> set[str]:
    """The second-look statistics ``c`` reads that ``stats`` has not measured."""
    looks = stats.looks if isinstance(stats, LookedStats) else None
    return {s for s in c.stats() if s in LOOK_OF and (looks is None or not looks.measured(s))}


def settled(node: Condition, stats: ResponseStats, ctx: RuleContext) -> bool | None:
    """Whether ``node`` fires on ``stats``, or None when that depends on a second-look statistic not yet
    measured (three-valued: ``all`` is False as soon as one part is, ``any`` True as soon as one part is,
    ``not`` of unknown is unknown). The guard measures a second look only where this is None."""
    if isinstance(node, Negation):
        inner = settled(node.part(), stats, ctx)
        return None if inner is None else not inner
    if isinstance(node, Combinator):
        outcomes = [settled(part, stats, ctx) for part in node.parts()]
        if isinstance(node, AllOfParts) and any(o is False for o in outcomes):
            return False
        if isinstance(node, AnyOfParts) and any(o is True for o in outcomes):
            return True
        if any(o is None for o in outcomes):
            return None
        return node.combine([bool(o) for o in outcomes])
    if _pending(node, stats):
        return None
    return node.evaluate(stats, ctx, [])


def unmeasured(node: Condition, stats: ResponseStats) -> set[str]:
    """The second-look statistics ``node`` reads that ``stats`` has not measured."""
    return {s for c in comparisons(node) for s in _pending(c, stats)}


def comparisons(node: Condition) -> list[Compare]:
    """The comparisons of a condition (:func:`~logtoku_guard.decision.rules.leaves`)."""
    return list(leaves(node))


Condition = Annotated[
    Union[  # noqa: UP007
        Annotated[Compare, Tag("Compare")],
        Annotated[AllOf, Tag("AllOf")],
        Annotated[AnyOf, Tag("AnyOf")],
        Annotated[NotOf, Tag("NotOf")],
    ],
    Discriminator(combinator_kind("Compare", "AllOf", "AnyOf", "NotOf")),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()
NotOf.model_rebuild()


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
    guarantee: str | None = None
    """For a risk threshold: its target, the bound achieved and the data behind it."""

    def describe(self) -> str:
        where = f" (q{self.quantile:g} of the profile)" if self.quantile is not None else ""
        if self.guarantee is not None:  # the target and its bound, without the data behind them
            where = f" (chosen so that it {self.guarantee.split('; ', 1)[0]})"
        if self.undefined is not None or self.observed is None:
            return f"{self.stat} {self.op} {self.threshold:.4g}{where}: undefined: {self.undefined}"
        return f"{self.stat} {self.observed:.4g} {self.op} {self.threshold:.4g}{where}"


def _stat_used(c: Compare, stats: ResponseStats, profile: ModelProfile | None) -> str:
    """``c.stat``, or ``c.fallback`` when ``c.stat`` is unavailable (see :class:`Compare`)."""
    if c.fallback is None:
        return c.stat
    available = _profiled(c, profile) if isinstance(c.value, (Quantile, Risk)) else math.isfinite(_observe(stats, c.stat)[0])
    return c.stat if available else c.fallback


class RiskTargetWarning(UserWarning):
    """A risk-stated threshold the profile's labelled answers cannot support: its rule compares its fallback instead."""


def _profiled(c: Compare, profile: ModelProfile | None) -> bool:
    """Whether ``profile`` can place ``c``'s own threshold: the stat's grid for a quantile, a guard
    whose labelled reference scores support the target for a risk target."""
    if profile is None:
        return False
    if isinstance(c.value, Risk):
        chosen = _risk_choice(c.value, profile)
        return chosen is not None and bool(chosen.met)
    return profile.has_stat(c.stat)


def _risk_choice(target: Risk, profile: ModelProfile | None) -> RiskThreshold | None:
    """:func:`risk_threshold_for` ``profile``'s guard."""
    return risk_threshold_for(target, profile.guard if profile is not None else None)


def risk_threshold_for(target: Risk, guard: GuardModel | None) -> RiskThreshold | None:
    """The :class:`~logtoku_guard.scoring.risk.RiskThreshold` of ``target`` on ``guard``'s labelled
    out-of-fold scores (None: no guard, or one without labelled reference scores)."""
    from logtoku_guard.scoring.risk import choose_threshold

    correct, wrong = guard.labelled_scores() if guard is not None else ([], [])
    if not correct or not wrong:
        return None
    return choose_threshold(correct, wrong, target.kind, target.target, target.confidence)


def _warn_unsupported(target: Risk, profile: ModelProfile | None, fallback: str | None) -> None:
    import warnings

    chosen = _risk_choice(target, profile)
    why = (
        f"its labelled answers cannot support it: {chosen.describe()}"
        if chosen is not None
        else "its guard keeps no labelled reference scores; re-run `logtoku-guard calibrate`"
    )
    warnings.warn(
        f"the profile cannot place the {target.kind} threshold on guard_score ({why}); the rule compares {fallback} instead",
        RiskTargetWarning,
        stacklevel=4,
    )


def resolve_threshold(
    c: Compare, profile: ModelProfile | None, stat: str | None = None
) -> tuple[float, float | None, str | None]:
    """The threshold compared with ``stat``, its profile quantile (if one) and its risk guarantee (if one)."""
    stat = stat or c.stat
    target = c.threshold_of(stat)
    if isinstance(target, Risk):
        return _risk_threshold(target, profile)
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
        return value, target.quantile, None
    return float(target), None, None


def _risk_threshold(target: Risk, profile: ModelProfile | None) -> tuple[float, None, str]:
    chosen = _risk_choice(target, profile)
    if chosen is None:
        msg = (
            f"a {target.kind} threshold is chosen on the profile's fitted guard and its labelled out-of-fold scores, "
            "and this profile has none; run `logtoku-guard calibrate --labels FILE` (or give a fallback)"
        )
        raise ConfigurationError(msg)
    if not chosen.met:
        msg = f"the profile's labelled answers cannot support this target: {chosen.describe()}"
        raise ConfigurationError(msg)
    return chosen.threshold, None, chosen.describe()


def describe_checks(checks: list[Check]) -> str:
    return "; ".join(c.describe() for c in checks)
