"""A gated tool call for people: its audit record, the review request, and the verdict.

A call the ``tool_calls`` rules stop (``human_review``, ``refuse``) becomes one
:class:`~logtoku_guard.audit.AuditRecord` (:func:`tool_call_record`): ``answer`` is the call's
arguments as a JSON object (what approval releases; a reviewer's edit of it on the review page
or in the terminal is the edited arguments), ``tool_calls`` the call with its per-argument scores,
each argument's ``quadrant`` and whether a rule ``flagged`` it. The reviewer's verdict comes back
as a :class:`ToolReviewResponse` (given to ``Command(resume=...)``, or read from a decided review
item with :meth:`ToolReviewResponse.from_item`).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from logtoku_guard.audit.records import AuditRecord
from logtoku_guard.decision.tool_gate.call_policy import ToolDecision
from logtoku_guard.decision.tool_gate.scores import ScoredToolCall
from logtoku_guard.errors import ConfigurationError, short_repr

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem
    from logtoku_guard.scoring.quadrants import QuadrantThresholds

__all__ = ["ToolReviewRequest", "ToolReviewResponse", "arguments_json", "tool_call_record"]


class ToolReviewRequest(TypedDict):
    """The ``interrupt()`` value of a tool call sent to review: what the reviewer needs to decide.

    ``tool_call``: ``{"id", "name", "args"}`` as the model made it. ``arguments``: per argument
    its scores (AU/EU higher = more uncertain), ``quadrant`` and ``flagged``. ``decision``: the
    rule, its reason and the checks it made."""

    type: Literal["logtoku_tool_review"]
    review_id: int | None
    trace_id: str
    question: str
    tool_call: dict[str, Any]
    arguments: dict[str, dict[str, Any]]
    decision: dict[str, Any]


class ToolReviewResponse(BaseModel):
    """The verdict on a gated call: ``{"type": "approve"}``, ``{"type": "edit", "args": {...}}``
    (run the tool with these arguments) or ``{"type": "reject", "note": "why"}`` (the tool does not
    run; the agent is told why). ``reviewer`` defaults to ``"reviewer"``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["approve", "edit", "reject"]
    args: dict[str, Any] | None = None
    reviewer: str = Field(default="reviewer", min_length=1)
    note: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> ToolReviewResponse:
        if self.type == "edit" and self.args is None:
            msg = "an edit needs the new arguments: {'type': 'edit', 'args': {'amount': 100}}"
            raise ValueError(msg)
        if self.type != "edit" and self.args is not None:
            msg = f"only an edit takes args, got type {self.type!r} with args {short_repr(self.args)}; use type 'edit'"
            raise ValueError(msg)
        if self.type == "reject" and not (self.note or "").strip():
            msg = "a rejection needs a note saying why: {'type': 'reject', 'note': '...'}"
            raise ValueError(msg)
        return self

    @classmethod
    def from_item(cls, item: ReviewItem) -> ToolReviewResponse:
        """The verdict a decided review item holds: approved as is, approved with edited arguments
        (the edited answer, a JSON object), or rejected. Raises
        :class:`~logtoku_guard.errors.ConfigurationError` for an undecided item or an edit that is
        not a JSON object."""
        if not item.decided:
            msg = f"review item {item.id} is still {item.status!r}; wait for a verdict (store.wait_for_decision) first"
            raise ConfigurationError(msg)
        reviewer = item.reviewer or "reviewer"
        if item.status == "rejected":
            return cls(type="reject", note=item.note or "rejected by the reviewer", reviewer=reviewer)
        if item.edited_answer is None or item.edited_answer == item.record.answer:
            return cls(type="approve", reviewer=reviewer, note=item.note)
        try:
            args = json.loads(item.edited_answer)
        except json.JSONDecodeError as exc:
            args = exc
        if not isinstance(args, dict):
            msg = (
                f"review item {item.id}'s edited arguments are not a JSON object: {short_repr(item.edited_answer)}; "
                'edit them as {"name": value, ...}'
            )
            raise ConfigurationError(msg)
        return cls(type="edit", args=args, reviewer=reviewer, note=item.note)


def arguments_json(args: Any) -> str:
    """The call's arguments as the JSON object reviewers read and edit (keys sorted, 2-space indent)."""
    return json.dumps(args, ensure_ascii=False, sort_keys=True, indent=2, default=str)


def _argument_entries(
    call: ScoredToolCall, decision: ToolDecision, quadrants: QuadrantThresholds | None
) -> dict[str, dict[str, Any]]:
    flagged = set(decision.flagged_arguments)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({*call.args, *call.scores}):
        score = call.score_of(name)
        entry: dict[str, Any] = dict(score.as_dict()) if score is not None else {}
        quadrant = None
        if score is not None and quadrants is not None and not (math.isnan(score.mean_au) or math.isnan(score.mean_eu)):
            quadrant = quadrants.classify(score.mean_au, score.mean_eu).value
        entry["quadrant"] = quadrant
        entry["flagged"] = name in flagged
        out[name] = entry
    return out


def review_request(
    call: ScoredToolCall, decision: ToolDecision, record: AuditRecord, quadrants: QuadrantThresholds | None
) -> ToolReviewRequest:
    """The interrupt value for ``call``, recorded as ``record``."""
    return ToolReviewRequest(
        type="logtoku_tool_review",
        review_id=record.review_id,
        trace_id=record.trace_id,
        question=record.prompt,
        tool_call={"id": call.id, "name": call.name, "args": dict(call.args)},
        arguments=_argument_entries(call, decision, quadrants),
        decision={
            "action": decision.action,
            "rule": decision.rule,
            "reason": decision.reason,
            "checks": [c.describe() for c in decision.checks],
        },
    )


def tool_call_record(
    call: ScoredToolCall,
    decision: ToolDecision,
    *,
    question: str,
    model: str,
    policy_name: str,
    policy_version: str,
    quadrants: QuadrantThresholds | None = None,
) -> AuditRecord:
    """The audit record of a gated call: ``action`` the decision's, ``answer`` the arguments as JSON,
    ``tool_calls`` the one call with its scores (``quadrant`` from ``quadrants`` of the mean AU/EU)."""
    entry = {"id": call.id, "name": call.name, "args": dict(call.args), "arguments": _argument_entries(call, decision, quadrants)}
    checks = {f"{c.argument}.{c.stat}": c.observed for c in decision.checks}
    return AuditRecord(
        model=model,
        policy_name=policy_name,
        policy_version=policy_version,
        prompt=question,
        answer=arguments_json(call.args),
        action=decision.action,
        reason=decision.reason,
        rule=decision.rule,
        reliability=None,
        tokens=[],
        stats={k: v for k, v in checks.items() if v is not None},
        tool_calls=[entry],
    )
