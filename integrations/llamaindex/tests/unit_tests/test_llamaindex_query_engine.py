"""LogTokUQueryEngine on a scripted backend: every action, streaming, async, events and span tags."""

# ruff: noqa: F811 - the fixtures imported from li_support are redefined as test arguments

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from li_support import decisions, index, low, policy, scripted, spans, sure, tagged, unsure  # noqa: F401 - fixtures
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import CustomQueryEngine

from llama_index.llms.logtoku import LogTokUDecisionEvent, LogTokULLM, LogTokUQueryEngine
from logtoku_guard import AuditStore, ConfigurationError, GuardRejectedError, GuardResult, LogTokUError, ScriptedBackend
from logtoku_guard.calibration import build_profile

SURE = ("Paris", " is", " the", " capital", ".")
UNSURE = ("Maybe", " Lyon", "?")


def engine_for(index: Any, *answers: Any, top_k: int = 2, streaming: bool = False, **kwargs: Any) -> tuple[Any, Any]:
    backend, script = scripted(*answers)
    llm = LogTokULLM(backend=backend)
    kwargs.setdefault("policy", policy(low("retrieve")))
    engine = LogTokUQueryEngine.from_index(index, llm=llm, similarity_top_k=top_k, streaming=streaming, **kwargs)
    return engine, script


# -- the actions -----------------------------------------------------------------------------
def test_a_reliable_answer_passes_with_its_decision_and_sources(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine, script = engine_for(index, sure(*SURE))
    response = engine.query("What is the capital of France?")
    assert isinstance(response, Response)
    assert str(response) == "Paris is the capital."
    info = response.metadata["logtoku"]
    assert (info["action"], info["rule"], info["reason"], info["attempts"]) == ("pass", None, "no rule fired", 1)
    assert info["reliability"] == 0.0
    assert info["policy"] == {"name": "test", "version": "7"}
    assert [t["token"] for t in info["tokens"]] == list(SURE)
    assert [n["node_id"] for n in info["source_nodes"]] == [n.node.node_id for n in response.source_nodes]
    assert len(response.source_nodes) == 2
    assert all(n.node.node_id in response.metadata for n in response.source_nodes)  # the synthesiser's own metadata stays
    result = response.metadata["logtoku_result"]
    assert isinstance(result, GuardResult) and result.answer == str(response)
    assert len(script.prompts) == 1 and "Context information" in script.prompts[0]
    [event] = decisions
    assert (event.action, event.final, event.attempt, event.answer, event.trace_id) == (
        "pass",
        True,
        1,
        str(response),
        info["trace_id"],
    )
    assert event.source_node_ids == [n.node.node_id for n in response.source_nodes]
    assert event.decision is result.decision and event.result is result
    assert "decision" not in event.model_dump() and event.model_dump()["class_name"] == "LogTokUDecisionEvent"


def test_warn_appends_the_disclaimer(index: Any) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), policy=policy(low("warn"), warn={"disclaimer": "Check this."}))
    response = engine.query("q")
    assert str(response) == "Maybe Lyon?\n\nCheck this."
    assert response.metadata["logtoku"]["action"] == "warn"


def test_abstain_replaces_the_answer(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), policy=policy(low("abstain"), abstain={"message": "No idea."}))
    response = engine.query("q")
    assert str(response) == "No idea."
    info = response.metadata["logtoku"]
    assert info["action"] == "abstain" and info["rule"] == "low-reliability"
    assert info["reason"].startswith("reliability -0.25") and "< -0.1" in info["reason"]
    assert [e.action for e in decisions] == ["abstain"]


def test_retrieve_requeries_with_more_context_then_passes(index: Any, decisions: list[LogTokUDecisionEvent], spans: Any) -> None:
    engine, script = engine_for(index, unsure(*UNSURE), sure(*SURE))
    response = engine.query("q")
    assert str(response) == "Paris is the capital."
    info = response.metadata["logtoku"]
    assert (info["action"], info["attempts"]) == ("pass", 2)
    assert info["reason"] == "after retrieval: no rule fired"
    log = info["attempt_log"]
    assert [a["action"] for a in log] == ["retrieve", "pass"]
    assert [len(a["source_node_ids"]) for a in log] == [2, 6]  # top-k 2, then 2 + policy.retrieve.passages (4)
    assert set(log[0]["source_node_ids"]) < set(log[1]["source_node_ids"])
    assert len(response.source_nodes) == 6  # the nodes of the final attempt
    assert len(script.prompts) == 2 and script.prompts[1].count("capital of") > script.prompts[0].count("capital of")
    assert [(e.action, e.final, e.attempt) for e in decisions] == [("retrieve", False, 1), ("pass", True, 2)]
    tags = decisions[0].tags
    assert tags == {
        "logtoku.action": "retrieve",
        "logtoku.reason": "reliability -0.2513 < -0.1",
        "logtoku.rule": "low-reliability",
        "logtoku.reliability": tags["logtoku.reliability"],
        "logtoku.attempts": 1,
        "logtoku.route": ["retrieve"],
        "logtoku.rules": ["low-reliability"],
    }
    assert decisions[1].tags["logtoku.action"] == "pass" and decisions[1].tags["logtoku.route"] == ["retrieve", "pass"]
    # the spans opened to act on each decision carry its action
    assert [t["logtoku.action"] for t in tagged(spans, "_retry")] == ["retrieve"]
    assert [t["logtoku.action"] for t in tagged(spans, "_apply")] == ["pass"]
    retriever_tags = [tags for id_, tags in spans if id_.startswith("VectorIndexRetriever.retrieve-")]
    assert [t.get("logtoku.action") for t in retriever_tags] == [None, "retrieve"]  # the re-query ran under the tag
    assert engine.query_engine.retriever.similarity_top_k == 2  # the caller's retriever is not changed


def test_retrieve_falls_back_when_still_uncertain(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    rules = policy(low("retrieve"), retrieve={"max_attempts": 2, "fallback": "abstain"})
    engine, script = engine_for(index, unsure(*UNSURE), policy=rules)
    response = engine.query("q")
    assert str(response) == "I don't know."
    info = response.metadata["logtoku"]
    assert info["action"] == "abstain" and info["attempts"] == 3
    assert info["reason"].startswith("still uncertain after 2 retrieval attempt(s): reliability")
    assert [len(a["source_node_ids"]) for a in info["attempt_log"]] == [2, 6, 8]  # + 4 per attempt, capped by the corpus
    assert [(e.action, e.final) for e in decisions] == [("retrieve", False), ("retrieve", False), ("abstain", True)]
    assert len(script.prompts) == 3


def test_a_requery_without_new_context_falls_back_at_once(index: Any) -> None:
    rules = policy(low("retrieve"), retrieve={"max_attempts": 3, "fallback": "warn"})
    engine, script = engine_for(index, unsure(*UNSURE), top_k=8, policy=rules)  # the first query already sees all 8 nodes
    response = engine.query("q")
    info = response.metadata["logtoku"]
    assert info["action"] == "warn" and info["reason"].endswith("; the re-query found no new context")
    assert info["attempt_log"][0]["retrieval_error"] == "the re-query found no new context"
    assert len(script.prompts) == 1  # no second generation


def test_explicit_retry_engines_and_no_retry(index: Any) -> None:
    backend, _ = scripted(unsure(*UNSURE), sure(*SURE))
    llm = LogTokULLM(backend=backend)
    wide = index.as_query_engine(llm=llm, similarity_top_k=5)
    engine = LogTokUQueryEngine(
        index.as_query_engine(llm=llm, similarity_top_k=1), llm=llm, policy=policy(low("retrieve")), retry_query_engines=[wide]
    )
    assert engine.retry_query_engines == [wide]
    info = engine.query("q").metadata["logtoku"]
    assert [len(a["source_node_ids"]) for a in info["attempt_log"]] == [1, 5]

    backend, _ = scripted(unsure(*UNSURE))
    llm = LogTokULLM(backend=backend)
    engine = LogTokUQueryEngine(index.as_query_engine(llm=llm), llm=llm, policy=policy(low("retrieve")), retry_query_engines=[])
    info = engine.query("q").metadata["logtoku"]
    assert info["action"] == "abstain" and "no re-query engine" in info["reason"]


def test_human_review_queues_the_answer_and_records_it(index: Any, tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "audit.db")
    engine, _ = engine_for(index, unsure(*UNSURE), sure(*SURE), policy=policy(low("human_review")), store=store)
    response = engine.query("Who founded Zarnovia?")
    info = response.metadata["logtoku"]
    assert info["action"] == "human_review" and isinstance(info["review_id"], int)
    assert str(response) == f"This answer is waiting for review by a person (review id {info['review_id']})."
    [item] = store.pending()
    assert item.id == info["review_id"]
    record = store.get(info["trace_id"])
    assert (record.prompt, record.action, record.rule, record.policy_version) == (
        "Who founded Zarnovia?",
        "human_review",
        "low-reliability",
        "7",
    )
    assert [t["token"] for t in record.tokens] == list(UNSURE)

    engine.query("Capital of France?")  # a passing answer is recorded too
    assert store.count() == 2
    store.close()


def test_raise_action_raises_with_the_result(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), policy=policy(low("raise")))
    with pytest.raises(GuardRejectedError, match="low-reliability") as info:
        engine.query("q")
    assert info.value.result.action == "raise" and info.value.result.answer == "Maybe Lyon?"
    assert [e.action for e in decisions] == ["raise"]


def test_quantile_policy_uses_the_profile(index: Any) -> None:
    backend, _ = scripted(unsure(*UNSURE), sure(*SURE), unsure(*UNSURE))
    profile = build_profile([backend.generate("a"), backend.generate("b")], "test")  # reliabilities -0.25 and 0
    llm = LogTokULLM(backend=backend)
    quantile_rule = {"name": "q", "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.5}}, "action": "abstain"}
    engine = LogTokUQueryEngine.from_index(index, llm=llm, policy=policy(quantile_rule), profile=profile)
    info = engine.query("q").metadata["logtoku"]
    assert info["action"] == "abstain"
    assert info["checks"][0]["quantile"] == 0.5
    assert info["tokens"][0]["quadrant"] in ("I", "II", "III", "IV")  # quadrants come from the profile


def test_no_context_falls_back_without_calling_the_llm() -> None:
    backend, script = scripted(sure(*SURE))
    llm = LogTokULLM(backend=backend)
    empty = VectorStoreIndex.from_documents([], embed_model=MockEmbedding(embed_dim=8))  # its retriever finds nothing
    engine = LogTokUQueryEngine.from_index(empty, llm=llm, policy=policy())
    response = engine.query("q")
    assert str(response) == "I don't know."
    assert response.metadata["logtoku"]["reason"] == "the retriever found no context to answer from"
    assert script.prompts == []


# -- configuration errors --------------------------------------------------------------------
def test_configuration_errors(index: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    backend, _ = scripted(sure(*SURE))
    llm = LogTokULLM(backend=backend)
    monkeypatch.setattr(Settings, "_llm", MockLLM())
    with pytest.raises(ConfigurationError, match=r"needs a LogTokULLM .* got MockLLM"):
        LogTokUQueryEngine(index.as_query_engine(llm=llm))
    with pytest.raises(ConfigurationError, match="not both or neither"):
        LogTokUQueryEngine(llm=llm)

    class Plain(CustomQueryEngine):
        def custom_query(self, query_str: str) -> str:
            return "x"

    with pytest.raises(ConfigurationError, match="has no retrieve\\(\\)/synthesize\\(\\)"):
        LogTokUQueryEngine(Plain(), llm=llm)
    with pytest.raises(ConfigurationError, match="stream_mode must be 'live' or 'after_decision', got 'later'"):
        LogTokUQueryEngine(index.as_query_engine(llm=llm), llm=llm, stream_mode="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="uses quantile thresholds, which need the model's profile"):
        LogTokUQueryEngine(index.as_query_engine(llm=llm), llm=llm)  # default policy, no saved profile for "scripted"
    with pytest.raises(ConfigurationError, match="human review, which needs store"):
        LogTokUQueryEngine(index.as_query_engine(llm=llm), llm=llm, policy=policy(low("human_review")))


def test_an_engine_with_another_llm_is_detected(index: Any) -> None:
    backend, _ = scripted(sure(*SURE))
    llm = LogTokULLM(backend=backend)
    engine = LogTokUQueryEngine(index.as_query_engine(llm=MockLLM()), llm=llm, policy=policy())
    with pytest.raises(LogTokUError, match="answered without a LogTokU generation"):
        engine.query("q")


def test_prompts_are_reachable_through_the_wrapper(index: Any) -> None:
    engine, _ = engine_for(index, sure(*SURE))
    assert any(key.endswith("text_qa_template") for key in engine.get_prompts())


# -- streaming -------------------------------------------------------------------------------
def test_live_streaming_passes_tokens_through(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine, _ = engine_for(index, sure(*SURE), streaming=True)
    response = engine.query("q")
    assert isinstance(response, StreamingResponse)
    assert decisions == []  # nothing decided before the stream is read
    pieces = list(response.response_gen)
    assert pieces == list(SURE)
    assert response.metadata["logtoku"]["action"] == "pass"
    assert [e.action for e in decisions] == ["pass"]
    assert len(response.source_nodes) == 2


def test_live_streaming_of_an_uncertain_answer_goes_on_with_the_change(index: Any) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), sure(*SURE), streaming=True)
    response = engine.query("q")
    text = "".join(response.response_gen)
    assert text == "Maybe Lyon?\n\nParis is the capital."
    assert response.metadata["logtoku"]["answer"] == "Paris is the capital."
    assert len(response.source_nodes) == 6

    engine, _ = engine_for(index, unsure(*UNSURE), streaming=True, policy=policy(low("abstain")))
    response = engine.query("q")
    assert "".join(response.response_gen) == "Maybe Lyon?\n\nI don't know."

    engine, _ = engine_for(index, unsure(*UNSURE), streaming=True, policy=policy(low("warn")))
    response = engine.query("q")
    assert list(response.response_gen)[-1] == "\n\nNote: the model was unsure about parts of this answer; please verify it."


def test_early_stop_rule_cuts_the_stream_short(index: Any) -> None:
    early = {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.4}, "action": "abstain", "early_stop": True}
    long_unsure = unsure(*(f" w{i}" for i in range(20)))
    engine, _ = engine_for(index, long_unsure, streaming=True, policy=policy(early))
    response = engine.query("q")
    pieces = list(response.response_gen)
    info = response.metadata["logtoku"]
    assert info["stopped_early"] is True and info["action"] == "abstain"
    result = response.metadata["logtoku_result"]
    assert result.generation.finish_reason == "cancelled"
    assert len(result.generation.tokens) < 20
    assert pieces[-2:] == ["\n\n", "I don't know."]


def test_after_decision_streaming_sends_only_the_final_answer(index: Any) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), sure(*SURE), streaming=True, stream_mode="after_decision")
    response = engine.query("q")
    assert isinstance(response, StreamingResponse)
    assert response.metadata["logtoku"]["action"] == "pass"  # decided before anything is streamed
    assert list(response.response_gen) == ["Paris is the capital."]


# -- async -----------------------------------------------------------------------------------
def test_async_query_and_async_streaming(index: Any, decisions: list[LogTokUDecisionEvent]) -> None:
    engine, _ = engine_for(index, unsure(*UNSURE), sure(*SURE))
    response = asyncio.run(engine.aquery("q"))
    assert str(response) == "Paris is the capital."
    assert response.metadata["logtoku"]["attempts"] == 2

    engine, _ = engine_for(index, unsure(*UNSURE), sure(*SURE), streaming=True)

    async def stream() -> tuple[Any, list[str]]:
        response = await engine.aquery("q")
        return response, [piece async for piece in response.async_response_gen()]

    response, pieces = asyncio.run(stream())
    assert isinstance(response, AsyncStreamingResponse)
    assert "".join(pieces) == "Maybe Lyon?\n\nParis is the capital."
    assert response.metadata["logtoku"]["answer"] == "Paris is the capital."
    assert [(e.action, e.final) for e in decisions] == [("retrieve", False), ("pass", True)] * 2


# -- every answer, the first included, is the core driver's Generate request ------------------------
class Outstanding:
    """The Generate request of the core guard loop outstanding at each moment (the loop the driver
    runs, wrapped for the test): an LLM call made outside the driver sees None."""

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


@pytest.mark.parametrize("path", ["query", "aquery", "live", "async live", "after_decision"])
def test_every_answer_is_synthesised_at_the_drivers_generate_request(
    index: Any, monkeypatch: pytest.MonkeyPatch, spans: Any, path: str
) -> None:
    """The first answer too: each LLM call is made while the driver's Generate request of its attempt is
    outstanding (the engine only retrieves its first context before the loop); the re-queried answer
    is synthesised under the tags of the decision that asked for it."""
    outstanding = Outstanding(monkeypatch)
    at_call: list[int | None] = []
    _, script = scripted(unsure(*UNSURE), sure(*SURE))

    def recorded(messages: Any) -> Any:
        at_call.append(outstanding.pending)
        return script(messages)

    backend = ScriptedBackend(recorded)
    streaming, mode = path != "query" and path != "aquery", "after_decision" if path == "after_decision" else "live"
    engine = LogTokUQueryEngine.from_index(
        index, llm=LogTokULLM(backend=backend), streaming=streaming, stream_mode=mode, policy=policy(low("retrieve"))
    )
    if path in ("query", "after_decision"):
        response: Any = engine.query("q")
        text = "".join(response.response_gen) if streaming else str(response)
    elif path == "live":
        response = engine.query("q")
        text = "".join(response.response_gen).rsplit("\n\n", 1)[-1]
    else:

        async def read() -> tuple[Any, str]:
            response = await engine.aquery("q")
            if not streaming:
                return response, str(response)
            assert isinstance(response, AsyncStreamingResponse)
            return response, "".join([piece async for piece in response.async_response_gen()]).rsplit("\n\n", 1)[-1]

        response, text = asyncio.run(read())
    assert text == "Paris is the capital." and response.metadata["logtoku"]["attempts"] == 2
    assert at_call == [1, 2] and outstanding.asked == [1, 2] and len(script.prompts) == 2
    synthesised = [tags for id_, tags in spans if id_.split(".")[-1].startswith(("synthesize-", "asynthesize-"))]
    assert [t.get("logtoku.action") for t in synthesised] == [None, "retrieve"]
