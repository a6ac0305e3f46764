"""Both entry points that gate tool calls go through the core's one tool-call loop: a
``/v1/chat/completions`` request on the real server (a scripted backend) and a LangChain agent's
``invoke`` (LangChain's fake chat model replaying scored calls). The loop is counted where its one
driver starts it (:func:`logtoku_guard.guard.tool_driver.tool_steps`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from logtoku_guard.decision.policy import Policy
from logtoku_guard.guard import tool_driver

TRANSFER = {
    "type": "function",
    "function": {
        "name": "transfer",
        "description": "Send money.",
        "parameters": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
            "required": ["amount", "to"],
        },
    },
}
CALL_PIECES = [  # prose, then a call whose amount is an unsure token
    "Let",
    " me",
    " check.",
    " <",
    "tool",
    "_call>",
    '{"name": "transfer", "arguments": {"amount": ',
    "5",
    ', "to": "',
    "Bob",
    '"}}',
    "</tool_call>",
]


def _refuse_unsure_amounts() -> Policy:
    unsure = {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3}
    return Policy.from_dict(
        {"name": "tools", "rules": [], "tool_calls": {"rules": [{"name": "unsure-amount", "when": unsure, "action": "refuse"}]}}
    )


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each tool-call loop started (its policy), counted where the driver starts it."""
    started: list[Any] = []
    real = tool_driver.tool_steps

    def counted(policy: Policy, *args: Any, **kw: Any) -> Any:
        started.append(policy)
        return real(policy, *args, **kw)

    monkeypatch.setattr(tool_driver, "tool_steps", counted)
    return started


def test_a_served_request_goes_through_the_core_tool_loop(loops: list[Any]) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("llguidance")
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.server import BackgroundServer, build_app

    rows = [[9.0, 1.0]] * len(CALL_PIECES)
    rows[7] = [2.0, 1.9]  # the amount: an unsure token
    backend = ScriptedBackend(lambda messages: ScriptedAnswer(CALL_PIECES, rows))
    policy = _refuse_unsure_amounts()
    with BackgroundServer(build_app(backend, policy=policy)) as srv:
        body = {"messages": [{"role": "user", "content": "Send 5 dollars to Bob."}], "tools": [TRANSFER]}
        choice = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=120).json()["choices"][0]
    assert [d["action"] for d in choice["logtoku_guard"]["tool_calls"]] == ["refuse"]
    assert loops == [policy]  # one answer with a call: one loop


def test_a_langchain_agent_invoke_goes_through_the_core_tool_loop(loops: list[Any], tmp_path: Path) -> None:
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_logtoku import LogTokUMiddleware
    from logtoku_guard.audit import AuditStore

    sent: list[int] = []

    @tool
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        sent.append(amount)
        return "sent"

    class FakeToolModel(GenericFakeChatModel):
        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeToolModel:
            return self

    stats = {"tokens": 2, "mean_au": 0.1, "mean_eu": 0.45, "max_au": 0.2, "max_eu": 0.9, "logprob": -1.0}
    scored = {"id": "call_1", "name": "transfer", "arguments": {"amount": stats}}
    unsure = AIMessage(
        content="",
        tool_calls=[{"name": "transfer", "args": {"to": "alice", "amount": 500}, "id": "call_1"}],
        response_metadata={"logtoku": {"tokens": [], "model": "fake", "tool_calls": [scored]}},
    )
    done = AIMessage(content="I could not send it.", response_metadata={"logtoku": {"tokens": [], "model": "fake"}})
    policy = _refuse_unsure_amounts()
    with AuditStore(tmp_path / "audit.db") as store:
        agent = create_agent(
            FakeToolModel(messages=iter([unsure, done])),
            tools=[transfer],
            middleware=[LogTokUMiddleware(policy=policy, store=store)],
            checkpointer=InMemorySaver(),
        )
        out = agent.invoke({"messages": [HumanMessage("Send alice the money.")]}, {"configurable": {"thread_id": "t"}})
        assert [r.action for r in store.tail() if r.action == "refuse"] == ["refuse"]
    assert sent == [] and "refused" in next(m for m in out["messages"] if isinstance(m, ToolMessage)).content
    assert loops == [policy, policy]  # after each of the two model turns (the second made no call)


def test_the_server_tells_a_reasked_model_what_the_loop_says_of_each_call() -> None:
    """An answer calling ``transfer`` (unsure amount) and ``ping`` is re-asked: the model reads, as the
    two calls' results, the re-ask message for ``transfer`` and :data:`NOT_RUN` for ``ping``, then
    answers with ``ping`` alone, which runs."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    pytest.importorskip("llguidance")
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.fake import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.guard.tool_steps import NOT_RUN
    from logtoku_guard.server import BackgroundServer, build_app

    ping_pieces = [" <", "tool", "_call>", '{"name": "ping", "arguments": {}}', "</tool_call>"]
    ping = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    asked: list[Any] = []

    def script(messages: Any) -> ScriptedAnswer:
        asked.append(messages)
        pieces = [*CALL_PIECES, *ping_pieces] if len(asked) == 1 else ["Pinging.", *ping_pieces]
        rows = [[9.0, 1.0]] * len(pieces)
        if len(asked) == 1:
            rows[7] = [2.0, 1.9]  # the amount: an unsure token
        return ScriptedAnswer(pieces, rows)

    unsure = {"tool": "transfer", "argument": "amount", "stat": "max_eu", "op": ">", "value": 0.3}
    policy = Policy.from_dict(
        {"name": "tools", "rules": [], "tool_calls": {"rules": [{"name": "unsure-amount", "when": unsure, "action": "reask"}]}}
    )
    with BackgroundServer(build_app(ScriptedBackend(script), policy=policy)) as srv:
        body = {"messages": [{"role": "user", "content": "Send 5 dollars to Bob."}], "tools": [TRANSFER, ping]}
        choice = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=120).json()["choices"][0]
    assert len(asked) == 2
    told = asked[1][-1].content
    assert "The call to transfer was not run: you were unsure of its arguments" in told
    assert NOT_RUN.format(tool="ping") in told and "Bob" not in told
    assert "Bob" in asked[1][-2].content  # the model's own calls, before their results
    decided = [(d["attempt"], d["name"], d["action"]) for d in choice["logtoku_guard"]["tool_calls"]]
    assert decided == [(1, "transfer", "reask"), (1, "ping", "run"), (2, "ping", "run")]
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["ping"]
