"""LogTokUMiddleware in ``create_agent``: every route, the review interrupt, streaming, other models.

The "done when" checks run on the tiny random model (fast) and, marked slow, on the embedded
one, with policies whose rules fire on every answer (``n_tokens >= 0``); the routing details
use the scripted backend, whose answers are sure or unsure by construction.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt
from langgraph.types import Command

from langchain_logtoku import ChatLogTokU, LogTokUMiddleware
from langchain_logtoku._metadata_scores import generation_from_metadata
from langchain_logtoku.middleware import ReviewResponse
from logtoku_guard import AuditStore, ConfigurationError, GuardRejectedError, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.guard.generation_capture import capture_generations

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])  # reliability -0.01
MIDDLING = ScriptedAnswer(["Paris", "."], [[3.0, 1.0], [4.0, 0.5]])  # -0.12
UNSURE = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])  # -0.26
ALWAYS = {"stat": "n_tokens", "op": ">=", "value": 0}


@tool
def lookup(name: str) -> str:
    """Look a name up in the company directory."""
    return f"{name}: no entry"


def always(action: str, **extra: Any) -> Policy:
    return Policy.from_dict({"name": "always", "rules": [{"name": "all", "when": ALWAYS, "action": action}], **extra})


def graded(low: str) -> Policy:
    return Policy.from_dict(
        {
            "name": "graded",
            "rules": [
                {"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": low},
                {"name": "shaky", "when": {"stat": "reliability", "op": "<", "value": -0.05}, "action": "warn"},
            ],
        }
    )


def scripted(messages: list[Any]) -> ScriptedAnswer:
    text = messages[-1].content
    if "Context:" in text:
        return SURE
    return MIDDLING if "roughly" in text else UNSURE


def scripted_model() -> ChatLogTokU:
    return ChatLogTokU(backend=ScriptedBackend(scripted), logtoku_profile=None)


@pytest.fixture
def tiny_model(tiny_tokenizer: Any) -> ChatLogTokU:
    from support.tiny import make_model

    from logtoku_guard.backends.transformers import TransformersBackend

    model = make_model(tiny_tokenizer, max_positions=2048)  # the tool prompt is long in a 400-token vocabulary
    backend = TransformersBackend("tiny", model_obj=model, tokenizer=tiny_tokenizer)
    return ChatLogTokU(backend=backend, max_tokens=6, logtoku_profile=None)


@pytest.fixture
def store(tmp_path: Any) -> AuditStore:
    return AuditStore(tmp_path / "audit.db")


def thread(name: str = "t") -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def ask(agent: Any, question: str, config: Any = None) -> dict[str, Any]:
    return agent.invoke({"messages": [HumanMessage(question)]}, config)


# -- the "done when" checks, on a real (tiny or embedded) model -----------------------------------
def _abstains(model: ChatLogTokU) -> None:
    agent = create_agent(model, tools=[lookup], middleware=[LogTokUMiddleware(policy=always("abstain"))])
    last = ask(agent, "Who founded the Zarnovian Institute?")["messages"][-1]
    assert last.content == "I don't know." and last.tool_calls == []
    assert last.response_metadata["logtoku_guard"]["action"] == "abstain"


def _reviews(model: ChatLogTokU, store: AuditStore, verdict: dict[str, Any]) -> AIMessage:
    mw = LogTokUMiddleware(policy=always("human_review"), store=store)
    agent = create_agent(model, tools=[lookup], middleware=[mw], checkpointer=InMemorySaver())
    out = ask(agent, "Who founded the Zarnovian Institute?", thread(verdict["type"]))
    (pause,) = out["__interrupt__"]
    request = pause.value
    assert set(request) == {"review_id", "trace_id", "question", "draft", "tool_calls", "decision"}
    assert request["question"] == "Who founded the Zarnovian Institute?" and request["decision"]["action"] == "human_review"
    assert store.pending()[0].id == request["review_id"]
    assert request["draft"] not in [m.content for m in out["messages"] if request["draft"]]  # waiting: no draft shown
    done = agent.invoke(Command(resume=verdict), thread(verdict["type"]))
    last = done["messages"][-1] if verdict["type"] != "approve" or not request["tool_calls"] else done["messages"][2]
    expected = {"approve": request["draft"], "edit": verdict.get("answer"), "reject": "I don't know."}[verdict["type"]]
    assert last.content == expected
    assert last.response_metadata["logtoku_review"]["type"] == verdict["type"]
    assert store.pending() == []
    status = {"approve": "approved", "edit": "approved", "reject": "rejected"}[verdict["type"]]
    assert store.review_item(request["review_id"]).status == status
    return last


def _retrieves(model: ChatLogTokU) -> None:
    calls: list[str] = []

    def retriever(query: str) -> list[str]:
        calls.append(query)
        return ["The Zarnovian Institute was founded in 1987 by Dr. Elena Marwick."]

    policy = always("retrieve", retrieve={"max_attempts": 1, "fallback": "pass"})
    agent = create_agent(model, tools=[lookup], middleware=[LogTokUMiddleware(policy=policy, retriever=retriever)])
    with capture_generations() as captured:
        streamed = list(
            agent.stream({"messages": [HumanMessage("Who founded the Zarnovian Institute?")]}, stream_mode=["messages", "values"])
        )
    assert calls == ["Who founded the Zarnovian Institute?"]
    first, second = captured.generations[:2]
    assert "Context:" not in first.prompt and "Context:" in second.prompt  # the model was called again, with passages
    chunks = [item[0] for mode, item in streamed if mode == "messages"]
    final = [item for mode, item in streamed if mode == "values"][-1]["messages"]
    shown = "".join(str(c.content) for c in chunks if isinstance(c, AIMessage))
    assert final[-1].content == second.text and final[-1].response_metadata["logtoku_guard"]["attempts"] == 2
    assert len([m for m in final if isinstance(m, AIMessage)]) == 1  # the first draft never entered the state
    if first.text and first.text != second.text:
        assert first.text not in shown and all(m.content != first.text for m in final)


def test_abstain_on_tiny_model(tiny_model: ChatLogTokU) -> None:
    _abstains(tiny_model)


@pytest.mark.parametrize(
    "verdict",
    [{"type": "approve"}, {"type": "edit", "answer": "Dr. Elena Marwick."}, {"type": "reject", "note": "invented entity"}],
)
def test_human_review_on_tiny_model(tiny_model: ChatLogTokU, store: AuditStore, verdict: dict[str, Any]) -> None:
    _reviews(tiny_model, store, verdict)


def test_retrieve_on_tiny_model(tiny_model: ChatLogTokU) -> None:
    _retrieves(tiny_model)


@pytest.mark.slow
def test_done_when_on_embedded_model(embedded_backend: Any, tmp_path: Any) -> None:
    model = ChatLogTokU(backend=embedded_backend, max_tokens=24, logtoku_profile=None)
    _abstains(model)
    _reviews(model, AuditStore(tmp_path / "a.db"), {"type": "edit", "answer": "Dr. Elena Marwick."})
    _retrieves(model)


# -- routes, state, events (scripted answers) ------------------------------------------------------
def test_pass_warn_and_decision_everywhere() -> None:
    events: list[tuple[str, Any]] = []

    class Events(BaseCallbackHandler):
        def on_custom_event(self, name: str, data: Any, **kw: Any) -> None:
            events.append((name, data))

    agent = create_agent(scripted_model(), middleware=[LogTokUMiddleware(policy=graded("abstain"))], checkpointer=InMemorySaver())
    config = {**thread(), "callbacks": [Events()]}
    sure = ask(agent, "What is the capital of France, roughly?", config)["messages"][-1]
    assert sure.content.startswith("Paris.") and sure.content.endswith("please verify it.")  # warn: disclaimer
    decision = sure.response_metadata["logtoku_guard"]
    assert decision["action"] == "warn" and decision["rule"] == "shaky"
    assert agent.get_state(thread()).values["logtoku_guard"]["trace_id"] == decision["trace_id"]  # private state field
    assert "logtoku_guard" not in ask(agent, "roughly?", thread("2"))  # not in the agent's output
    assert [name for name, _ in events] == ["logtoku_flagged"] and events[0][1]["logtoku.action"] == "warn"


def test_the_enclosing_run_gets_the_flat_decision_without_touching_what_other_handlers_hold() -> None:
    import copy

    from langchain_core.tracers.base import BaseTracer
    from langchain_core.tracers.schemas import Run

    runs: list[Run] = []
    held: list[tuple[dict[str, Any], dict[str, Any]]] = []

    class Collect(BaseTracer):
        def _persist_run(self, run: Run) -> None:
            runs.append(run)

        def _end_trace(self, run: Run) -> None:
            runs.append(run)
            super()._end_trace(run)

    class SeenAtStart(BaseCallbackHandler):
        def on_chain_start(self, serialized: Any, inputs: Any, *, metadata: Any = None, **kw: Any) -> None:
            if metadata is not None:
                held.append((metadata, copy.deepcopy(metadata)))

    mw = LogTokUMiddleware(policy=graded("retrieve"), retriever=lambda q: ["Elena Marwick founded it."])
    agent = create_agent(scripted_model(), middleware=[mw])
    ask(agent, "Who founded the Zarnovian Institute?", {"callbacks": [SeenAtStart(), Collect()], "metadata": {"user": "u1"}})
    annotated = [r for r in runs if "logtoku.action" in (r.extra or {}).get("metadata", {})]
    assert annotated, [r.name for r in runs]
    meta = annotated[0].extra["metadata"]
    assert meta["logtoku.route"] == ["retrieve", "pass"] and meta["logtoku.rules"] == ["unsure"]
    assert meta["logtoku.attempts"] == 2 and len(meta["logtoku.trace_id"]) == 32 and meta["user"] == "u1"
    assert {"logtoku:retrieve", "logtoku:pass"} <= set(annotated[0].tags or [])
    assert held and all(now == then and not any(k.startswith("logtoku.") for k in now) for now, then in held)


def test_raise_route() -> None:
    agent = create_agent(scripted_model(), middleware=[LogTokUMiddleware(policy=graded("raise"))])
    with pytest.raises(GuardRejectedError) as info:
        ask(agent, "Who founded Glimmerfen?")
    assert info.value.result.decision.rule == "unsure"


def test_retrieve_rescues_then_records(store: AuditStore) -> None:
    mw = LogTokUMiddleware(policy=graded("retrieve"), retriever=lambda q: ["Elena Marwick founded it."], store=store)
    agent = create_agent(scripted_model(), middleware=[mw])
    last = ask(agent, "Who founded the Zarnovian Institute?")["messages"][-1]
    assert last.content == "Elena Marwick."
    assert [a["action"] for a in last.response_metadata["logtoku_guard"]["route"]] == ["retrieve", "pass"]
    assert store.get(last.response_metadata["logtoku_guard"]["trace_id"]).action == "pass"


def test_retriever_returning_nothing_falls_back() -> None:
    agent = create_agent(scripted_model(), middleware=[LogTokUMiddleware(policy=graded("retrieve"), retriever=lambda q: [])])
    last = ask(agent, "Who founded Glimmerfen?")["messages"][-1]
    decision = last.response_metadata["logtoku_guard"]
    assert last.content == "I don't know." and "the retriever returned nothing" in decision["reason"]


@pytest.mark.asyncio
async def test_async_agent_abstains() -> None:
    agent = create_agent(scripted_model(), tools=[lookup], middleware=[LogTokUMiddleware(policy=graded("abstain"))])
    out = await agent.ainvoke({"messages": [HumanMessage("Who founded Glimmerfen?")]})
    assert out["messages"][-1].content == "I don't know."


@pytest.mark.asyncio
async def test_async_review_interrupt(store: AuditStore) -> None:
    mw = LogTokUMiddleware(policy=graded("human_review"), store=store)
    agent = create_agent(scripted_model(), middleware=[mw], checkpointer=InMemorySaver())
    out = await agent.ainvoke({"messages": [HumanMessage("Who founded Glimmerfen?")]}, thread())
    assert out["__interrupt__"][0].value["draft"] == "Maybe Bob?"
    done = await agent.ainvoke(Command(resume={"type": "approve"}), thread())
    assert done["messages"][-1].content == "Maybe Bob?"


# -- errors ------------------------------------------------------------------------------------------
def test_review_needs_store_and_checkpointer(store: AuditStore) -> None:
    with pytest.raises(ConfigurationError, match="store=AuditStore"):
        LogTokUMiddleware(policy=graded("human_review"))
    agent = create_agent(scripted_model(), middleware=[LogTokUMiddleware(policy=graded("human_review"), store=store)])
    with pytest.raises(ConfigurationError, match="checkpointer"):
        ask(agent, "Who founded Glimmerfen?")
    assert store.pending() == []  # nothing queued for a review that cannot happen


def test_review_response_validation() -> None:
    with pytest.raises(ValueError, match="edited answer"):
        ReviewResponse(type="edit")
    with pytest.raises(ValueError, match="note"):
        ReviewResponse(type="reject")


def test_graph_bubble_up_passes_through() -> None:
    def handler(request: ModelRequest) -> ModelResponse:
        raise GraphInterrupt(())

    request = ModelRequest(model=scripted_model(), messages=[HumanMessage("hi")])
    with pytest.raises(GraphInterrupt):
        LogTokUMiddleware(policy=graded("abstain")).wrap_model_call(request, handler)


# -- another chat model carrying LogTokU metadata --------------------------------------------------
def _foreign(metadata: dict[str, Any]) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage(content="Maybe Bob?", response_metadata=metadata)]))


def test_other_model_with_logtoku_metadata() -> None:
    original = scripted_model().invoke("Who founded Glimmerfen?")
    rebuilt = generation_from_metadata(original)
    assert [round(t.au, 9) for t in rebuilt.tokens] == [
        round(t["au"], 9) for t in original.response_metadata["logtoku"]["tokens"]
    ]
    agent = create_agent(_foreign(original.response_metadata), middleware=[LogTokUMiddleware(policy=graded("abstain"))])
    last = ask(agent, "Who founded Glimmerfen?")["messages"][-1]
    assert last.content == "I don't know." and last.response_metadata["logtoku_guard"]["rule"] == "unsure"


def test_model_without_metadata_is_refused() -> None:
    agent = create_agent(_foreign({}), middleware=[LogTokUMiddleware(policy=graded("abstain"))])
    with pytest.raises(ConfigurationError, match="needs token scores"):
        ask(agent, "Who founded Glimmerfen?")


@pytest.mark.slow
def test_agent_middleware_example_runs(embedded_cache: Any, capsys: Any, monkeypatch: Any) -> None:
    import runpy
    from pathlib import Path

    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(embedded_cache))
    runpy.run_path(str(Path(__file__).parents[4] / "examples" / "langchain_agent_middleware.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "after the edit: Dr. Elena Marwick, in 1987." in out
    # the promised routes: the known fact passes, the invented entity is sent to retrieval first
    routes = [line.split("route: ", 1)[1] for line in out.splitlines() if "route: " in line]
    assert routes[0] == "['pass']" and routes[1].startswith("['retrieve'"), routes


# -- every answer, the first included, is the core driver's Generate request ------------------------
class Outstanding:
    """The Generate request of the core guard loop outstanding at each moment (the loop the driver
    runs, wrapped for the test): a model call made outside the driver sees None."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from logtoku_guard.guard import driver as driver_module
        from logtoku_guard.guard.guard_steps import Generate

        real = driver_module.guard_steps
        self.pending: int | None = None
        self.asked: list[int] = []

        def steps(decider: Any, progress: Any) -> Any:
            inner = real(decider, progress)
            request = next(inner)
            while True:
                self.pending = request.attempt if isinstance(request, Generate) else None
                if self.pending is not None:
                    self.asked.append(self.pending)
                reply = yield request
                self.pending = None
                request = inner.send(reply)  # the last request (Conclude) is never answered

        monkeypatch.setattr(driver_module, "guard_steps", steps)


class RecordingModelCalls(AgentMiddleware[Any, Any]):
    """Inside the guard (listed after it): the Generate request outstanding at each model call."""

    def __init__(self, outstanding: Outstanding) -> None:
        super().__init__()
        self.outstanding, self.at_call = outstanding, list[int | None]()

    def wrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        self.at_call.append(self.outstanding.pending)
        return handler(request)

    async def awrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        self.at_call.append(self.outstanding.pending)
        return await handler(request)


NEVER = {"name": "never", "when": {"stat": "n_tokens", "op": ">", "value": 1000}, "action": "abstain", "early_stop": True}


@pytest.mark.parametrize("colour", ["sync", "async"])
@pytest.mark.parametrize("model", ["ChatLogTokU", "ChatLogTokU watched", "other model"])
def test_every_answer_is_made_at_the_drivers_generate_request(monkeypatch: pytest.MonkeyPatch, model: str, colour: str) -> None:
    """The first answer too, whether the model is known before it answers (a ChatLogTokU under an
    ``early_stop`` rule: watched from its first token) or only by its answer (its decider picked then)."""
    outstanding = Outstanding(monkeypatch)
    recording = RecordingModelCalls(outstanding)
    rules = graded("retrieve")
    if model == "ChatLogTokU watched":
        rules = Policy.from_dict({"name": "watched", "rules": [NEVER, *[r.model_dump() for r in rules.rules]]})
    if model == "other model":
        unsure = scripted_model().invoke("Who founded Glimmerfen?").response_metadata
        sure = scripted_model().invoke("Context: Elena Marwick founded it.").response_metadata
        chat: Any = GenericFakeChatModel(
            messages=iter(
                [AIMessage("Maybe Bob?", response_metadata=unsure), AIMessage("Elena Marwick.", response_metadata=sure)]
            )
        )
    else:
        chat = scripted_model()
    guard = LogTokUMiddleware(policy=rules, retriever=lambda q: ["Elena Marwick founded it."])
    agent = create_agent(chat, middleware=[guard, recording])
    question = {"messages": [HumanMessage("Who founded the Zarnovian Institute?")]}
    out = agent.invoke(question) if colour == "sync" else asyncio.run(agent.ainvoke(question))
    last = out["messages"][-1]
    assert last.content == "Elena Marwick." and [a["action"] for a in last.response_metadata["logtoku_guard"]["route"]] == [
        "retrieve",
        "pass",
    ]
    assert recording.at_call == [1, 2] and outstanding.asked == [1, 2]
