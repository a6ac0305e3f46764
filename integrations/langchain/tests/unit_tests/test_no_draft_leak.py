"""LogTokUGuard never shows a withdrawn draft to stream consumers, and its route is visible.

Buffer mode (the default): ``astream_events(version="v2")`` has no ``on_chat_model_stream``
event carrying the draft, while the child chat-model run stays visible to tracers (start/end,
tagged ``nostream`` and ``logtoku:draft``); LangGraph ``stream_mode="messages"`` never sends the
draft. Route: a retrieve-then-pass answer is tagged ``logtoku:retrieve`` and ``logtoku:pass``,
and tracer annotation never mutates metadata dicts other handlers hold.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("langchain_core")

from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.tracers.base import BaseTracer
from langchain_core.tracers.schemas import Run

from langchain_logtoku import FLAGGED_EVENT, ChatLogTokU, LogTokUGuard
from logtoku_guard import Policy, ScriptedAnswer, ScriptedBackend

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])
UNSURE = ScriptedAnswer(["Fabricated", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
DRAFT = "Fabricated"
CORPUS = ["The Zarnovian Institute of Quantum Botany was founded in 1987 by Dr. Elena Marwick."]


def answer_for(messages: list[Any]) -> ScriptedAnswer:
    return SURE if "Context:" in messages[-1].content else UNSURE


def policy(low_action: str, *, early_stop: bool = False) -> Policy:
    rule: dict[str, Any] = {"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": low_action}
    rules = [rule]
    if early_stop:
        rules = [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "abstain", "early_stop": True}]
    return Policy.from_dict({"name": "test", "version": "1", "rules": rules})


class KeywordRetriever(BaseRetriever):
    documents: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        words = set(re.findall(r"\b[A-Z][a-z]{3,}\b", query)) - {"What", "Which"}
        return [d for d in self.documents if words & set(d.page_content.split())]


def make_guard(low_action: str = "abstain", **kwargs: Any) -> LogTokUGuard:
    kwargs.setdefault("policy", policy(low_action))
    return LogTokUGuard(llm=ChatLogTokU(backend=ScriptedBackend(answer_for), logtoku_profile=None), profile=None, **kwargs)


def retriever() -> KeywordRetriever:
    return KeywordRetriever(documents=[Document(page_content=t) for t in CORPUS])


def events_of(runnable: Any, value: Any) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [e async for e in runnable.astream_events(value, version="v2")]

    return asyncio.run(collect())


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(str(e["data"]["chunk"].content) for e in events if e["event"] == "on_chat_model_stream")


# -- 1. no draft in stream events (buffer mode) -----------------------------------------------
@pytest.mark.parametrize("method", ["stream", "invoke"])
def test_astream_events_never_stream_a_withdrawn_draft(method: str) -> None:
    guard = make_guard("abstain")
    chain = ChatPromptTemplate.from_messages([("human", "{q}")]) | guard
    if method == "invoke":  # a guard invoked inside a streamed parent (the usual graph node)
        from langchain_core.runnables import RunnableLambda

        chain = RunnableLambda(lambda x, config: guard.invoke(x, config=config))
    events = events_of(chain, {"q": "Who is Zork?"} if method == "stream" else "Who is Zork?")
    assert DRAFT not in streamed_text(events)
    for e in events:
        if e["event"] == "on_chat_model_stream":
            assert DRAFT not in str(e["data"]["chunk"].content)
    starts = [e for e in events if e["event"] == "on_chat_model_start"]
    ends = [e for e in events if e["event"] == "on_chat_model_end"]
    assert len(starts) == len(ends) == 1  # the child run is still traced
    assert {"nostream", "logtoku:draft"} <= set(starts[0]["tags"])
    outputs = [e["data"]["output"] for e in events if e["event"] in ("on_chain_end",) and e["name"] == "LogTokUGuard"]
    assert outputs and outputs[-1].content == "I don't know."


def test_astream_events_in_buffer_mode_stream_the_decided_answer_only() -> None:
    guard = make_guard("abstain")
    events = events_of(guard, "Who is Zork?")
    chain_chunks = [e["data"]["chunk"] for e in events if e["event"] == "on_chain_stream" and e["name"] == "LogTokUGuard"]
    assert [c.content for c in chain_chunks] == ["I don't know."]
    assert DRAFT not in streamed_text(events)


def test_a_regenerated_draft_after_retrieval_is_not_streamed_either() -> None:
    guard = make_guard("retrieve", retriever=retriever())
    events = events_of(guard, "Who founded the Zarnovian Institute?")
    assert DRAFT not in streamed_text(events)
    starts = [e for e in events if e["event"] == "on_chat_model_start"]
    assert len(starts) == 2 and all("logtoku:draft" in e["tags"] for e in starts)


def test_buffer_mode_early_stop_holds_back_and_still_stops_generating() -> None:
    guard = make_guard(policy=policy("abstain", early_stop=True))
    events = events_of(guard, "Who is Zork?")
    assert DRAFT not in streamed_text(events)
    (out,) = [e["data"]["output"] for e in events if e["event"] == "on_chain_end" and e["name"] == "LogTokUGuard"]
    decision = out.response_metadata["logtoku_guard"]
    assert decision["stopped_early"] is True and decision["action"] == "abstain"
    assert len(decision["tokens"]) < 3 and out.content == "I don't know."


def test_retract_mode_still_streams_tokens_then_retracts() -> None:
    guard = make_guard("abstain", stream_mode="retract")
    events = events_of(guard, "Who is Zork?")
    chunks = [e["data"]["chunk"].content for e in events if e["event"] == "on_chain_stream" and e["name"] == "LogTokUGuard"]
    assert "".join(chunks).startswith("Fabricated Bob?")
    assert any(e["event"] == "on_custom_event" and e["name"] == "logtoku_retracted" for e in events)


def test_langgraph_messages_mode_never_sends_the_draft() -> None:
    pytest.importorskip("langgraph")
    from langgraph.graph import START, MessagesState, StateGraph

    guard = make_guard("abstain")

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [guard.invoke(state["messages"])]}

    def answer_streamed(state: MessagesState) -> dict[str, Any]:
        chunks = list(guard.stream(state["messages"]))
        return {"messages": [AIMessage(content="".join(str(c.content) for c in chunks))]}

    for node in (answer, answer_streamed):
        builder = StateGraph(MessagesState)
        builder.add_node("answer", node)
        builder.add_edge(START, "answer")
        graph = builder.compile()
        sent = [msg for msg, _meta in graph.stream({"messages": [("human", "Who is Zork?")]}, stream_mode="messages")]
        text = "".join(str(m.content) for m in sent)
        assert DRAFT not in text, node.__name__
        assert "I don't know." in text


# -- 2. the route is tagged -------------------------------------------------------------------
class _Collect(BaseTracer):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.runs.append(run)


class _SeenAtStart(BaseCallbackHandler):
    """Keeps the metadata dict it was handed at each chain start (by reference) and a copy."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, metadata: Any = None, **kw: Any) -> None:
        if metadata is not None:
            self.seen.append((metadata, copy.deepcopy(metadata)))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        self.events.append({"name": name, "data": data})


def test_retrieve_then_pass_is_tagged_with_every_action_of_the_route() -> None:
    tracer = _Collect()
    seen = _SeenAtStart()
    guard = make_guard("retrieve", retriever=retriever())
    guard.invoke("Who founded the Zarnovian Institute?", config={"callbacks": [seen, tracer], "metadata": {"user": "u1"}})
    run = next(r for r in tracer.runs if r.name == "LogTokUGuard")
    assert "logtoku:retrieve" in run.tags and "logtoku:pass" in run.tags
    meta = run.extra["metadata"]
    assert meta["logtoku.action"] == "pass" and meta["logtoku.route"] == ["retrieve", "pass"]
    assert meta["logtoku.rules"] == ["unsure"]
    (flagged,) = [e["data"] for e in seen.events if e["name"] == FLAGGED_EVENT]
    assert [(a["action"], a["rule"]) for a in flagged["route"]] == [("retrieve", "unsure"), ("pass", None)]
    assert flagged["logtoku.route"] == ["retrieve", "pass"]


def test_annotating_the_run_never_mutates_metadata_other_handlers_hold() -> None:
    tracer = _Collect()
    seen = _SeenAtStart()
    make_guard("abstain").invoke("Who is Zork?", config={"callbacks": [seen, tracer], "metadata": {"user": "u1"}})
    assert seen.seen
    for held, snapshot in seen.seen:
        assert held == snapshot and not any(k.startswith("logtoku.") for k in held)
    run = next(r for r in tracer.runs if r.name == "LogTokUGuard")
    assert run.extra["metadata"]["logtoku.action"] == "abstain" and run.extra["metadata"]["user"] == "u1"
    assert "logtoku:abstain" in run.tags


def test_a_plain_pass_fires_no_flagged_event_and_has_one_tag() -> None:
    tracer = _Collect()
    seen = _SeenAtStart()
    guard = make_guard("retrieve", retriever=retriever())
    guard.invoke("Context: Elena. Who?", config={"callbacks": [seen, tracer]})
    run = next(r for r in tracer.runs if r.name == "LogTokUGuard")
    assert [t for t in run.tags if t.startswith("logtoku:")] == ["logtoku:pass"]
    assert run.extra["metadata"]["logtoku.route"] == ["pass"]
    assert not [e for e in seen.events if e["name"] == FLAGGED_EVENT]
