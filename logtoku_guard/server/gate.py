"""The policy's ``tool_calls`` rules on served tool calls: run, human review, re-ask or refuse.

Under ``--policy``, once the guard has let an answer through (:meth:`Engine.answer`), each call it
makes is decided by the policy's ``tool_calls`` section (:class:`~logtoku_guard.decision.tool_gate.ToolCallPolicy`)
from its per-argument scores, before the client sees it:

- ``run``: the call is returned as usual;
- ``human_review``: the call is withheld, recorded for review in the server's store (its ``answer``
  is the call's arguments as JSON, :func:`~logtoku_guard.decision.tool_gate.call_review.tool_call_record`), and
  the content says so with the review id; ``GET /v1/logtoku/reviews/{id}`` returns the approved
  (or edited) arguments once a reviewer decides (``logtoku-guard review serve``);
- ``refuse``: the call is withheld, the content is the policy's refusal message;
- ``reask``: the call is not returned; the model is told why (the policy's re-ask message as the
  tool's result) and answers again, at most ``reask.max_attempts`` times, then ``reask.fallback``.

Each call's decision is in the choice's ``logtoku_guard.tools.tool_calls`` (:class:`GatedCallPayload`);
a withheld call's arguments appear nowhere in the response. The loop is the core's, shared with
LangChain's tool gate (:mod:`logtoku_guard.guard.tool_steps`, driven by
:mod:`logtoku_guard.guard.tool_driver`); this module is only its I/O on the server.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.guard.tool_driver import adrive_tools
from logtoku_guard.guard.tool_steps import DecidedCall, Reask, Record, ToolsDecided, ToolTurn
from logtoku_guard.server import tools
from logtoku_guard.tools.tool_calls import add_tool_result, render_tool_calls, render_tool_result
from logtoku_guard.types import ChatMessage, DecodingOptions, question_of
from logtoku_guard.wire.payloads import ToolCallDecisionPayload

if TYPE_CHECKING:
    from logtoku_guard.audit.records import ReviewItem
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.server.engine import Answer, Engine

__all__ = ["GatedAnswer", "GatedCallPayload", "answer_gated", "gated_extra", "reply_of"]


GatedCallPayload = ToolCallDecisionPayload
"""One call of the answer and what the ``tool_calls`` rules decided (``logtoku_guard.tools.tool_calls``)."""


@dataclass(frozen=True)
class GatedAnswer:
    """The guarded answer, its reply as the client gets it (withheld calls removed), and each call's decision."""

    answer: Answer
    reply: tools.Reply
    calls: list[GatedCallPayload] = field(default_factory=list)

    @property
    def withheld_calls(self) -> bool:
        return any(c["action"] != "run" for c in self.calls)


async def answer_gated(
    engine: Engine,
    plan: tools.ToolPlan,
    messages: list[ChatMessage],
    options: DecodingOptions,
    cancel: threading.Event | None = None,
) -> GatedAnswer:
    """The guard's answer with the policy's ``tool_calls`` rules applied to its calls (re-asking as they say);
    ``cancel``: as :meth:`Engine.answer`'s. The loop is the core's (:func:`~logtoku_guard.guard.tool_driver.adrive_tools`);
    this function supplies its I/O (:class:`_ServerTools`)."""
    policy: Policy | None = engine.policy
    answer = await engine.answer(messages, options, cancel)
    if policy is None:
        return GatedAnswer(answer, reply_of(plan, answer))
    io = _ServerTools(engine, plan, messages, options, cancel, answer)
    decided = await adrive_tools(policy, io.turn(), io, question=question_of(messages))
    if not isinstance(decided, ToolsDecided):  # _ServerTools.reask always answers
        msg = "internal error: the tool-call loop stopped at a re-ask the server makes itself"
        raise RuntimeError(msg)
    return io.gated(policy, decided)


def reply_of(plan: tools.ToolPlan, answer: Answer) -> tools.Reply:
    """``answer`` as content and tool calls; a withheld answer is its message alone (no call is read from a draft)."""
    if answer.guard_result is not None and answer.guard_result.withheld:
        return tools.Reply(answer.text)
    return tools.reply(plan, answer.text, answer.generation)


class _ServerTools:
    """The server's I/O for the tool-call loop: the next answer through the engine (the conversation
    with the answer's calls and, as their results, what the loop says), the review queue in the
    engine's store, and the last answer as the client gets it."""

    def __init__(
        self,
        engine: Engine,
        plan: tools.ToolPlan,
        messages: list[ChatMessage],
        options: DecodingOptions,
        cancel: threading.Event | None,
        answer: Answer,
    ) -> None:
        self.engine, self.plan, self.options, self.cancel = engine, plan, options, cancel
        self.turns = list(messages)
        self.answer = answer
        self.reply = reply_of(plan, answer)

    def turn(self) -> ToolTurn:
        """The last answer's calls and their scores, as the loop reads them."""
        calls = [{"id": c.id, "name": c.function.name, "args": json.loads(c.function.arguments)} for c in self.reply.tool_calls]
        scores = {"logtoku": {"tool_calls": [dict(s) for s in self.reply.scores]}}
        return ToolTurn(calls, scores, self.answer.generation.model)

    async def reask(self, request: Reask) -> ToolTurn:
        calls = [(c.call.name, dict(c.call.args)) for c in request.calls]
        self.turns = [*self.turns, ChatMessage("assistant", render_tool_calls(self.reply.content or "", calls))]
        for result in request.results:
            add_tool_result(self.turns, render_tool_result(result))
        self.answer = await self.engine.answer(self.turns, self.options, self.cancel)
        self.reply = reply_of(self.plan, self.answer)
        return self.turn()

    async def record(self, request: Record) -> list[ReviewItem | None]:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self._write, request)  # a database call: off the event loop

    def _write(self, request: Record) -> list[ReviewItem | None]:
        """Queue each call for review; a refused call is not stored (the response says it, with its rule)."""
        store = self.engine.store
        if store is None and any(s.review for s in request.stopped):  # ServerSettings refuses such a policy before start
            msg = "internal error: a tool call was sent to human review on a server without a store"
            raise RuntimeError(msg)
        return [store.record_for_review(s.record) if s.review and store is not None else None for s in request.stopped]

    def gated(self, policy: Policy, decided: ToolsDecided) -> GatedAnswer:
        """The last answer as the client gets it: the calls to run; for the others, why they did not."""
        payloads = [_payload(c) for c in decided.history]
        if not decided.withheld:
            return GatedAnswer(self.answer, self.reply, payloads)
        kept, notes = [], []
        for call, wire_call in zip(decided.calls, self.reply.tool_calls, strict=True):
            if call.action == "run":
                kept.append(wire_call)
            elif call.action == "human_review":
                notes.append(
                    f"The call to {call.call.name} waits for human review (review id {call.review_id}); "
                    f"GET /v1/logtoku/reviews/{call.review_id} returns the arguments a reviewer approves."
                )
            else:  # refuse (a reask that ran out of attempts became its fallback)
                notes.append(policy.tool_calls.refusal_message(call.call.name, call.decision.reason))
        content = "\n\n".join(part for part in (self.reply.content, *notes) if part)
        scores = [s for s in self.reply.scores if s["id"] in {c.id for c in kept}]
        return GatedAnswer(self.answer, tools.Reply(content or None, kept, scores), payloads)


def _payload(call: DecidedCall) -> GatedCallPayload:
    return GatedCallPayload(
        id=call.call.id,
        name=call.call.name,
        action=call.action,
        rule=call.decision.rule,
        reason=call.decision.reason,
        review_id=call.review_id,
        attempt=call.attempt,
    )


def gated_extra(gated: GatedAnswer) -> dict[str, Any]:
    """What the choice's ``logtoku_guard`` adds: each call's decision (none when no call was decided)."""
    return {"tool_calls": list(gated.calls)} if gated.calls else {}
