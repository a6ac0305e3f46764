"""The guard end to end on scripted logits: every route, retrieval fallbacks, streaming, records."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from logtoku_guard import ConfigurationError, GuardRejectedError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.calibration import build_profile
from logtoku_guard.decision.policy import DEFAULT_FLAG_QUANTILE, Policy, default_policy
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.keyword_retriever import KeywordRetriever
from logtoku_guard.types import ChatMessage

SURE = ScriptedAnswer(["Paris", "."], [[30.0, 5.0], [25.0, 2.0]])  # EU ~ 0.06-0.07
SHAKY = ScriptedAnswer(["Maybe", " X"], [[4.0, 3.0], [3.0, 2.0]])  # EU ~ 0.22-0.29
LOST = ScriptedAnswer(["Zorg", " Q", " Z"], [[0.6, 0.5], [0.5, 0.4], [0.4, 0.1]])  # EU ~ 0.6-0.8


def policy(**extra: Any) -> Policy:
    return Policy.from_dict(
        {
            "name": "test",
            "version": "7",
            "rules": [
                {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": extra.pop("lost", "retrieve")},
                {"name": "shaky", "when": {"stat": "max_eu", "op": ">", "value": 0.2}, "action": "warn"},
            ],
            **extra,
        }
    )


def by_question(messages: list[ChatMessage]) -> ScriptedAnswer:
    text = messages[-1].content
    if "Context" in text and "Paris" in text:
        return SURE
    if "France" in text:
        return SURE
    if "Italy" in text:
        return SHAKY
    return LOST


def test_pass_warn_and_abstain_without_retriever() -> None:
    guard = Guard(ScriptedBackend(by_question), policy())
    r = guard.run("What is the capital of France?")
    assert (r.answer, r.action, r.decision.rule, len(r.attempts)) == ("Paris.", "pass", None, 1)
    r = guard.run("What is the capital of Italy?")
    assert r.action == "warn" and r.answer.startswith("Maybe X\n\n") and "verify" in r.answer
    r = guard.run("Who founded the Zarnovian Institute?")
    assert r.action == "abstain" and r.answer == "I don't know."
    assert "no retriever configured" in r.decision.reason and r.attempts[0].retrieval_error == "no retriever configured"
    assert r.decision.checks[0].observed > 0.5 and r.policy_version == "7"


def test_retrieve_then_pass_with_the_context_in_the_prompt() -> None:
    backend = ScriptedBackend(by_question)
    retriever = KeywordRetriever(["Paris is the capital of France.", "The Zarnovian Institute was founded by Paris."])
    guard = Guard(backend, policy(), retriever=retriever)
    r = guard.run("Who founded the Zarnovian Institute?")
    assert r.action == "pass" and r.answer == "Paris." and len(r.attempts) == 2
    assert r.attempts[0].decision.action == "retrieve" and r.attempts[1].passages[0].startswith("The Zarnovian")
    assert r.decision.reason.startswith("after retrieval")
    sent = backend.calls[-1][-1].content
    assert "Context:" in sent and "The Zarnovian Institute was founded by Paris." in sent and "Question: Who founded" in sent


def test_retrieval_that_stays_uncertain_falls_through_after_max_attempts() -> None:
    backend = ScriptedBackend(lambda m: LOST)
    guard = Guard(backend, policy(retrieve={"max_attempts": 2, "fallback": "warn"}), retriever=lambda q: ["irrelevant"])
    r = guard.run("Who?")
    assert r.action == "warn" and len(r.attempts) == 3 and len(backend.calls) == 3
    assert "still uncertain after 2 retrieval attempt(s)" in r.decision.reason


def test_retriever_errors_and_empty_results_are_recorded_not_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    def broken(q: str) -> list[str]:
        raise TimeoutError("vector store down")

    r = Guard(ScriptedBackend(by_question), policy(), retriever=broken).run("Who?")
    assert r.action == "abstain" and "the retriever failed: TimeoutError: vector store down" in r.decision.reason
    assert "vector store down" in caplog.text
    r = Guard(ScriptedBackend(by_question), policy(), retriever=lambda q: []).run("Who?")
    assert r.action == "abstain" and "the retriever returned nothing" in r.decision.reason


def test_raise_action_carries_the_result() -> None:
    guard = Guard(ScriptedBackend(by_question), policy(lost="raise"))
    with pytest.raises(GuardRejectedError, match="rule 'lost'") as info:
        guard.run("Who?")
    assert info.value.result.action == "raise" and info.value.result.generation.text == "Zorg Q Z"


def test_async_run() -> None:
    guard = Guard(ScriptedBackend(by_question), policy())
    r = asyncio.run(guard.arun("What is the capital of France?"))
    assert r.action == "pass"


def test_stream_stops_early_when_a_monotone_rule_fires() -> None:
    long_lost = ScriptedAnswer(["a"] * 3 + ["b"] * 20, [[30.0, 1.0]] * 3 + [[0.5, 0.2]] * 20)
    backend = ScriptedBackend(lambda m: long_lost)
    early = Policy.from_dict(
        {
            "name": "e",
            "rules": [
                {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "abstain", "early_stop": True}
            ],
        }
    )
    stream = Guard(backend, early).stream("Who?")
    tokens = list(stream)
    assert len(tokens) == 4  # stopped on the first token with EU > 0.5
    assert stream.result.stopped_early and stream.result.action == "abstain"
    assert stream.result.generation.finish_reason == "cancelled"
    # Without early_stop the whole answer is generated and then judged.
    late = Guard(backend, policy(lost="abstain")).stream("Who?")
    assert len(list(late)) == 23 and not late.result.stopped_early and late.result.action == "abstain"


def test_configuration_errors() -> None:
    backend = ScriptedBackend(by_question, model_name="m")
    with pytest.raises(ConfigurationError, match="quantile thresholds"):
        Guard(backend, default_policy())
    with pytest.raises(ConfigurationError, match="store=AuditStore"):
        Guard(backend, policy(lost="human_review"))
    other = build_profile([ScriptedBackend([SURE], model_name="other").generate("q")], "t")
    with pytest.raises(ConfigurationError, match="model='other'"):
        Guard(backend, default_policy(), profile=other)


def test_default_policy_routes_by_the_models_own_distribution() -> None:
    # A profile where SURE-like answers are typical and LOST-like ones are in the bottom 10%.
    answers = [SURE] * 18 + [SHAKY] * 2
    profile = build_profile([ScriptedBackend([a], model_name="m").generate("q") for a in answers], "t")
    guard = Guard(ScriptedBackend(by_question, model_name="m"), default_policy(), profile=profile)
    assert guard.run("What is the capital of France?").action == "pass"
    r = guard.run("Who founded the Zarnovian Institute?")
    assert r.action == "abstain" and r.decision.rule == "low-guard-score"
    assert (r.decision.checks[0].stat, r.decision.checks[0].quantile) == ("reliability", DEFAULT_FLAG_QUANTILE)  # fallback


def test_every_decision_is_recorded_and_review_items_are_queued(tmp_path: Path) -> None:
    from logtoku_guard.audit import AuditStore

    store = AuditStore(tmp_path / "audit.db")
    guard = Guard(ScriptedBackend(by_question), policy(lost="human_review"), store=store)
    passed = guard.run("What is the capital of France?")
    queued = guard.run("Who founded the Zarnovian Institute?")
    assert queued.action == "human_review" and queued.review_id is not None
    assert f"review id {queued.review_id}" in queued.answer
    assert store.count() == 2
    rec = store.get(queued.trace_id)
    assert (rec.action, rec.rule, rec.policy_name, rec.policy_version, rec.answer) == (
        "human_review",
        "lost",
        "test",
        "7",
        "Zorg Q Z",
    )
    assert [t["token"] for t in rec.tokens] == ["Zorg", " Q", " Z"] and rec.stats["max_eu"] > 0.5
    assert store.get(passed.trace_id).action == "pass"
    pending = store.pending()
    assert [i.id for i in pending] == [queued.review_id] and pending[0].record.prompt == "Who founded the Zarnovian Institute?"
    item = store.approve(queued.review_id, "alice", edited_answer="Nobody knows.")
    assert item.status == "approved" and item.reviewer == "alice" and store.pending() == []
    store.close()


def test_any_record_sink_takes_the_decisions_without_sqlalchemy() -> None:
    """A store is anything with RecordSink's two methods: here a list in memory."""
    import subprocess
    import sys

    from logtoku_guard.audit.records import AuditRecord, ReviewItem

    class ListSink:
        def __init__(self) -> None:
            self.records: list[AuditRecord] = []
            self.queued: list[ReviewItem] = []

        def record(self, rec: AuditRecord) -> str:
            self.records.append(rec)
            return rec.trace_id

        def record_for_review(self, rec: AuditRecord) -> ReviewItem:
            self.records.append(rec)
            item = ReviewItem(
                id=len(self.queued) + 1,
                trace_id=rec.trace_id,
                status="pending",
                created_at=rec.created_at,
                claimed_by=None,
                claimed_at=None,
                reviewer=None,
                decided_at=None,
                edited_answer=None,
                note=None,
                record=rec,
            )
            self.queued.append(item)
            return item

    sink = ListSink()
    guard = Guard(ScriptedBackend(by_question), policy(lost="human_review"), store=sink)
    passed = guard.run("What is the capital of France?")
    queued = guard.run("Who founded the Zarnovian Institute?")
    assert [r.trace_id for r in sink.records] == [passed.trace_id, queued.trace_id]
    assert [r.action for r in sink.records] == ["pass", "human_review"]
    assert queued.review_id == 1 and "review id 1" in queued.answer
    code = "import logtoku_guard.audit.records, sys; print('sqlalchemy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_guard_loop_driven_by_hand_counts_retrievals_once() -> None:
    from logtoku_guard.errors import UsageError
    from logtoku_guard.guard.guard_steps import Answer, Conclude, Generate, Progress, Retrieve, Retrieved, guard_steps

    unsure = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"}],
            "retrieve": {"max_attempts": 1, "fallback": "warn"},
        }
    )
    guard = Guard(ScriptedBackend([unsure, unsure]), policy)
    decider = guard.decider
    g = guard.backend.generate("q")
    progress = Progress("q")
    steps = guard_steps(decider, progress)
    assert next(steps) == Generate(1, "q")
    retrieve = steps.send(Answer(g))
    assert isinstance(retrieve, Retrieve) and retrieve.number == 1 and retrieve.decision.action == "retrieve"
    again = steps.send(Retrieved(("ctx",)))
    assert isinstance(again, Generate) and again.attempt == 2 and again.passages == ("ctx",)
    assert "Question: q" in again.prompt() and "ctx" in again.prompt()
    done = steps.send(Answer(g, ("ctx",)))
    assert isinstance(done, Conclude) and done.result.action == "warn"
    assert done.result.decision.reason.startswith("still uncertain after 1 retrieval attempt(s): ")
    assert [a.passages for a in progress.attempts] == [(), ("ctx",)]
    second = progress.attempts[1]
    assert second.decision.action == "retrieve" and not second.decision.reason.startswith("after retrieval")
    assert decider.give_up(second.decision, "nothing").reason.endswith("; nothing")
    assert decider.early_stop(g.tokens) is None  # no early_stop rule
    with pytest.raises(UsageError):
        decider.settle([])
    with pytest.raises(UsageError, match="no augmented prompt"):
        Generate(1, "q").prompt()
    wrong = guard_steps(decider, Progress("q"))
    next(wrong)
    with pytest.raises(UsageError, match="first answer must be a generation"):
        wrong.send(Answer(None))
    with pytest.raises(UsageError, match="not finished"):
        _ = guard.stream("q").result


def test_a_retrieval_that_brings_nothing_falls_back_with_its_reason_on_the_attempt() -> None:
    from logtoku_guard.guard.guard_steps import Answer, Conclude, Progress, Retrieve, Retrieved, guard_steps

    unsure = ScriptedAnswer(["Maybe", " Bob", "?"], [[1.0, 0.9], [0.5, 0.45], [0.6, 0.5]])
    policy = Policy.from_dict(
        {
            "name": "p",
            "rules": [{"name": "unsure", "when": {"stat": "reliability", "op": "<", "value": -0.2}, "action": "retrieve"}],
        }
    )
    guard = Guard(ScriptedBackend([unsure]), policy)
    progress = Progress("q")
    steps = guard_steps(guard.decider, progress)
    next(steps)
    assert isinstance(steps.send(Answer(guard.backend.generate("q"))), Retrieve)
    done = steps.send(Retrieved(why="the retriever returned nothing"))
    assert isinstance(done, Conclude) and done.result.action == "abstain"
    assert done.result.decision.reason.endswith("; the retriever returned nothing")
    assert progress.attempts[-1].retrieval_error == "the retriever returned nothing"
    timings = done.result.timings
    assert timings.total_s >= timings.generation_s + timings.retrieval_s + timings.decision_s >= 0
