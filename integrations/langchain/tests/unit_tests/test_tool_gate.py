"""LogTokUMiddleware gates tool calls by their arguments' uncertainty, before the tool runs.

The agent's model is LangChain's ``GenericFakeChatModel`` replaying answers whose tool calls
carry per-argument scores (``response_metadata["logtoku"]["tool_calls"]``); the tool records
every run, so a side effect is seen only when the tool really ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_logtoku import LogTokUMiddleware
from logtoku_guard import AuditStore, ConfigurationError, Policy
from logtoku_guard.decision.tool_gate.call_review import ToolReviewResponse

SENT: list[tuple[str, int]] = []


@tool
def transfer(to: str, amount: int) -> str:
    """Send ``amount`` euros to ``to``."""
    SENT.append((to, amount))
    return f"sent {amount} to {to}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


class FakeToolModel(GenericFakeChatModel):
    """Replays its messages; tools are bound by the agent and ignored (the calls are scripted)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeToolModel:
        return self


def arg(max_eu: float) -> dict[str, Any]:
    return {"tokens": 2, "mean_au": 0.1, "mean_eu": max_eu / 2, "max_au": 0.2, "max_eu": max_eu, "logprob": -1.0}


def call(amount_eu: float, *, amount: int = 500, call_id: str = "call_1") -> AIMessage:
    """An answer calling ``transfer(to="alice", amount=...)``, ``amount`` scored with ``max_eu=amount_eu``."""
    scores = {"id": call_id, "name": "transfer", "arguments": {"to": arg(0.01), "amount": arg(amount_eu)}}
    meta = {"logtoku": {"tokens": [], "model": "fake", "tool_calls": [scores]}}
    return AIMessage(
        content="",
        tool_calls=[{"name": "transfer", "args": {"to": "alice", "amount": amount}, "id": call_id}],
        response_metadata=meta,
    )


def text(content: str) -> AIMessage:
    return AIMessage(content=content, response_metadata={"logtoku": {"tokens": [], "model": "fake"}})


def policy(action: str, **section: Any) -> Policy:
    rule = {
        "name": "unsure-amount",
        "when": {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3},
    }
    return Policy.from_dict({"name": "gated", "tool_calls": {"rules": [{**rule, "action": action}], **section}})


def agent(answers: list[AIMessage], gate: Policy, store: AuditStore | None = None, *, checkpointer: bool = True) -> Any:
    mw = LogTokUMiddleware(policy=gate, store=store)
    return create_agent(
        FakeToolModel(messages=iter(answers)),
        tools=[transfer],
        middleware=[mw],
        checkpointer=InMemorySaver() if checkpointer else None,
    )


THREAD = {"configurable": {"thread_id": "t"}}
QUESTION = {"messages": [HumanMessage("Send alice the money for the flat.")]}


@pytest.fixture
def store(tmp_path: Any) -> AuditStore:
    return AuditStore(tmp_path / "audit.db")


def paused(out: dict[str, Any]) -> dict[str, Any]:
    (pause,) = out["__interrupt__"]
    return dict(pause.value)


def test_a_certain_call_runs_without_asking(store: AuditStore) -> None:
    out = agent([call(0.1), text("Done.")], policy("human_review"), store).invoke(QUESTION, THREAD)
    assert "__interrupt__" not in out and SENT == [("alice", 500)]
    assert out["messages"][-1].content == "Done." and store.pending() == []


def test_an_uncertain_call_waits_for_review_before_the_tool_runs(store: AuditStore) -> None:
    out = agent([call(0.9), text("Done.")], policy("human_review"), store).invoke(QUESTION, THREAD)
    request = paused(out)
    assert SENT == []  # interrupted before the tool ran
    assert request["type"] == "logtoku_tool_review" and request["question"] == "Send alice the money for the flat."
    assert request["tool_call"] == {"id": "call_1", "name": "transfer", "args": {"to": "alice", "amount": 500}}
    assert request["arguments"]["amount"]["max_eu"] == 0.9 and request["arguments"]["amount"]["flagged"] is True
    assert request["arguments"]["to"]["flagged"] is False
    assert request["decision"]["rule"] == "unsure-amount" and request["decision"]["reason"] == "transfer.amount max_eu 0.9 > 0.3"
    (item,) = store.pending()
    assert item.id == request["review_id"] and item.record.action == "human_review"
    assert item.record.tool_calls[0]["arguments"]["amount"]["max_eu"] == 0.9


@pytest.mark.parametrize("verdict", ["approve", "edit", "reject"])
def test_resume_with_approve_edit_or_reject(store: AuditStore, verdict: str) -> None:
    graph = agent([call(0.9), text("Done.")], policy("human_review"), store)
    review_id = paused(graph.invoke(QUESTION, THREAD))["review_id"]
    resume = {
        "approve": {"type": "approve"},
        "edit": {"type": "edit", "args": {"to": "alice", "amount": 50}},
        "reject": {"type": "reject", "note": "wrong amount"},
    }[verdict]
    out = graph.invoke(Command(resume=resume), THREAD)
    tool_message = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    item = store.review_item(review_id)
    if verdict == "approve":
        assert SENT == [("alice", 500)] and tool_message.content == "sent 500 to alice" and item.status == "approved"
    elif verdict == "edit":
        assert SENT == [("alice", 50)] and item.status == "approved" and '"amount": 50' in (item.edited_answer or "")
        assert (
            tool_message.content.startswith("Note: a reviewer changed the arguments")
            and "sent 50 to alice" in tool_message.content
        )
    else:
        assert SENT == [] and item.status == "rejected" and item.note == "wrong amount"
        assert tool_message.status == "error" and "rejected" in tool_message.content and "wrong amount" in tool_message.content
    assert out["messages"][-1].content == "Done."


def test_a_verdict_given_on_the_review_page_resumes_the_agent(store: AuditStore) -> None:
    graph = agent([call(0.9), text("Done.")], policy("human_review"), store)
    review_id = paused(graph.invoke(QUESTION, THREAD))["review_id"]
    store.approve(review_id, "ann", edited_answer='{"to": "alice", "amount": 5}')  # what the page does
    graph.invoke(Command(resume=ToolReviewResponse.from_item(store.review_item(review_id)).model_dump()), THREAD)
    assert SENT == [("alice", 5)] and store.review_item(review_id).reviewer == "ann"


def test_a_resume_that_contradicts_the_store_is_refused(store: AuditStore) -> None:
    graph = agent([call(0.9), text("Done.")], policy("human_review"), store)
    review_id = paused(graph.invoke(QUESTION, THREAD))["review_id"]
    store.reject(review_id, "ann", note="no")
    with pytest.raises(ConfigurationError, match="is rejected in the audit store but the agent was resumed with 'approve'"):
        graph.invoke(Command(resume={"type": "approve"}), THREAD)
    assert SENT == []


def test_a_bad_resume_value_is_refused_and_the_call_can_be_answered_again(store: AuditStore) -> None:
    graph = agent([call(0.9), text("Done.")], policy("human_review"), store)
    paused(graph.invoke(QUESTION, THREAD))
    with pytest.raises(ValueError, match="an edit needs the new arguments"):
        graph.invoke(Command(resume={"type": "edit"}), THREAD)
    graph.invoke(Command(resume={"type": "approve"}), THREAD)
    assert SENT == [("alice", 500)]


def test_review_needs_a_checkpointer_and_a_store(store: AuditStore) -> None:
    with pytest.raises(ConfigurationError, match="create the agent with a checkpointer"):
        agent([call(0.9), text("Done.")], policy("human_review"), store, checkpointer=False).invoke(QUESTION)
    assert SENT == [] and store.pending() == []
    with pytest.raises(ConfigurationError, match="can send tool calls to human review, which needs store=AuditStore"):
        LogTokUMiddleware(policy=policy("human_review"))


def test_refuse_answers_the_agent_without_running_the_tool(store: AuditStore) -> None:
    out = agent([call(0.9), text("I could not send it.")], policy("refuse"), store).invoke(QUESTION, THREAD)
    assert SENT == []
    tool_message = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert tool_message.status == "error" and tool_message.tool_call_id == "call_1"
    assert tool_message.content.startswith("The call to transfer was refused and did not run: the model was too uncertain")
    assert "transfer.amount max_eu 0.9 > 0.3" in tool_message.content
    (record,) = [r for r in store.tail() if r.action == "refuse"]
    assert record.tool_calls[0]["args"] == {"to": "alice", "amount": 500}


def test_reask_asks_the_model_again_and_runs_the_certain_call() -> None:
    out = agent([call(0.9, amount=5000), call(0.1, call_id="call_2"), text("Done.")], policy("reask")).invoke(QUESTION, THREAD)
    assert SENT == [("alice", 500)]  # the re-asked call never ran; the certain one did
    feedback = out["messages"][2]
    assert isinstance(feedback, ToolMessage) and feedback.status == "error" and feedback.tool_call_id == "call_1"
    assert feedback.content.startswith("The call to transfer was not run: you were unsure of its arguments")
    assert out["messages"][-1].content == "Done."


def test_reask_is_bounded_then_falls_back(store: AuditStore) -> None:
    answers = [call(0.9, call_id=f"call_{i}") for i in range(3)] + [text("Gave up.")]
    out = agent(answers, policy("reask", reask={"max_attempts": 2, "fallback": "refuse"}), store).invoke(QUESTION, THREAD)
    assert SENT == []
    results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in results] == ["call_0", "call_1", "call_2"]
    assert "refused" in results[-1].content and "still unsure after 2 re-ask(s)" in results[-1].content
    assert out["messages"][-1].content == "Gave up."


def test_malformed_scores_stop_the_agent_with_a_clear_error() -> None:
    bad = call(0.9)
    bad.response_metadata["logtoku"]["tool_calls"][0]["name"] = "delete"
    with pytest.raises(ConfigurationError, match="name is 'delete' but the call with that id is to 'transfer'"):
        agent([bad], policy("refuse")).invoke(QUESTION, THREAD)
    assert SENT == []


def test_async_review_and_refuse(store: AuditStore) -> None:
    async def run() -> None:
        graph = agent([call(0.9), text("Done.")], policy("human_review"), store)
        assert paused(await graph.ainvoke(QUESTION, THREAD))["tool_call"]["name"] == "transfer"
        assert SENT == []
        await graph.ainvoke(Command(resume={"type": "edit", "args": {"to": "alice", "amount": 7}}), THREAD)
        assert SENT == [("alice", 7)]
        out = await agent([call(0.9), text("No.")], policy("refuse"), store).ainvoke(QUESTION, THREAD)
        assert SENT == [("alice", 7)] and "refused" in next(m for m in out["messages"] if isinstance(m, ToolMessage)).content
        await agent([call(0.9, amount=1), call(0.1, amount=2, call_id="call_2"), text("Done.")], policy("reask")).ainvoke(
            QUESTION, THREAD
        )
        assert SENT == [("alice", 7), ("alice", 2)]

    asyncio.run(run())


@pytest.mark.slow
def test_the_tool_gate_example_runs_offline() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "integrations" / "langchain")])}
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "tool_gate.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "1. paused before transfer({'to': 'alice', 'amount': 5000})"
    assert "ledger before review: []" in lines[2]
    assert lines[3] == "2. resumed with edit {'to': 'alice', 'amount': 500}: ledger ['500 EUR to alice']; agent: Done."
    assert lines[4] == "3. sure call ran unasked: True; ledger ['500 EUR to alice', '20 EUR to bob']"
