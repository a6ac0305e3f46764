"""The tool-call gate of :class:`~langchain_logtoku.LogTokUMiddleware`: each tool call of an
answer is decided by the policy's ``tool_calls`` rules before the tool runs.

Two hooks, following LangGraph's interrupt/resume semantics (a node re-runs from its start on
resume, so anything written before an ``interrupt()`` must live in an earlier node):

- ``after_model`` (its own node) reads the per-argument scores of the last answer's calls
  (``response_metadata["logtoku"]["tool_calls"]``, :mod:`logtoku_guard.decision.tool_gate.scores`) and
  decides each call through the core's tool-call loop (:mod:`logtoku_guard.guard.tool_steps`, the
  server's too; this module is only its I/O). ``reask``: every call of the answer gets a tool message saying why it did
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

from logtoku_guard.decision.decider import require_review_store
from logtoku_guard.decision.tool_gate.call_review import ToolReviewRequest, ToolReviewResponse, review_request
from logtoku_guard.errors import ConfigurationError
from logtoku_guard.guard.tool_driver import drive_tools
from logtoku_guard.guard.tool_steps import DecidedCall, Reask, Record, ToolTurn

if TYPE_CHECKING:
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.audit.records import ReviewItem
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


def _turn(last: BaseMessage | None) -> ToolTurn:
    """The last answer's tool calls as the core's loop reads them (none when it is not a model's answer)."""
    if not isinstance(last, AIMessage) or not last.tool_calls:
        return ToolTurn()
    meta = last.response_metadata.get("logtoku")
    model = str((meta.get("model") if isinstance(meta, dict) else None) or last.response_metadata.get("model_name") or "unknown")
    return ToolTurn(last.tool_calls, last.response_metadata, model)


class _AgentTools:
    """The agent's I/O for the core's tool-call loop: its next model turn makes a re-asked answer
    (so ``reask`` leaves it to the graph), its audit store keeps the stopped calls."""

    def __init__(self, store: AuditStore | None) -> None:
        self.store = store

    def reask(self, request: Reask) -> None:
        return None  # the tool messages go into the state and the agent jumps back to the model

    def record(self, request: Record) -> list[ReviewItem | None]:
        if any(s.review for s in request.stopped):
            _require_checkpointer()  # before anything is written: the agent cannot pause without one
        out: list[ReviewItem | None] = []
        for stopped in request.stopped:
            if self.store is not None and stopped.review:
                out.append(self.store.record_for_review(stopped.record))
                continue
            if self.store is not None:
                self.store.record(stopped.record)
            out.append(None)
        return out


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
        require_review_store(policy, store, answers=False, tool_calls=True)

    # -- after_model: decide every call of the answer ----------------------------------------------
    def after_model(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """The core's tool-call loop (:func:`~logtoku_guard.guard.tool_driver.drive_tools`) on the last
        answer; a re-ask is this agent's next model turn (the loop stops there and the next
        ``after_model`` reads the new answer with the re-asks so far, kept in the state)."""
        messages = state.get("messages") or []
        last = messages[-1] if messages else None
        reasks = int(state.get("logtoku_tool_reasks") or 0)
        io = _AgentTools(self.store)
        decided = drive_tools(self.policy, _turn(last), io, question=_question(messages), reasks=reasks, quadrants=self.quadrants)
        if isinstance(decided, Reask):
            return self._reask(decided)
        if not decided.calls:  # no call to gate: forget what an earlier answer left
            return {"logtoku_tool_gate": None, "logtoku_tool_reasks": 0} if reasks or state.get("logtoku_tool_gate") else None
        gated = {call.call.id: self._gated(call) for call in decided.calls if call.action in ("human_review", "refuse")}
        return {"logtoku_tool_gate": gated, "logtoku_tool_reasks": 0}

    @staticmethod
    def _reask(request: Reask) -> dict[str, Any]:
        messages = [
            ToolMessage(content=result, name=call.call.name, tool_call_id=call.call.id, status="error")
            for call, result in zip(request.calls, request.results, strict=True)
        ]
        return {"messages": messages, "jump_to": "model", "logtoku_tool_reasks": request.number, "logtoku_tool_gate": None}

    def _gated(self, call: DecidedCall) -> GatedCall:
        review = call.review
        request = review_request(call.call, call.decision, review.record, self.quadrants) if review is not None else None
        return GatedCall(action=call.action, reason=call.decision.reason, review_id=call.review_id, request=request)

    # -- wrap_tool_call: refuse, or ask the reviewer, before the tool runs ------------------------------
    def _resolve(self, request: ToolCallRequest) -> ToolCallRequest | ToolMessage:
        """The request to run (the reviewer's arguments after an edit), or the message instead of running."""
        gated = (request.state.get("logtoku_tool_gate") if isinstance(request.state, dict) else None) or {}
        call = request.tool_call
        entry = gated.get(str(call.get("id")))
        if entry is None:
            return request
        if entry["action"] == "refuse":
            content = self.rules.refusal_message(call["name"], entry["reason"])
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
