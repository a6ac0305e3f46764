"""Uncertainty-gated tool calls: an agent's transfer waits for a person when the model is unsure
of the amount; a sure call runs at once.

Run: python examples/tool_gate.py   (offline; 1.9-2.4 s on an idle 2-core VM, 4-10 s on a busy one:
most of it imports LangChain, LangGraph and SQLAlchemy)

The model here is SCRIPTED, not a real LLM: LangChain's ``GenericFakeChatModel`` replays answers
whose tool calls carry per-argument scores in ``response_metadata["logtoku"]["tool_calls"]``, the
shape ``ChatLogTokU`` writes for a real model. That keeps the run deterministic: the first
transfer's ``amount`` is scored unsure (max EU 0.9), the second's sure (max EU 0.05).

1. The policy's ``tool_calls`` rule sends a transfer with ``max_eu > 0.3`` on ``amount`` to
   review: the agent pauses (interrupt) BEFORE the tool runs; the call is queued in the audit
   store (``logtoku-guard review serve`` shows it with its arguments coloured by uncertainty).
2. A reviewer edits the amount on the queue; the agent resumes with that verdict and the tool
   runs once, with the edited arguments.
3. A sure transfer runs without asking.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_logtoku import LogTokUMiddleware
from logtoku_guard import AuditStore, Policy
from logtoku_guard.decision.tool_gate.call_review import ToolReviewResponse

LEDGER: list[str] = []

POLICY = Policy.from_dict(
    {
        "name": "payments",
        "tool_calls": {
            "rules": [
                {
                    "name": "unsure-amount",
                    "when": {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3},
                    "action": "human_review",
                }
            ]
        },
    }
)


@tool
def transfer(to: str, amount: int) -> str:
    """Send ``amount`` euros to ``to``."""
    LEDGER.append(f"{amount} EUR to {to}")
    return f"sent {amount} EUR to {to}"


class ScriptedModel(GenericFakeChatModel):
    """Replays scripted answers; the agent's tools are accepted and ignored."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def _scores(max_eu: float) -> dict[str, float | int]:
    return {"tokens": 2, "mean_au": 0.3, "mean_eu": max_eu / 2, "max_au": 0.5, "max_eu": max_eu, "logprob": -1.2}


def transfer_call(call_id: str, to: str, amount: int, amount_eu: float) -> AIMessage:
    scores = {"id": call_id, "name": "transfer", "arguments": {"to": _scores(0.02), "amount": _scores(amount_eu)}}
    return AIMessage(
        content="",
        tool_calls=[{"id": call_id, "name": "transfer", "args": {"to": to, "amount": amount}}],
        response_metadata={"logtoku": {"tokens": [], "model": "scripted", "tool_calls": [scores]}},
    )


def reply(text: str) -> AIMessage:
    return AIMessage(content=text, response_metadata={"logtoku": {"tokens": [], "model": "scripted"}})


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = AuditStore(Path(tmp) / "audit.db")
        answers = [
            transfer_call("call_1", "alice", 5000, 0.9),
            reply("Done."),
            transfer_call("call_2", "bob", 20, 0.05),
            reply("Done."),
        ]
        agent = create_agent(
            ScriptedModel(messages=iter(answers)),
            tools=[transfer],
            middleware=[LogTokUMiddleware(policy=POLICY, store=store)],
            checkpointer=InMemorySaver(),
        )
        thread: RunnableConfig = {"configurable": {"thread_id": "payments"}}
        pay_alice: Any = {"messages": [HumanMessage("Pay alice for the flat.")]}
        pay_bob: Any = {"messages": [HumanMessage("Pay bob 20 euros.")]}

        out = agent.invoke(pay_alice, thread)
        (pause,) = out["__interrupt__"]
        request = pause.value
        amount = request["arguments"]["amount"]
        print(f"1. paused before {request['tool_call']['name']}({request['tool_call']['args']})")
        print(f"   amount: max EU {amount['max_eu']:.2f}, flagged={amount['flagged']}; reason: {request['decision']['reason']}")
        print(f"   ledger before review: {LEDGER}; queued as review item {request['review_id']}")

        store.approve(request["review_id"], "ann", edited_answer='{"to": "alice", "amount": 500}')  # as on the review page
        verdict = ToolReviewResponse.from_item(store.review_item(request["review_id"]))
        out = agent.invoke(Command(resume=verdict.model_dump()), thread)
        print(f"2. resumed with {verdict.type} {verdict.args}: ledger {LEDGER}; agent: {out['messages'][-1].content}")

        out = agent.invoke(pay_bob, thread)
        print(f"3. sure call ran unasked: {'__interrupt__' not in out}; ledger {LEDGER}")
        store.close()


if __name__ == "__main__":
    main()
