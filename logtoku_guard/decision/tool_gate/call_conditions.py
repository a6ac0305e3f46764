"""The conditions of a tool-call rule: comparisons of one argument's statistic with a number,
and their ``all`` / ``any`` / ``not`` combinations. Each node evaluates itself on one
:class:`~logtoku_guard.decision.tool_gate.scores.ScoredToolCall`, recording an :class:`ArgumentCheck`
per argument it compared. The combinators, the meaning of an undefined statistic and the
evaluation are the one rule engine's (:mod:`logtoku_guard.decision.rules`), shared with the answer
conditions of :mod:`logtoku_guard.decision.conditions`; this module supplies only the comparison.

A comparison names the tool (``tool: transfer``, or ``"*"`` for any) and the argument
(``argument: amount``, or ``"*"``: fires when any argument of the call does). It never fires
on a call to another tool, or on an argument the call does not pass. Thresholds are absolute
numbers: no calibration profile holds argument statistics. An undefined statistic (an
unscored call or argument, an empty value) counts as the least reliable value unless the
policy says ``undefined: never_fires``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import Discriminator, Field, Tag, field_validator

from logtoku_guard.decision.rules import (
    AllOfParts,
    AnyOfParts,
    Negation,
    Op,
    RuleContext,
    StrictModel,
    combinator_kind,
    compare,
    refuse_non_number,
)
from logtoku_guard.decision.tool_gate.scores import ArgumentStat, ScoredToolCall

__all__ = ["ArgumentCheck", "ArgumentCompare", "ToolAllOf", "ToolAnyOf", "ToolCondition", "ToolNotOf"]


@dataclass(frozen=True)
class ArgumentCheck:
    """One comparison a tool rule made: ``tool.argument stat observed op threshold``.

    ``observed`` is None when the statistic is undefined; ``undefined`` then says why."""

    tool: str
    argument: str
    stat: str
    op: str
    threshold: float
    observed: float | None
    passed: bool
    undefined: str | None = None

    def describe(self) -> str:
        head = f"{self.tool}.{self.argument} {self.stat}"
        if self.observed is None:
            return f"{head} {self.op} {self.threshold:.4g}: undefined: {self.undefined}"
        return f"{head} {self.observed:.4g} {self.op} {self.threshold:.4g}"


class ArgumentCompare(StrictModel):
    """``<tool>.<argument> <stat> <op> <value>``; ``"*"`` matches any tool / any argument."""

    tool: str = Field(default="*", min_length=1)
    argument: str = Field(default="*", min_length=1)
    stat: ArgumentStat
    op: Op
    value: float

    @field_validator("value", mode="before")
    @classmethod
    def _absolute(cls, v: Any) -> Any:
        if isinstance(v, Mapping) and "quantile" in v:
            msg = (
                f"argument statistics take absolute thresholds, got {v!r}: no calibration profile holds "
                "per-argument quantiles; write a number, e.g. value: 0.3"
            )
            raise ValueError(msg)
        return refuse_non_number(v)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            msg = f"threshold must be finite, got {v!r}"
            raise ValueError(msg)
        return v

    def evaluate(self, call: ScoredToolCall, ctx: RuleContext, checks: list[ArgumentCheck]) -> bool:
        """Whether the comparison fires on ``call`` (any matching argument), recording its checks;
        an undefined statistic follows the policy's ``undefined`` (:func:`~logtoku_guard.decision.rules.compare`)."""
        if self.tool not in ("*", call.name):
            return False
        names = sorted({*call.args, *call.scores}) if self.argument == "*" else [self.argument]
        fired = False
        for name in names:
            if name not in call.args and name not in call.scores:
                continue  # the call does not pass this argument
            score = call.score_of(name)
            observed = score.get(self.stat) if score is not None else math.nan
            why = None
            if not call.scored:
                why = "the answer carries no scores for this call"
            elif score is None:
                why = "the argument was not scored"
            elif math.isnan(observed):
                why = "empty value" if score.tokens == 0 else "NaN scores"
            least_reliable = -math.inf if self.stat == "logprob" else math.inf
            ok = compare(None if why else observed, self.op, self.value, ctx, least_reliable)
            checks.append(ArgumentCheck(call.name, name, self.stat, self.op, self.value, None if why else observed, ok, why))
            fired = fired or ok
        return fired


class ToolAllOf(AllOfParts):
    all: list[ToolCondition] = Field(min_length=1)

    def parts(self) -> list[ToolCondition]:
        return self.all


class ToolAnyOf(AnyOfParts):
    any: list[ToolCondition] = Field(min_length=1)

    def parts(self) -> list[ToolCondition]:
        return self.any


class ToolNotOf(Negation):
    not_: ToolCondition = Field(alias="not")

    def part(self) -> ToolCondition:
        return self.not_


ToolCondition = Annotated[
    Union[  # noqa: UP007
        Annotated[ArgumentCompare, Tag("ArgumentCompare")],
        Annotated[ToolAllOf, Tag("ToolAllOf")],
        Annotated[ToolAnyOf, Tag("ToolAnyOf")],
        Annotated[ToolNotOf, Tag("ToolNotOf")],
    ],
    Discriminator(combinator_kind("ArgumentCompare", "ToolAllOf", "ToolAnyOf", "ToolNotOf")),
]
ToolAllOf.model_rebuild()
ToolAnyOf.model_rebuild()
ToolNotOf.model_rebuild()
