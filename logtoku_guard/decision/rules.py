"""The one rule engine: conditions evaluated on a subject, and ordered rules of which the first that fires decides.

A policy holds two kinds of rules and both run here:

- its answer rules (:mod:`logtoku_guard.decision.policy`): the subject is one answer's
  :class:`~logtoku_guard.scoring.stats.ResponseStats`, the comparison a
  :class:`~logtoku_guard.decision.conditions.Compare` of a statistic with a threshold;
- its ``tool_calls`` rules (:mod:`logtoku_guard.decision.tool_gate.call_policy`): the subject is one
  :class:`~logtoku_guard.decision.tool_gate.scores.ScoredToolCall`, the comparison an
  :class:`~logtoku_guard.decision.tool_gate.call_conditions.ArgumentCompare` of one argument's statistic.

Each kind supplies only its comparison (what it reads from its subject, the check it records)
and its actions. Written once here: the operators, the ``all`` / ``any`` / ``not`` combinators
(every part is evaluated, no short circuit, so every check is recorded), what an undefined
value means (:func:`compare`), the parsing of a condition node (:func:`combinator_kind`) and the
first-rule-fires decision (:func:`first_firing`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from logtoku_guard.errors import short_repr

if TYPE_CHECKING:
    from logtoku_guard.calibration import ModelProfile

__all__ = [
    "OPS",
    "AllOfParts",
    "AnyOfParts",
    "Combinator",
    "Negation",
    "Op",
    "RuleContext",
    "StrictModel",
    "UndefinedMode",
    "combinator_kind",
    "compare",
    "first_firing",
    "leaves",
    "refuse_non_number",
]

Op = Literal[">", ">=", "<", "<="]
OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
"""Each comparison operator of a rule (:data:`Op`) as a function."""

UndefinedMode = Literal["least_reliable", "never_fires"]
"""What an undefined value (NaN: an empty answer, an unscored argument) does in a comparison:
``least_reliable`` (default) compares the least reliable value instead; ``never_fires``: no
comparison on a NaN or infinite value fires."""


class StrictModel(BaseModel):
    """Frozen, no unknown fields, aliases accepted: the base of every policy model."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def refuse_non_number(v: Any) -> Any:
    """A threshold as written: a boolean or a string is refused, never read as a number (``true`` is not 1,
    ``"0.3"`` is not 0.3); anything else goes on to the field's own validation."""
    if isinstance(v, (bool, str)):
        msg = f"a threshold is a number such as 0.3 (or {{quantile: q}} where allowed), got {short_repr(v)}; write it unquoted"
        raise ValueError(msg)
    return v


@dataclass(frozen=True)
class RuleContext:
    """What a comparison needs besides its subject: the policy's ``undefined`` mode and, for
    thresholds placed on the model's statistics, its profile (the answer rules only)."""

    undefined: UndefinedMode = "least_reliable"
    profile: ModelProfile | None = None


def compare(observed: float | None, op: str, threshold: float, ctx: RuleContext, least_reliable: float) -> bool:
    """Whether ``observed op threshold`` fires; ``observed`` None is undefined (see :data:`UndefinedMode`):
    it compares as ``least_reliable`` (-inf for a statistic where higher is more reliable, +inf
    otherwise), or never fires. With ``never_fires`` an infinite value never fires either."""
    if ctx.undefined == "never_fires":
        return observed is not None and math.isfinite(observed) and OPS[op](observed, threshold)
    return OPS[op](least_reliable if observed is None else observed, threshold)


class Evaluable(Protocol):
    """A condition node: fires or not on ``subject``, appending the checks it made to ``checks``."""

    def evaluate(self, subject: Any, ctx: RuleContext, checks: list[Any]) -> bool: ...


class Combinator(StrictModel):
    """``all`` or ``any`` of parts (each kind declares the field and its type); every part is evaluated."""

    def parts(self) -> Sequence[Evaluable]:
        raise NotImplementedError

    def combine(self, outcomes: list[bool]) -> bool:
        raise NotImplementedError

    def evaluate(self, subject: Any, ctx: RuleContext, checks: list[Any]) -> bool:
        return self.combine([part.evaluate(subject, ctx, checks) for part in self.parts()])


class AllOfParts(Combinator):
    """``all``: fires when every part does (each kind declares the field ``all`` and returns it from ``parts``)."""

    def combine(self, outcomes: list[bool]) -> bool:
        return all(outcomes)


class AnyOfParts(Combinator):
    """``any``: fires when a part does (each kind declares the field ``any`` and returns it from ``parts``)."""

    def combine(self, outcomes: list[bool]) -> bool:
        return any(outcomes)


class Negation(StrictModel):
    """``not`` of one part (each kind declares the field ``not_``, written ``not``, and its type)."""

    def part(self) -> Evaluable:
        raise NotImplementedError

    def evaluate(self, subject: Any, ctx: RuleContext, checks: list[Any]) -> bool:
        return not self.part().evaluate(subject, ctx, checks)


def leaves(node: Any) -> Iterator[Any]:
    """The comparisons of a condition, depth first."""
    if isinstance(node, Combinator):
        for part in node.parts():
            yield from leaves(part)
    elif isinstance(node, Negation):
        yield from leaves(node.part())
    else:
        yield node


def combinator_kind(compare: str, all_of: str, any_of: str, not_of: str) -> Callable[[Any], str]:
    """The discriminator of a condition union: a parsed node's class name, else the tag its key
    names (``stat``: the comparison, ``all``, ``any``, ``not``); a mapping with none of them is
    read as a comparison, so its missing fields are what the error reports."""
    tags = (("stat", compare), ("all", all_of), ("any", any_of), ("not", not_of))

    def kind(v: Any) -> str:
        if isinstance(v, BaseModel):
            return type(v).__name__
        if isinstance(v, Mapping):
            for key, tag in tags:
                if key in v:
                    return tag
        return compare

    return kind


class RuleLike(Protocol):
    """A rule as the engine sees it: a condition to evaluate (its name and action are the caller's)."""

    @property
    def when(self) -> Any: ...


R = TypeVar("R", bound=RuleLike)


def first_firing(rules: Iterable[R], subject: Any, ctx: RuleContext) -> tuple[R, list[Any]] | None:
    """The first rule whose condition fires on ``subject`` and the checks it made; None when none fires."""
    for rule in rules:
        checks: list[Any] = []
        if rule.when.evaluate(subject, ctx, checks):
            return rule, checks
    return None
