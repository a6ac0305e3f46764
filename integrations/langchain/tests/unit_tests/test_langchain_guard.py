"""LogTokUGuard: routes, RAG chains, tracing (child runs, custom events, tracer metadata), streaming modes.

Fast tests use the scripted backend: answers whose top logits make them sure, middling or
unsure, and a policy with absolute thresholds between them.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import pytest

pytest.importorskip("langchain_core")

from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from langchain_core.tracers.base import BaseTracer
from langchain_core.tracers.schemas import Run
from pydantic import ValidationError

from langchain_logtoku import FLAGGED_EVENT, RETRACTED_EVENT, ChatLogTokU, FlaggedAnswerHandler, LogTokUGuard
from logtoku_guard import AuditStore, GuardRejectedError, InvalidPromptError, Policy, ScriptedAnswer, ScriptedBackend

SURE = ScriptedAnswer(["Elena", " Marwick", "."], [[9.0, 0.1], [8.0, 0.2], [9.5, 0.3]])  # reliability -0.01
MIDDLING = ScriptedAnswer(["Paris", "."], [[3.0, 1.0], [4.0, 0.5]])  # -0.12
UNSURE = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])  # -0.26

CORPUS = [
    "The Zarnovian Institute of Quantum Botany was founded in 1987 by Dr. Elena Marwick.",
    "Glimmerfen is an island village with a lighthouse built in 1902.",
]


def route(decision: Any) -> list[str]:
    """The action of each attempt in a decision payload's route (payloads.AttemptPayload items)."""
    return [a["action"] for a in decision["route"]]


def answer_for(messages: list[Any]) -> ScriptedAnswer:
    text = messages[-1].content
    if "Context:" in text or "capital" in text:
        return SURE
    return MIDDLING if "roughly" in text else UNSURE


def policy(low_action: str = "retrieve", **extra: Any) -> Policy:
    return Policy.from_dict(
        {
            "name": "test",
            "version": "7",
            "rules": [
                {"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": low_action},
                {"name": "shaky", "when": {"stat": "reliability", "op": "<", "value": -0.05}, "action": "warn"},
            ],
            **extra,
        }
    )


class KeywordRetriever(BaseRetriever):
    """In-memory: documents sharing a capitalised word with the query."""

    documents: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        words = set(re.findall(r"\b[A-Z][a-z]{3,}\b", query)) - {"What", "Which"}
        return [d for d in self.documents if words & set(d.page_content.split())]


def retriever() -> KeywordRetriever:
    return KeywordRetriever(documents=[Document(page_content=t) for t in CORPUS])


def make_guard(low_action: str = "retrieve", **kwargs: Any) -> LogTokUGuard:
    backend = ScriptedBackend(answer_for)
    kwargs.setdefault("policy", policy(low_action))
    return LogTokUGuard(llm=ChatLogTokU(backend=backend, logtoku_profile=None), profile=None, **kwargs)


class Recorder(BaseCallbackHandler):
    """Every run start and custom event, with its parent, tags and metadata."""

    def __init__(self) -> None:
        self.starts: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def _start(self, kind: str, run_id: UUID, parent_run_id: UUID | None, tags: Any, metadata: Any, **extra: Any) -> None:
        self.starts.append(
            {"kind": kind, "run_id": run_id, "parent": parent_run_id, "tags": tags or [], "metadata": metadata or {}, **extra}
        )

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: Any = None,
        metadata: Any = None,
        **kw: Any,
    ) -> None:
        self._start("chain", run_id, parent_run_id, tags, metadata, name=kw.get("name"))

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: Any = None,
        metadata: Any = None,
        **kw: Any,
    ) -> None:
        self._start("chat", run_id, parent_run_id, tags, metadata, messages=messages[0])

    def on_retriever_start(
        self,
        serialized: Any,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: Any = None,
        metadata: Any = None,
        **kw: Any,
    ) -> None:
        self._start("retriever", run_id, parent_run_id, tags, metadata, query=query)

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, tags: Any = None, metadata: Any = None, **kw: Any) -> None:
        self.events.append({"name": name, "data": data, "run_id": run_id})

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [s for s in self.starts if s["kind"] == kind]

    def guard_run(self) -> dict[str, Any]:
        return next(s for s in self.starts if s.get("name") == "LogTokUGuard")


# -- routes ----------------------------------------------------------------------------------
def test_pass_returns_the_answer_with_the_decision() -> None:
    out = make_guard().invoke("What is the capital of France?")
    assert isinstance(out, AIMessage) and out.content == "Elena Marwick."
    d = out.response_metadata["logtoku_guard"]
    assert d["action"] == "pass" and route(d) == ["pass"] and d["rule"] is None and d["attempts"] == 1
    assert d["reliability"] == pytest.approx(out.response_metadata["logtoku"]["reliability"])
    assert d["policy"] == {"name": "test", "version": "7"} and d["model"] == "scripted" and d["review_id"] is None
    assert re.fullmatch(r"[0-9a-f]{32}", d["trace_id"])
    assert [t["token"] for t in out.response_metadata["logtoku"]["tokens"]] == ["Elena", " Marwick", "."]
    assert out.usage_metadata == {"input_tokens": 0, "output_tokens": 3, "total_tokens": 3}


def test_warn_appends_the_disclaimer() -> None:
    out = make_guard().invoke("roughly where?")
    d = out.response_metadata["logtoku_guard"]
    assert d["action"] == "warn" and d["rule"] == "shaky" and d["draft"] == "Paris."
    assert out.content.startswith("Paris.\n\n") and out.content.endswith(Policy.model_fields["warn"].default.disclaimer)
    assert d["checks"] == [  # the checks of the rule that fired
        {
            "stat": "reliability",
            "op": "<",
            "threshold": -0.05,
            "observed": pytest.approx(d["reliability"]),
            "passed": True,
            "quantile": None,
            "undefined": None,
            "guarantee": None,
        },
    ]


def test_retrieve_route_regenerates_with_the_passages_as_traced_child_runs() -> None:
    guard = make_guard(retriever=retriever())
    rec = Recorder()
    out = guard.invoke("Who founded the Zarnovian Institute?", config={"callbacks": [rec]})
    d = out.response_metadata["logtoku_guard"]
    assert out.content == "Elena Marwick."
    assert d["action"] == "pass" and route(d) == ["retrieve", "pass"] and d["attempts"] == 2 and d["passages"] == 1
    guard_id = rec.guard_run()["run_id"]
    (retrieval,) = rec.of("retriever")
    assert retrieval["parent"] == guard_id and retrieval["query"] == "Who founded the Zarnovian Institute?"
    chats = rec.of("chat")
    assert len(chats) == 2 and all(c["parent"] == guard_id for c in chats)
    assert "Elena Marwick" in chats[1]["messages"][-1].content  # the second generation saw the passage
    assert out.usage_metadata["output_tokens"] == 6  # both attempts


def test_abstains_when_the_retriever_finds_nothing() -> None:
    out = make_guard(retriever=retriever()).invoke("What is the favourite colour of the mayor of Quorbly?")
    d = out.response_metadata["logtoku_guard"]
    assert out.content == "I don't know."
    assert d["action"] == "abstain" and route(d) == ["retrieve"] and d["draft"] == "Maybe Bob?"
    assert d["reason"].endswith("the retriever returned nothing")


def test_guard_in_a_rag_chain() -> None:
    """``{"context": retriever, "question": RunnablePassthrough()} | prompt | guard``."""
    docs = retriever()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the context."), ("human", "Context:\n{context}\n\nQuestion: {question}")]
    )
    chain = {"context": docs, "question": RunnablePassthrough()} | prompt | make_guard(retriever=docs)
    rec = Recorder()
    out = chain.invoke("Who founded the Zarnovian Institute?", config={"callbacks": [rec], "tags": ["rag"]})
    assert out.content == "Elena Marwick." and out.response_metadata["logtoku_guard"]["action"] == "pass"
    (chat,) = rec.of("chat")
    assert isinstance(chat["messages"][0], SystemMessage) and "Dr. Elena Marwick" in chat["messages"][1].content
    assert chat["parent"] == rec.guard_run()["run_id"] and "rag" in chat["tags"]
    # streaming the chain runs the guard's transform
    chunks = list(chain.stream("Who founded the Zarnovian Institute?"))
    assert "".join(str(c.content) for c in chunks) == "Elena Marwick."


def test_dict_input_with_context_uses_the_policy_template_and_the_bare_question() -> None:
    guard = make_guard(retriever=retriever())
    backend = guard.llm.backend
    out = guard.invoke({"question": "Who founded it?", "context": [Document(page_content="Founded by Dr. Elena Marwick.")]})
    assert out.content == "Elena Marwick."
    sent = backend.calls[-1][-1].content
    assert (
        sent.startswith("Use the context")
        and "Founded by Dr. Elena Marwick." in sent
        and sent.endswith("Question: Who founded it?")
    )
    assert out.response_metadata["logtoku_guard"]["question"] == "Who founded it?"
    rec = Recorder()
    guard.invoke({"question": "Who founded the Zarnovian Institute?"}, config={"callbacks": [rec]})
    assert rec.of("retriever")[0]["query"] == "Who founded the Zarnovian Institute?"


def test_accepts_messages_and_prompt_values() -> None:
    guard = make_guard()
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")]).invoke({"q": "capital of France?"})
    for value in (prompt, prompt.to_messages(), [("human", "capital of France?")], HumanMessage("capital of France?")):
        assert guard.invoke(value).response_metadata["logtoku_guard"]["action"] == "pass"
    with pytest.raises(InvalidPromptError, match="'question'"):
        guard.invoke({"query": "x"})
    with pytest.raises(InvalidPromptError, match="takes a string"):
        guard.invoke(42)


def test_review_route_queues_the_answer_in_the_audit_store(tmp_path: Any) -> None:
    store = AuditStore(tmp_path / "audit.db")
    handler = FlaggedAnswerHandler(store=store, log_level=None)
    out = make_guard("human_review", store=store).invoke("Who is Zork?", config={"callbacks": [handler]})
    d = out.response_metadata["logtoku_guard"]
    assert d["action"] == "human_review" and isinstance(d["review_id"], int) and d["recorded"] is True
    assert out.content == f"This answer is waiting for review by a person (review id {d['review_id']})."
    (item,) = store.pending()
    assert item.id == d["review_id"] and item.record.answer == "Maybe Bob?" and item.record.trace_id == d["trace_id"]
    assert store.count() == 1  # the handler does not record what the guard recorded
    assert [f.review_id for f in handler.flagged] == [d["review_id"]]


def test_raise_route_propagates_after_flagging() -> None:
    rec = Recorder()
    with pytest.raises(GuardRejectedError) as info:
        make_guard("raise").invoke("Who is Zork?", config={"callbacks": [rec]})
    assert info.value.result.action == "raise"
    assert [e["name"] for e in rec.events] == [FLAGGED_EVENT]


def test_construction_is_validated_by_the_core() -> None:
    llm = ChatLogTokU(backend=ScriptedBackend(answer_for), logtoku_profile=None)
    with pytest.raises(ValidationError, match="uses quantile thresholds, which need the model's profile"):
        LogTokUGuard(llm=llm, profile=None)  # the default policy is written in quantiles
    with pytest.raises(ValidationError, match="needs store=AuditStore"):
        LogTokUGuard(llm=llm, policy=policy("human_review"), profile=None)
    with pytest.raises(ValidationError, match="retriever must be"):
        LogTokUGuard(llm=llm, policy=policy(), profile=None, retriever=42)


# -- tracing ---------------------------------------------------------------------------------
def test_config_callbacks_tags_and_metadata_reach_every_child_run() -> None:
    rec = Recorder()
    guard = make_guard(retriever=retriever())
    guard.invoke(
        "Who founded the Zarnovian Institute?",
        config={"callbacks": [rec], "tags": ["team-a"], "metadata": {"user": "u1"}, "run_name": "guarded"},
    )
    guard_run = next(s for s in rec.starts if s.get("name") == "guarded")
    children = [s for s in rec.starts if s["parent"] == guard_run["run_id"]]
    assert {c["kind"] for c in children} == {"chat", "retriever"} and len(children) == 3
    for child in children:
        assert "team-a" in child["tags"] and child["metadata"]["user"] == "u1"
    chat = rec.of("chat")[0]
    assert chat["metadata"]["ls_provider"] == "logtoku" and chat["metadata"]["ls_model_name"] == "scripted"


def test_flagged_event_for_every_non_pass_route_only() -> None:
    guard = make_guard(retriever=retriever())
    handler = FlaggedAnswerHandler(log_level=None)
    rec = Recorder()
    config = {"callbacks": [handler, rec], "tags": ["t"], "metadata": {"m": 1}}
    guard.invoke("What is the capital of France?", config=config)  # pass
    assert handler.flagged == [] and rec.events == []
    guard.invoke("roughly?", config=config)  # warn
    guard.invoke("What is the favourite colour of Quorbly?", config=config)  # retrieve -> nothing -> abstain
    guard.invoke("Who founded the Zarnovian Institute?", config=config)  # retrieve -> pass
    assert [f.action for f in handler.flagged] == ["warn", "abstain", "pass"]
    assert [tuple(route(e["data"])) for e in rec.events] == [("warn",), ("retrieve",), ("retrieve", "pass")]
    warn = handler.flagged[0]
    assert warn.rule == "shaky" and warn.draft == "Paris." and warn.question == "roughly?"
    assert warn.tags == ("t",) and warn.metadata["m"] == 1
    assert warn.decision["logtoku.action"] == "warn" and warn.decision["logtoku.rule"] == "shaky"
    guard_runs = [s["run_id"] for s in rec.starts if s.get("name") == "LogTokUGuard"]
    assert [e["run_id"] for e in rec.events] == guard_runs[1:]  # each event on its own guard run


def test_flagged_answers_without_a_guard_store_go_to_the_handler_store(tmp_path: Any) -> None:
    store = AuditStore(tmp_path / "audit.db")
    handler = FlaggedAnswerHandler(store=store, log_level=None)
    out = make_guard("abstain").invoke("Who is Zork?", config={"callbacks": [handler]})
    record = store.get(out.response_metadata["logtoku_guard"]["trace_id"])
    assert record.action == "abstain" and record.answer == "Maybe Bob?" and record.policy_name == "test"
    assert record.rule == "unsure" and record.stats["n_tokens"] == 3
    # the same record as the guard's own store would keep: tokens and timings included
    meta = out.response_metadata["logtoku_guard"]
    assert record.tokens == meta["tokens"] and len(record.tokens) == 3
    assert record.timings == meta["timings"] and record.timings["total_s"] > 0
    assert record.attempts == meta["attempts"] and record.reliability == meta["reliability"]


class _Collect(BaseTracer):
    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.runs.append(run)


def test_tracers_get_the_decision_as_run_tags_and_metadata() -> None:
    tracer = _Collect()
    make_guard().invoke("roughly?", config={"callbacks": [tracer]})
    (run,) = tracer.runs
    assert run.name == "LogTokUGuard" and "logtoku:warn" in run.tags
    meta = run.extra["metadata"]
    assert meta["logtoku.action"] == "warn" and meta["logtoku.rule"] == "shaky" and meta["logtoku.reliability"] < -0.05
    assert run.outputs["output"].response_metadata["logtoku_guard"]["action"] == "warn"


# -- streaming -------------------------------------------------------------------------------
def test_buffer_mode_yields_the_decided_answer_once() -> None:
    guard = make_guard()
    chunks = list(guard.stream("roughly?"))
    assert len(chunks) == 1 and chunks[0].chunk_position == "last"
    invoked = guard.invoke("roughly?")
    assert chunks[0].content == invoked.content
    drop = {"trace_id", "timings"}  # wall-clock timings differ between the two runs
    strip = lambda m: {**m, "logtoku_guard": {k: v for k, v in m["logtoku_guard"].items() if k not in drop}}  # noqa: E731
    assert strip(chunks[0].response_metadata) == strip(invoked.response_metadata)


def test_retract_mode_streams_tokens_then_withdraws_them() -> None:
    guard = make_guard("abstain", stream_mode="retract")
    rec = Recorder()
    chunks = list(guard.stream("Who is Zork?", config={"callbacks": [rec]}))
    assert [c.content for c in chunks] == ["Maybe", " Bob", "?", "I don't know."]
    assert [len(c.response_metadata["logtoku"]["tokens"]) for c in chunks[:3]] == [1, 1, 1]
    last = chunks[-1]
    assert last.chunk_position == "last" and last.response_metadata["logtoku_guard"]["retracted"] is True
    assert [e["name"] for e in rec.events] == [FLAGGED_EVENT, RETRACTED_EVENT]
    retracted = rec.events[1]["data"]
    assert retracted["retracted_text"] == "Maybe Bob?" and retracted["answer"] == "I don't know."
    assert rec.events[1]["run_id"] == rec.guard_run()["run_id"]


def test_retract_mode_keeps_passed_and_warned_answers() -> None:
    guard = make_guard(stream_mode="retract")
    rec = Recorder()
    chunks = list(guard.stream("roughly?", config={"callbacks": [rec]}))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.content == guard.invoke("roughly?").content  # the disclaimer is appended, nothing withdrawn
    assert full.response_metadata["logtoku_guard"]["retracted"] is False
    assert [t["token"] for t in full.response_metadata["logtoku"]["tokens"]] == ["Paris", "."]
    assert [e["name"] for e in rec.events] == [FLAGGED_EVENT]
    passed = list(guard.stream("capital of France?", config={"callbacks": [rec]}))
    assert "".join(str(c.content) for c in passed) == "Elena Marwick." and len(rec.events) == 1


def test_retract_mode_withdraws_an_answer_replaced_after_retrieval() -> None:
    guard = make_guard(retriever=retriever(), stream_mode="retract")
    rec = Recorder()
    chunks = list(guard.stream("Who founded the Zarnovian Institute?", config={"callbacks": [rec]}))
    assert "".join(str(c.content) for c in chunks[:-1]) == "Maybe Bob?" and chunks[-1].content == "Elena Marwick."
    assert [e["name"] for e in rec.events] == [FLAGGED_EVENT, RETRACTED_EVENT]
    assert len(rec.of("chat")) == 2 and len(rec.of("retriever")) == 1


def test_early_stop_rule_stops_the_stream() -> None:
    stop_early = Policy.from_dict(
        {
            "name": "early",
            "rules": [
                {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "abstain", "early_stop": True}
            ],
        }
    )
    guard = make_guard(policy=stop_early, stream_mode="retract")
    chunks = list(guard.stream("Who is Zork?"))
    d = chunks[-1].response_metadata["logtoku_guard"]
    assert d["stopped_early"] is True and d["action"] == "abstain"
    assert [c.content for c in chunks] == ["Maybe", "I don't know."]  # stopped after the first token


async def test_async_invoke_stream_and_events() -> None:
    guard = make_guard("abstain", stream_mode="retract")
    out = await guard.ainvoke("Who is Zork?")
    assert out.response_metadata["logtoku_guard"]["action"] == "abstain"
    chunks = [c async for c in guard.astream("Who is Zork?")]
    assert chunks[-1].content == "I don't know."
    names = [e["name"] async for e in guard.astream_events("Who is Zork?", version="v2") if e["event"] == "on_custom_event"]
    assert names == [FLAGGED_EVENT, RETRACTED_EVENT]


test_async_invoke_stream_and_events = pytest.mark.asyncio(test_async_invoke_stream_and_events)


# -- LangGraph -------------------------------------------------------------------------------
def test_langgraph_review_node_interrupts_for_a_verdict(tmp_path: Any) -> None:
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.types import Command

    from langchain_logtoku import human_review_node

    store = AuditStore(tmp_path / "audit.db")
    guard = make_guard("human_review", store=store)

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [guard.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_node("review", human_review_node(store=store))
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "review")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    paused = graph.invoke({"messages": [("user", "Who is Zork?")]}, config)
    (interrupt,) = paused["__interrupt__"]
    assert interrupt.value["draft"] == "Maybe Bob?" and interrupt.value["action"] == "human_review"
    done = graph.invoke(Command(resume={"approved": True, "reviewer": "alice", "answer": "Zork is a game."}), config)
    final = done["messages"][-1]
    assert final.content == "Zork is a game." and final.response_metadata["logtoku_review"]["reviewer"] == "alice"
    assert len(done["messages"]) == 2  # the pending answer was replaced, not appended
    item = store.review_item(interrupt.value["review_id"])
    assert item.status == "approved" and item.edited_answer == "Zork is a game."
    # answers the guard passed go straight through
    passed = graph.invoke({"messages": [("user", "capital of France?")]}, {"configurable": {"thread_id": "t2"}})
    assert "__interrupt__" not in passed and passed["messages"][-1].content == "Elena Marwick."


def test_closing_the_stream_early_ends_the_chat_run_cleanly() -> None:
    class Ends(BaseCallbackHandler):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def on_llm_end(self, response: Any, **kw: Any) -> None:
            self.seen.append(response.generations[0][0].message.response_metadata["finish_reason"])

        def on_llm_error(self, error: BaseException, **kw: Any) -> None:
            self.seen.append(f"error {error!r}")

    ends = Ends()
    stream = make_guard(stream_mode="retract").stream("Who is Zork?", config={"callbacks": [ends]})
    assert next(stream).content == "Maybe"
    stream.close()
    assert ends.seen == ["cancelled"]


def test_public_api() -> None:
    import langchain_logtoku

    assert set(langchain_logtoku.__all__) == {
        "ChatLogTokU",
        "LogTokUGuard",
        "FlaggedAnswer",
        "FlaggedAnswerHandler",
        "FLAGGED_EVENT",
        "RETRACTED_EVENT",
        "ReviewVerdict",
        "human_review_node",
        "LogTokUMiddleware",
        "ReviewRequest",
        "ReviewResponse",
    }
    for name in langchain_logtoku.__all__:
        assert getattr(langchain_logtoku, name) is not None
    with pytest.raises(AttributeError):
        langchain_logtoku.nothing  # noqa: B018


# -- the embedded model ----------------------------------------------------------------------
@pytest.mark.slow
def test_embedded_guard_in_a_rag_chain(embedded_backend: Any) -> None:
    llm = ChatLogTokU(backend=embedded_backend, max_tokens=24)
    permissive = Policy.from_dict({"name": "observe", "rules": [], "default_action": "pass"})
    docs = retriever()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer in one short sentence from the context."), ("human", "Context:\n{context}\n\nQuestion: {question}")]
    )
    chain = {"context": docs, "question": RunnablePassthrough()} | prompt | LogTokUGuard(llm=llm, policy=permissive)
    rec = Recorder()
    out = chain.invoke("Who founded the Zarnovian Institute?", config={"callbacks": [rec], "tags": ["rag"]})
    assert "Marwick" in out.content
    d = out.response_metadata["logtoku_guard"]
    assert d["action"] == "pass" and d["model"] == "smollm2-135m-instruct" and d["reliability"] < 0
    (chat,) = rec.of("chat")
    assert chat["parent"] == rec.guard_run()["run_id"] and "rag" in chat["tags"]
    assert chat["metadata"]["ls_provider"] == "huggingface" and chat["metadata"]["ls_model_name"] == "smollm2-135m-instruct"
