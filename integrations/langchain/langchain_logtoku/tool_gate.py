"""The tool-call gate of :class:`~langchain_logtoku.LogTokUMiddleware`: each tool call of an
answer is decided by the policy's ``tool_calls`` rules before the tool runs.

Two hooks, following LangGraph's interrupt/resume semantics (a node re-runs from its start on
resume, so anything written before an ``interrupt()`` must live in an earlier node):

- ``after_model`` (its own node) reads the per-argument scores of the last answer's calls
  (``response_metadata["logtoku"]["tool_calls"]``, :mod:`logtoku_guard.decision.tool_gate.scores`) and
  decides each call. ``reask``: every call of the answer gets a tool message saying why it did
  not run and the agent jumps back to the model (as often as the policy allows in a
  row, then ``reask.fallback``). ``human_review`` and ``refuse``: the call is recorded in the
  audit store (a review item for ``human_review``) and its decision kept in the private state
  field ``logtoku_tool_gate``.
- ``wrap_tool_call`` (in the tools node, per call): a refused call returns the refusal tool
  message and the tool does not run; a call under review ``interrupt()``s with a
  :class:`~logtoku_guard.decision.tool_gate.call_review.ToolReviewRequest` and is resumed with a
  :class:`~logtoku_guard.decision.tool_gate.call_review.ToolReviewResponse` (approve: the tool runs; edit: it
  runs with the reviewer's arguments; reject: it does not, and the agent gets a tool message
  with the note). Other calls run untouched. Needs a checkpointer, as every interrupt does.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, TypedDict

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables.config import ensure_config
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from logtoku_guard.decision.tool_gate.call_policy import ToolDecision
from logtoku_guard.decision.tool_gate.call_review import ToolReviewRequest, ToolReviewResponse, review_request, tool_call_record
from logtoku_guard.decision.tool_gate.scores import ScoredToolCall, parse_tool_call_scores
from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.scoring.quadrants import QuadrantThresholds

__all__ = ["GatedCall", "ToolGate", "ToolGateState"]

ToolResult = ToolMessage | Command[Any]


class GatedCall(TypedDict):
    """A stopped call, kept between ``after_model`` and the tools node (by tool call id)."""

    action: str
    reason: str
    review_id: int | None
    request: ToolReviewRequest | None


class ToolGateState(AgentState[Any]):
    """The private state fields of the gate (not in the agent's input or output)."""

    logtoku_tool_gate: NotRequired[Annotated[dict[str, GatedCall] | None, PrivateStateAttr]]
    logtoku_tool_reasks: NotRequired[Annotated[int, PrivateStateAttr]]


def _question(messages: Sequence[BaseMessage]) -> str:
    return next((m.text for m in reversed(messages) if isinstance(m, HumanMessage)), "")


def _require_checkpointer() -> None:
    if ensure_config().get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER) is None:
        msg = (
            "the policy sent a tool call to human review, which pauses the agent with interrupt() before the tool runs: "
            "create the agent with a checkpointer, e.g. create_agent(..., checkpointer=InMemorySaver()), "
            "and invoke it with config={'configurable': {'thread_id': ...}}"
        )
        raise ConfigurationError(msg)


class ToolGate:
    """The ``tool_calls`` section of ``policy`` applied to an agent's tool calls (see the module doc)."""

    def __init__(self, policy: Policy, store: AuditStore | None, quadrants: QuadrantThresholds | None) -> None:
        self.policy = policy
        self.rules = policy.tool_calls
        self.store = store
        self.quadrants = quadrants
        if "human_review" in self.rules.actions() and store is None:
            msg = f"policy {policy.name!r} can send tool calls to human review, which needs store=AuditStore(...)"
            raise ConfigurationError(msg)

    # -- after_model: decide every call of the answer ----------------------------------------------
    def after_model(self, state: dict[str, Any]) -> dict[str, Any] | None:
        last = state["messages"][-1] if state.get("messages") else None
        reasks = int(state.get("logtoku_tool_reasks") or 0)
        if not isinstance(last, AIMessage) or not last.tool_calls or not self.rules.gates:
            return {"logtoku_tool_gate": None, "logtoku_tool_reasks": 0} if reasks or state.get("logtoku_tool_gate") else None
        calls = parse_tool_call_scores(last.response_metadata, last.tool_calls)
        decisions = list(zip(calls, self.rules.decide_turn(calls, reasks, self.policy.undefined), strict=True))
        if any(d.action == "reask" for _, d in decisions):
            return self._reask(decisions, reasks + 1)
        if any(d.action == "human_review" for _, d in decisions):
            _require_checkpointer()
        gated: dict[str, GatedCall] = {}
        for call, decision in decisions:
            if decision.action in ("human_review", "refuse"):
                gated[call.id] = self._record(call, decision, state["messages"], last)
        return {"logtoku_tool_gate": gated, "logtoku_tool_reasks": 0}

    def _reask(self, decisions: list[tuple[ScoredToolCall, ToolDecision]], reasks: int) -> dict[str, Any]:
        template = self.rules.reask.message
        messages = []
        for call, decision in decisions:
            if decision.action == "reask":
                content = template.format(tool=call.name, reason=decision.reason)
            else:
                content = (
                    f"The call to {call.name} was not run: another call of this answer was re-asked; "
                    "call it again if it is still needed."
                )
            messages.append(ToolMessage(content=content, name=call.name, tool_call_id=call.id, status="error"))
        return {"messages": messages, "jump_to": "model", "logtoku_tool_reasks": reasks, "logtoku_tool_gate": None}

    def _record(
        self, call: ScoredToolCall, decision: ToolDecision, messages: Sequence[BaseMessage], answer: AIMessage
    ) -> GatedCall:
        meta = answer.response_metadata.get("logtoku")
        model = str(
            (meta.get("model") if isinstance(meta, dict) else None) or answer.response_metadata.get("model_name") or "unknown"
        )
        record = tool_call_record(
            call,
            decision,
            question=_question(messages),
            model=model,
            policy_name=self.policy.name,
            policy_version=self.policy.version,
            quadrants=self.quadrants,
        )
        review_id: int | None = None
        request = None
        if self.store is not None and decision.action == "refuse":
            self.store.record(record)
        elif self.store is not None:
            item = self.store.record_for_review(record)
            review_id, request = item.id, review_request(call, decision, item.record, self.quadrants)
        return GatedCall(action=decision.action, reason=decision.reason, review_id=review_id, request=request)

    # -- wrap_tool_call: refuse, or ask the reviewer, before the tool runs ------------------------------
    def _resolve(self, request: ToolCallRequest) -> ToolCallRequest | ToolMessage:
        """The request to run (the reviewer's arguments after an edit), or the message instead of running."""
        gated = (request.state.get("logtoku_tool_gate") if isinstance(request.state, dict) else None) or {}
        call = request.tool_call
        entry = gated.get(str(call.get("id")))
        if entry is None:
            return request
        if entry["action"] == "refuse":
            content = self.rules.refuse.message.format(tool=call["name"], reason=entry["reason"])
            return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"], status="error")
        verdict = ToolReviewResponse.model_validate(interrupt(entry["request"], response_schema=ToolReviewResponse))
        self._record_verdict(entry["review_id"], verdict)
        if verdict.type == "approve":
            return request
        if verdict.type == "edit":
            return request.override(tool_call={**call, "args": dict(verdict.args or {})})
        content = f"A reviewer rejected the call to {call['name']}; the tool did not run. Reviewer's note: {verdict.note}"
        return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"], status="error")

    def _record_verdict(self, review_id: int | None, verdict: ToolReviewResponse) -> None:
        """Write the verdict to the review item, unless it was decided there already (the review page)."""
        if self.store is None or review_id is None:
            return
        item = self.store.review_item(review_id)
        if item.decided:
            if (item.status == "rejected") != (verdict.type == "reject"):
                msg = (
                    f"review item {review_id} is {item.status} in the audit store but the agent was resumed with "
                    f"{verdict.type!r}; resume with ToolReviewResponse.from_item(store.review_item({review_id}))"
                )
                raise ConfigurationError(msg)
            return
        if verdict.type == "reject":
            self.store.reject(review_id, verdict.reviewer, note=verdict.note or "")
        else:
            edited = json.dumps(verdict.args, ensure_ascii=False, sort_keys=True, indent=2) if verdict.args is not None else None
            self.store.approve(review_id, verdict.reviewer, edited_answer=edited, note=verdict.note)

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        resolved = self._resolve(request)
        return resolved if isinstance(resolved, ToolMessage) else _noted(handler(resolved), request, resolved)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        resolved = self._resolve(request)
        return resolved if isinstance(resolved, ToolMessage) else _noted(await handler(resolved), request, resolved)


def _noted(result: ToolResult, asked: ToolCallRequest, ran: ToolCallRequest) -> ToolResult:
    """The tool's result, with a note first when a reviewer changed the arguments (so the model
    knows the call that ran is not the one it made)."""
    if ran is asked or not isinstance(result, ToolMessage) or not isinstance(result.content, str):
        return result
    args = json.dumps(ran.tool_call["args"], ensure_ascii=False, sort_keys=True, default=str)
    note = f"Note: a reviewer changed the arguments before the tool ran; it ran with {args}."
    return result.model_copy(update={"content": f"{note}\n{result.content}" if result.content else note})
