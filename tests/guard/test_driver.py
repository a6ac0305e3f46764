"""The one driver: its sync and async loops answer the same requests in the same spans, to the same result.

Every scenario (pass, warn, retrieve then pass, a retrieval that falls back, an ``early_stop`` rule,
second looks; drafts held or the first one streamed; a live stream closed after its first token)
runs through :class:`~logtoku_guard.guard.driver.Driver` in both colours with the same scripted
backend; the requests the I/O was asked, the pieces streamed, the spans and the results must match.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any

import pytest
from test_guard import LOST, SURE, by_question, policy

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from logtoku_guard import ScriptedAnswer, ScriptedBackend
from logtoku_guard.decision.decider import Decider
from logtoku_guard.decision.policy import Policy
from logtoku_guard.decision.results import GuardResult
from logtoku_guard.errors import UsageError
from logtoku_guard.guard.driver import Driver, Live, Watch, drive
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.guard_io import BackendIO
from logtoku_guard.guard.guard_steps import Answer, Generate, Measure, Measured, Retrieve, Retrieved
from logtoku_guard.guard.keyword_retriever import KeywordRetriever
from logtoku_guard.guard.telemetry import GuardTelemetry
from logtoku_guard.types import Generation, TokenScore, question_of, to_messages

DOCS = ["Paris is the capital of France.", "The Zarnovian Institute was founded by Paris."]


class Logged:
    """A sync I/O over ``io`` that logs what it was asked."""

    def __init__(self, io: BackendIO) -> None:
        self.io, self.log = io, list[tuple[Any, ...]]()

    def generate(self, request: Generate, watch: Watch) -> Answer:
        self.log.append(("generate", request.attempt, watch.watching))
        return self.io.generate(request, watch)

    def retrieve(self, request: Retrieve) -> Retrieved:
        self.log.append(("retrieve", request.number))
        return self.io.retrieve(request)

    def measure(self, request: Measure) -> Measured:
        self.log.append(("measure", request.looks))
        return self.io.measure(request)

    def draft(self, request: Generate, watch: Watch) -> Any:
        self.log.append(("draft", request.attempt, watch.watching))
        return self.io.draft(request, watch)


class AsyncDraft:
    """A sync draft read by ``async for``."""

    def __init__(self, draft: Any) -> None:
        self.draft, self.pieces = draft, iter(())

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._pieces()

    async def _pieces(self) -> AsyncGenerator[Any, None]:
        self.pieces = iter(self.draft)
        piece: Any
        for piece in self.pieces:
            yield piece

    async def aclose(self) -> None:
        close = getattr(self.pieces, "close", None)
        if close is not None:
            close()
        self.draft.close()

    def answer(self) -> Answer:
        return self.draft.answer()


class AsyncLogged(Logged):
    """:class:`Logged` in the async colour."""

    async def generate(self, request: Generate, watch: Watch) -> Answer:  # type: ignore[override]
        return Logged.generate(self, request, watch)

    async def retrieve(self, request: Retrieve) -> Retrieved:  # type: ignore[override]
        return Logged.retrieve(self, request)

    async def measure(self, request: Measure) -> Measured:  # type: ignore[override]
        return Logged.measure(self, request)

    def draft(self, request: Generate, watch: Watch) -> AsyncDraft:
        return AsyncDraft(Logged.draft(self, request, watch))


def summary(result: GuardResult | None) -> tuple[Any, ...]:
    if result is None:
        return (None,)
    attempts = [(a.decision.action, a.decision.rule, a.passages, a.retrieval_error) for a in result.attempts]
    looks = [(m.look, m.values) for m in result.second_looks]
    return (result.action, result.answer, result.decision.rule, result.decision.reason, result.stopped_early, attempts, looks)


def spans(exporter: InMemorySpanExporter) -> list[tuple[Any, ...]]:
    """Each finished span's name and its logtoku.* attributes and events, in start order (ids and times left out)."""
    found = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    out = []
    for s in found:
        attributes = {k: v for k, v in (s.attributes or {}).items() if k.startswith(("logtoku.", "gen_ai.usage"))}
        attributes = {k: v for k, v in attributes.items() if not k.endswith((".seconds", "_s")) and k != "logtoku.trace_id"}
        events = [(e.name, dict(e.attributes or {})) for e in s.events]
        out.append((s.name, sorted(attributes.items()), s.status.status_code, events))
    exporter.clear()
    return out


def cascade() -> Policy:
    return Policy.from_dict(
        {
            "name": "looks",
            "rules": [
                {
                    "name": "unstable",
                    "when": {
                        "all": [
                            {"stat": "max_eu", "op": ">", "value": 0.5},
                            {"stat": "sampling_agreement", "op": "<", "value": 2},
                        ]
                    },
                    "action": "abstain",
                }
            ],
            "second_look": {"sampling": {"n": 2, "temperature": 0.7}},
        }
    )


EARLY = {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "abstain", "early_stop": True}
SCENARIOS: dict[str, tuple[Any, Any, str]] = {
    "pass": (policy(), None, "What is the capital of France?"),
    "warn": (policy(), None, "What is the capital of Italy?"),
    "retrieve then pass": (policy(), KeywordRetriever(DOCS), "Who founded the Zarnovian Institute?"),
    "retrieval falls back": (policy(retrieve={"max_attempts": 2, "fallback": "warn"}), lambda q: ["irrelevant"], "Who?"),
    "early stop": (Policy.from_dict({"name": "early", "rules": [EARLY]}), None, "Who?"),
    "second looks": (cascade(), None, "Who?"),
}


def scripted(messages: Any) -> ScriptedAnswer:
    if "Who?" in messages[-1].content:  # long and lost: an early_stop rule cuts it short
        return ScriptedAnswer([f" w{i}" for i in range(8)], [[0.6, 0.5]] * 8)
    return by_question(messages)


def run(guard: Guard, question: str, live: Live, colour: str, close_after: int | None = None) -> tuple[Any, ...]:
    """Drive ``question`` through ``guard``'s driver in ``colour``: what the I/O was asked, the pieces, the result."""
    call = guard.call()
    messages = to_messages(question)
    span = call.telemetry.start_run(call, messages)
    driver = call.driver(span, messages)
    io = BackendIO.of(call, messages)
    pieces: list[str] = []
    if colour == "sync":
        logged = Logged(io)
        if live == "held":
            driver.drive(question_of(messages), logged)
        else:
            stream: Generator[TokenScore, None, GuardResult] = driver.drive_live(question_of(messages), logged, live)
            for token in stream:
                pieces.append(token.text)
                if len(pieces) == close_after:
                    stream.close()
                    break
    else:
        logged = AsyncLogged(io)

        async def main() -> None:
            if live == "held":
                await driver.adrive(question_of(messages), logged)
                return
            stream: AsyncGenerator[TokenScore, None] = driver.adrive_live(question_of(messages), logged, live)
            async for token in stream:
                pieces.append(token.text)
                if len(pieces) == close_after:
                    await stream.aclose()
                    break

        asyncio.run(main())
    span.end()
    return logged.log, pieces, summary(driver.result)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter) -> GuardTelemetry:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return GuardTelemetry(provider)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("live", ["held", "first"])
def test_the_sync_and_async_loops_ask_the_same_in_the_same_spans_to_the_same_result(
    scenario: str, live: Live, telemetry: GuardTelemetry, exporter: InMemorySpanExporter
) -> None:
    rules, retriever, question = SCENARIOS[scenario]
    guard = Guard(ScriptedBackend(scripted), rules, retriever=retriever, telemetry=telemetry)
    sync, sync_spans = run(guard, question, live, "sync"), spans(exporter)
    async_, async_spans = run(guard, question, live, "async"), spans(exporter)
    assert sync == async_ and sync_spans == async_spans
    log, pieces, result = sync
    asked = [entry[0] for entry in log]
    assert asked[0] == ("draft" if live == "first" else "generate")  # the first answer is the driver's request
    assert (len(pieces) > 0) == (live == "first") and result[0] is not None
    expected = {
        "pass": "pass",
        "warn": "warn",
        "retrieve then pass": "pass",
        "retrieval falls back": "warn",
        "early stop": "abstain",
        "second looks": "abstain",
    }
    assert result[0] == expected[scenario]
    if scenario == "early stop":
        assert result[4] is True and len(pieces) == (1 if live == "first" else 0)  # cut short at its first token
    if scenario == "second looks":
        assert ("measure", ("sampling",)) in log and [s[0] for s in sync_spans].count("second_look") == 1
    if scenario == "retrieve then pass":
        assert [s[0] for s in sync_spans] == ["apply_guardrail logtoku", "chat scripted", "retrieve", "chat scripted"]


def test_a_live_stream_closed_early_is_abandoned_alike_in_both_colours(
    telemetry: GuardTelemetry, exporter: InMemorySpanExporter
) -> None:
    guard = Guard(ScriptedBackend(scripted), policy(), retriever=KeywordRetriever(DOCS), telemetry=telemetry)
    sync = run(guard, "Who founded the Zarnovian Institute?", "first", "sync", close_after=1)
    sync_spans = spans(exporter)
    async_ = run(guard, "Who founded the Zarnovian Institute?", "first", "async", close_after=1)
    assert sync == async_ and sync_spans == spans(exporter)
    log, pieces, result = sync
    assert log == [("draft", 1, False)] and pieces == ["Zorg"]  # nothing retrieved after the close
    assert result[0] == "abstain" and "stream closed by the caller" in result[3]


def test_a_decider_picked_by_the_first_answer() -> None:
    """A model known only by its answers: the first answer (not watched) picks the decider, once."""
    picked: list[Generation] = []
    early = Policy.from_dict({"name": "early", "rules": [EARLY]})

    def pick(generation: Generation) -> Decider:
        picked.append(generation)
        return Decider(early)

    backend = ScriptedBackend(scripted)
    messages = to_messages("Who?")
    io = Logged(BackendIO(backend, messages, early.retrieve))
    result = Driver(pick).drive("Who?", io)
    assert [g.model for g in picked] == ["scripted"] and io.log == [("generate", 1, False)]
    assert result.action == "abstain" and result.stopped_early is False and len(result.generation.tokens) == 8
    # a decider given up front watches the first answer: the same rule stops it at once
    watched = drive(Decider(early), "Who?", BackendIO(backend, messages, early.retrieve))
    assert watched.stopped_early is True and len(watched.generation.tokens) < 8

    # a picked decider whose policy reads second looks is refused before its first decision, as a given one is
    with pytest.raises(UsageError, match="second-look statistics"):
        Driver(lambda g: Decider(cascade())).drive("Who?", _NoMeasure(backend, messages))
    with pytest.raises(UsageError, match="second-look statistics"):
        Driver(Decider(cascade())).drive("Who?", _NoMeasure(backend, messages))


class _NoMeasure:
    def __init__(self, backend: ScriptedBackend, messages: Any) -> None:
        self.io = BackendIO(backend, messages, cascade().retrieve)

    def generate(self, request: Generate, watch: Watch) -> Answer:
        return self.io.generate(request, watch)

    def retrieve(self, request: Retrieve) -> Retrieved:
        return self.io.retrieve(request)


def test_live_mode_is_checked() -> None:
    backend = ScriptedBackend([SURE, LOST])
    with pytest.raises(UsageError, match="live must be"):
        Driver(Decider(policy())).drive_live("q", BackendIO(backend, to_messages("q"), policy().retrieve), "sometimes")  # type: ignore[arg-type]
