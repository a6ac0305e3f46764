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
a withheld call's arguments appear nowhere in the response. The same sans-IO rules as the
LangChain middleware (:mod:`logtoku_guard.decision.tool_gate`); this module only drives them on the server.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logtoku_guard.decision.tool_gate import ScoredToolCall, ToolDecision, parse_tool_call_scores
from logtoku_guard.server import tools
from logtoku_guard.tools.tool_calls import add_tool_result, render_tool_calls, render_tool_result
from logtoku_guard.types import ChatMessage, DecodingOptions, question_of
from logtoku_guard.wire.payloads import ToolCallDecisionPayload

if TYPE_CHECKING:
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
    ``cancel``: as :meth:`Engine.answer`'s."""
    policy: Policy | None = engine.policy
    answer = await engine.answer(messages, options, cancel)
    reply = reply_of(plan, answer)
    rules = policy.tool_calls if policy is not None else None
    if rules is None or not rules.gates or not reply.tool_calls:
        return GatedAnswer(answer, reply)
    decided: list[GatedCallPayload] = []
    turns = list(messages)
    for attempt in range(rules.reask.max_attempts + 1):
        scored = _scored(reply)
        decisions = rules.decide_turn(scored, attempt, policy.undefined)  # type: ignore[union-attr]
        if any(d.action == "reask" for d in decisions):
            decided += [_payload(c, d, None, attempt + 1) for c, d in zip(scored, decisions)]
            turns = _reasked(turns, reply, scored, decisions, policy)  # type: ignore[arg-type]
            answer = await engine.answer(turns, options, cancel)
            reply = reply_of(plan, answer)
            if not reply.tool_calls:  # the model answered without the tool this time
                return GatedAnswer(answer, reply, decided)
            continue
        import functools

        import anyio.to_thread

        # the review queue is written in a worker thread (a database call)
        apply = functools.partial(_apply_decisions, engine, answer, reply, scored, decisions, decided, attempt + 1, messages)
        return await anyio.to_thread.run_sync(apply)
    msg = "internal error: the re-ask loop ended without a decision"  # decide_turn turns reask into its fallback
    raise RuntimeError(msg)


def reply_of(plan: tools.ToolPlan, answer: Answer) -> tools.Reply:
    """``answer`` as content and tool calls; a withheld answer is its message alone (no call is read from a draft)."""
    if answer.guard_result is not None and answer.guard_result.withheld:
        return tools.Reply(answer.text)
    return tools.reply(plan, answer.text, answer.generation)


def _scored(reply: tools.Reply) -> list[ScoredToolCall]:
    calls = [{"id": c.id, "name": c.function.name, "args": json.loads(c.function.arguments)} for c in reply.tool_calls]
    return parse_tool_call_scores({"logtoku": {"tool_calls": [dict(s) for s in reply.scores]}}, calls)


def _payload(call: ScoredToolCall, decision: ToolDecision, review_id: int | None, attempt: int) -> GatedCallPayload:
    return GatedCallPayload(
        id=call.id,
        name=call.name,
        action=decision.action,
        rule=decision.rule,
        reason=decision.reason,
        review_id=review_id,
        attempt=attempt,
    )


def _reasked(
    turns: list[ChatMessage], reply: tools.Reply, scored: list[ScoredToolCall], decisions: list[ToolDecision], policy: Policy
) -> list[ChatMessage]:
    """The conversation with the answer's calls and, as each call's result, why it did not run."""
    out = [*turns, ChatMessage("assistant", render_tool_calls(reply.content or "", [(c.name, dict(c.args)) for c in scored]))]
    for call, decision in zip(scored, decisions):
        template = policy.tool_calls.reask.message if decision.action == "reask" else policy.tool_calls.refuse.message
        add_tool_result(out, render_tool_result(template.format(tool=call.name, reason=decision.reason)))
    return out


def _apply_decisions(
    engine: Engine,
    answer: Answer,
    reply: tools.Reply,
    scored: list[ScoredToolCall],
    decisions: list[ToolDecision],
    decided: list[GatedCallPayload],
    attempt: int,
    messages: list[ChatMessage],
) -> GatedAnswer:
    """Keep the calls to run; record the ones for review; say why the others did not run."""
    from logtoku_guard.decision.tool_gate.call_review import tool_call_record

    policy = engine.policy
    assert policy is not None  # only called under a policy
    kept, notes = [], []
    question = question_of(messages)
    for call, wire_call, decision in zip(scored, reply.tool_calls, decisions):
        review_id = None
        if decision.action == "run":
            kept.append(wire_call)
        elif decision.action == "human_review":
            record = tool_call_record(
                call,
                decision,
                question=question,
                model=answer.generation.model,
                policy_name=policy.name,
                policy_version=policy.version,
            )
            assert engine.store is not None  # the engine refuses a tool human_review policy without a store
            review_id = engine.store.record_for_review(record).id
            notes.append(
                f"The call to {call.name} waits for human review (review id {review_id}); "
                f"GET /v1/logtoku/reviews/{review_id} returns the arguments a reviewer approves."
            )
        else:  # refuse (a reask that ran out of attempts became its fallback)
            notes.append(policy.tool_calls.refuse.message.format(tool=call.name, reason=decision.reason))
        decided.append(_payload(call, decision, review_id, attempt))
    if len(kept) == len(reply.tool_calls):
        return GatedAnswer(answer, reply, decided)
    content = "\n\n".join(part for part in (reply.content, *notes) if part)
    scores = [s for s in reply.scores if s["id"] in {c.id for c in kept}]
    return GatedAnswer(answer, tools.Reply(content or None, kept, scores), decided)


def gated_extra(gated: GatedAnswer) -> dict[str, Any]:
    """What the choice's ``logtoku_guard`` adds: each call's decision (none when no call was decided)."""
    return {"tool_calls": list(gated.calls)} if gated.calls else {}
