"""The guard under bad retrievers, too-long contexts and abandoned streams: always an answer, always a record."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from logtoku_guard import ConfigurationError, ScriptedAnswer, ScriptedBackend
from logtoku_guard.audit import AuditStore
from logtoku_guard.calibration import build_profile
from logtoku_guard.decision.policy import Policy, default_policy
from logtoku_guard.errors import PromptTooLongError
from logtoku_guard.guard.guard import Guard
from logtoku_guard.types import ChatMessage

SURE = ScriptedAnswer(["Paris", "."], [[30.0, 5.0], [25.0, 2.0]])
LOST = ScriptedAnswer(["Zorg", " Q", " Z"], [[0.6, 0.5], [0.5, 0.4], [0.4, 0.1]])
EMPTY = ScriptedAnswer([], [])


def policy(**extra: Any) -> Policy:
    return Policy.from_dict(
        {
            "name": "t",
            "rules": [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "retrieve"}],
            **extra,
        }
    )


def lost_unless_context(messages: list[ChatMessage]) -> ScriptedAnswer:
    return SURE if "Context" in messages[-1].content else LOST


# -- retrieval -----------------------------------------------------------------------------
def test_a_hanging_retriever_falls_through_to_the_fallback_after_the_timeout(tmp_path: Path) -> None:
    release = threading.Event()

    def hangs(query: str) -> list[str]:
        release.wait(30)
        return ["too late"]

    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lost_unless_context), policy(retrieve={"timeout_s": 0.2}), retriever=hangs, store=store)
    try:
        r = guard.run("Who?")
    finally:
        release.set()  # let the abandoned thread end
    assert r.action == "abstain" and "the retriever did not answer within 0.2 s" in r.decision.reason
    assert r.attempts[0].retrieval_error == "the retriever did not answer within 0.2 s"
    assert store.get(r.trace_id).action == "abstain"
    store.close()


def test_a_retriever_returning_a_string_is_refused_clearly() -> None:
    guard = Guard(ScriptedBackend(lost_unless_context), policy(), retriever=lambda q: "Paris is the capital.")
    with pytest.raises(ConfigurationError, match=r"returned a str .*not a list of passages.*\[text\]"):
        guard.run("Who?")


def test_the_retriever_sees_the_callers_context_variables() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    def retriever(query: str) -> list[str]:
        seen.append(var.get())
        return ["Paris"]

    var.set("caller")
    r = Guard(ScriptedBackend(lost_unless_context), policy(), retriever=retriever).run("Who?")
    assert seen == ["caller"] and r.action == "pass"


def test_a_context_too_long_is_trimmed_passage_by_passage_and_recorded(tmp_path: Path) -> None:
    def window(messages: list[ChatMessage]) -> ScriptedAnswer:
        text = messages[-1].content
        if len(text) > 200:
            raise PromptTooLongError(len(text), 200)
        return lost_unless_context(messages)

    passages = ["short passage one", "short passage two", "x" * 300]
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(window), policy(), retriever=lambda q: passages, store=store)
    r = guard.run("Who?")
    assert r.action == "pass" and r.attempts[1].passages == ("short passage one", "short passage two")
    assert r.attempts[1].retrieval_error is not None
    assert r.attempts[1].retrieval_error.startswith("context too long for the model's window: kept 2 of 3 passage(s)")
    # nothing fits: the fallback, with the reason, and the record
    guard = Guard(ScriptedBackend(window), policy(), retriever=lambda q: ["y" * 300], store=store)
    r = guard.run("Who?")
    assert r.action == "abstain" and "context too long for the model's window" in r.decision.reason
    assert r.attempts[0].retrieval_error is not None and "context too long" in r.attempts[0].retrieval_error
    assert store.get(r.trace_id).action == "abstain" and store.count() == 2
    store.close()


def test_a_bad_review_message_fails_at_load_not_after_the_review_item_is_committed() -> None:
    from logtoku_guard.errors import PolicyError

    with pytest.raises(PolicyError, match=r"human_review\.message"):
        policy(human_review={"message": "see {ticket}"})


# -- empty answers ---------------------------------------------------------------------------
def test_an_empty_answer_is_not_passed_by_the_default_policy(tmp_path: Path) -> None:
    answers = [SURE] * 10 + [LOST]
    profile = build_profile([ScriptedBackend([a], model_name="m").generate("q") for a in answers], "t")
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lambda m: EMPTY, model_name="m"), default_policy(), profile=profile, store=store)
    r = guard.run("Anything?")
    assert r.action == "abstain" and r.decision.rule == "low-guard-score"
    assert "undefined: empty answer" in r.decision.reason and "no retriever configured" in r.decision.reason
    rec = store.get(r.trace_id)
    assert rec.action == "abstain" and "undefined: empty answer" in rec.reason
    store.close()


# -- abandoned streams ---------------------------------------------------------------------------
LONG = ScriptedAnswer(["a"] * 10, [[30.0, 1.0]] * 10)


def test_a_stream_dropped_half_way_writes_its_record(tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lambda m: LONG), policy(), store=store)
    stream = guard.stream("Tell me")
    it = iter(stream)
    assert [next(it) for _ in range(3)] and store.count() == 0
    del it, stream
    assert store.count() == 1  # at once (no reference cycle), before any garbage collection
    gc.collect()
    assert store.count() == 1
    rec = store.tail(1)[0]
    assert rec.answer == "aaa" and "stream closed by the caller before it ended (3 token(s), cancelled)" in rec.reason
    store.close()


def test_iterating_a_temporary_stream_yields_every_token_and_records_once(tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lambda m: LONG), policy(), store=store)
    assert [t.text for t in guard.stream("Tell me")] == ["a"] * 10
    gc.collect()
    assert store.count() == 1 and "stream closed" not in store.tail(1)[0].reason
    store.close()


def test_close_and_with_record_once_and_set_the_result(tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lambda m: LONG), policy(), store=store)
    with guard.stream("Tell me") as stream:
        for i, _ in enumerate(stream):
            if i == 1:
                break
    assert store.count() == 1 and stream.result.generation.finish_reason == "cancelled"
    assert stream.result.stopped_early and stream.result.answer == "aa"
    stream.close()
    del stream
    gc.collect()
    assert store.count() == 1  # closed twice, recorded once
    # a stream never iterated generated nothing and records nothing
    unused = guard.stream("Tell me")
    unused.close()
    del unused
    gc.collect()
    assert store.count() == 1
    # a stream read to the end records once, as before
    full = guard.stream("Tell me")
    assert len(list(full)) == 10 and full.result.generation.finish_reason != "cancelled"
    del full
    gc.collect()
    assert store.count() == 2
    store.close()


def test_an_abandoned_stream_that_the_policy_would_retrieve_for_records_the_fallback(tmp_path: Path) -> None:
    store = AuditStore(tmp_path / "a.db")
    guard = Guard(ScriptedBackend(lambda m: LOST), policy(), retriever=lambda q: ["Paris"], store=store)
    for _ in guard.stream("Who?"):
        break
    gc.collect()
    rec = store.tail(1)[0]
    assert rec.action == "abstain" and "no retrieval" in rec.reason and rec.attempts == 1
    store.close()


def test_a_stuck_retriever_thread_does_not_keep_the_guard_waiting() -> None:
    release = threading.Event()
    guard = Guard(
        ScriptedBackend(lost_unless_context),
        policy(retrieve={"timeout_s": 0.05, "fallback": "warn"}),
        retriever=lambda q: release.wait(30) and [],
    )
    t = time.perf_counter()
    try:
        r = guard.run("Who?")
    finally:
        release.set()
    assert r.action == "warn" and time.perf_counter() - t < 20
