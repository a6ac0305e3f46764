"""The ``tool_calls`` section of a policy: ordered rules over the arguments' uncertainty -> an action
for each tool call, taken before the tool runs.

::

    tool_calls:
      rules:
        - name: unsure-amount
          when: {tool: transfer, argument: amount, stat: max_eu, op: ">", value: 0.3}
          action: human_review
        - name: unsure-anything
          when: {tool: "*", argument: "*", stat: mean_eu, op: ">", value: 0.5}
          action: reask
      default_action: run
      reask: {max_attempts: 1, fallback: refuse}

Actions: ``run`` (the tool runs), ``human_review`` (the agent pauses before the tool runs; a
person approves, edits the arguments or rejects), ``reask`` (the tool does not run; the model
is told why and asked again, at most ``reask.max_attempts`` times in a row, then
``reask.fallback``), ``refuse`` (the tool does not run; the agent gets a tool message saying
it was refused for uncertainty). A separate section because its rules read other statistics
(per argument, :data:`~logtoku_guard.decision.tool_gate.scores.ARGUMENT_STATS`) and take other actions
than the answer rules; it shares the policy's ``undefined`` mode, name and version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from logtoku_guard.decision.rules import RuleContext, StrictModel, UndefinedMode, first_firing
from logtoku_guard.decision.tool_gate.call_conditions import ArgumentCheck, ToolCondition
from logtoku_guard.decision.tool_gate.scores import ScoredToolCall
from logtoku_guard.errors import short_repr
from logtoku_guard.templates import check_template

__all__ = ["ReaskSettings", "RefuseSettings", "ToolAction", "ToolCallPolicy", "ToolDecision", "ToolRule"]

ToolAction = Literal["run", "human_review", "reask", "refuse"]


class ToolRule(StrictModel):
    """When ``when`` holds for a tool call, take ``action`` before the tool runs."""

    name: str = Field(min_length=1)
    when: ToolCondition
    action: ToolAction
    reason: str = ""


class ReaskSettings(StrictModel):
    """``max_attempts``: re-asks in a row before ``fallback``; ``message``: what the model is told
    in place of the tool's result (``{tool}``, ``{reason}``)."""

    max_attempts: int = Field(default=1, ge=1, le=5)
    fallback: Literal["human_review", "refuse"] = "refuse"
    message: str = (
        "The call to {tool} was not run: you were unsure of its arguments ({reason}). "
        "Check the arguments against the conversation and call the tool again, or answer without it."
    )

    @field_validator("message")
    @classmethod
    def _fields(cls, v: str) -> str:
        return check_template(v, {"tool", "reason"}, "tool_calls.reask.message", tool="t", reason="r")


class RefuseSettings(StrictModel):
    """``message``: the tool message the agent gets instead of the result (``{tool}``, ``{reason}``)."""

    message: str = "The call to {tool} was refused and did not run: the model was too uncertain about its arguments ({reason})."

    @field_validator("message")
    @classmethod
    def _fields(cls, v: str) -> str:
        return check_template(v, {"tool", "reason"}, "tool_calls.refuse.message", tool="t", reason="r")


@dataclass(frozen=True)
class ToolDecision:
    """What the tool-call rules decided for one call, and why."""

    action: ToolAction
    rule: str | None
    reason: str
    checks: tuple[ArgumentCheck, ...]

    @property
    def flagged_arguments(self) -> list[str]:
        """The arguments whose comparison fired, in the order checked (no repeats)."""
        return list(dict.fromkeys(c.argument for c in self.checks if c.passed))


class ToolCallPolicy(StrictModel):
    """The rules for tool calls; the first that fires decides, else ``default_action``."""

    rules: list[ToolRule] = Field(default_factory=list)
    default_action: ToolAction = "run"
    reask: ReaskSettings = ReaskSettings()
    refuse: RefuseSettings = RefuseSettings()

    @model_validator(mode="after")
    def _valid(self) -> ToolCallPolicy:
        dupes = sorted(n for n, c in Counter(r.name for r in self.rules).items() if c > 1)
        if dupes:
            msg = f"tool_calls rule names must be unique, repeated: {short_repr(dupes)}"
            raise ValueError(msg)
        if self.default_action == "reask":
            msg = "tool_calls.default_action cannot be 'reask' (every call would be re-asked); use run, human_review or refuse"
            raise ValueError(msg)
        return self

    @property
    def gates(self) -> bool:
        """Whether any call can be stopped (a rule, or a default other than ``run``)."""
        return bool(self.rules) or self.default_action != "run"

    def actions(self) -> set[str]:
        """Every action a call can end in (the re-ask fallback included)."""
        acts: set[str] = {r.action for r in self.rules} | {self.default_action}
        if "reask" in acts:
            acts.add(self.reask.fallback)
        return acts

    def reask_message(self, tool: str, reason: str) -> str:
        """What the model is told in place of a re-asked call's result (``reask.message``)."""
        return self.reask.message.format(tool=tool, reason=reason)

    def refusal_message(self, tool: str, reason: str) -> str:
        """What is said in place of a refused call's result (``refuse.message``)."""
        return self.refuse.message.format(tool=tool, reason=reason)

    def decide(self, call: ScoredToolCall, undefined: UndefinedMode = "least_reliable") -> ToolDecision:
        """The first rule that fires on ``call``; ``undefined`` as the policy's (see the module doc)."""
        fired = first_firing(self.rules, call, RuleContext(undefined))
        if fired is None:
            return ToolDecision(self.default_action, None, "no tool rule fired", ())
        rule, checks = fired
        reason = rule.reason or "; ".join(c.describe() for c in checks if c.passed)
        return ToolDecision(rule.action, rule.name, reason, tuple(checks))

    def decide_turn(
        self, calls: Sequence[ScoredToolCall], reasks: int, undefined: UndefinedMode = "least_reliable"
    ) -> list[ToolDecision]:
        """The decisions for the calls of one answer, after ``reasks`` re-asks in a row: a ``reask``
        stays one while fewer than ``reask.max_attempts`` were made, else it becomes ``reask.fallback``."""
        decisions = [self.decide(call, undefined) for call in calls]
        if reasks < self.reask.max_attempts:
            return decisions
        fallback = self.reask.fallback
        note = f"still unsure after {reasks} re-ask(s)"
        return [ToolDecision(fallback, d.rule, f"{d.reason}; {note}", d.checks) if d.action == "reask" else d for d in decisions]
