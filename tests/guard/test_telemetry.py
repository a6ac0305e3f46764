"""OpenTelemetry spans of the core guard: the span tree of each route, from run, arun and stream.

Spans go to the SDK's in-memory exporter through a TracerProvider given to the guard, so the
global provider is never touched. Without OpenTelemetry nothing is imported or emitted
(checked in a subprocess that blocks the import).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_guard import by_question, policy

from logtoku_guard import GuardRejectedError, ScriptedBackend
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.keyword_retriever import KeywordRetriever
from logtoku_guard.guard.telemetry import EVALUATION_EVENT, GuardTelemetry

ROOT = Path(__file__).resolve().parents[2]
PASSAGES = ["Paris is the capital of France.", "The Zarnovian Institute was founded by Paris."]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The one GUARDRAIL span and its children in start order."""
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.attributes and s.attributes.get("openinference.span.kind") == "GUARDRAIL"]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id), key=lambda s: s.start_time or 0
    )
    assert len(children) == len([s for s in spans if s.name != "request"]) - 1  # "request": a caller's span
    return root, children


def evaluations(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == EVALUATION_EVENT]


def check_retrieve_then_pass(exporter: InMemorySpanExporter) -> None:
    root, children = tree(exporter)
    a = root.attributes or {}
    assert root.name == "apply_guardrail logtoku" and root.status.status_code == StatusCode.UNSET
    assert a["gen_ai.operation.name"] == "apply_guardrail" and a["gen_ai.request.model"] == "scripted"
    assert (a["logtoku.action"], a["logtoku.attempts"], a["logtoku.policy.name"], a["logtoku.policy.version"]) == (
        "pass",
        2,
        "test",
        "7",
    )
    assert a["logtoku.k"] == 2 and a["logtoku.reason"].startswith("after retrieval") and "logtoku.rule" not in a
    assert a["logtoku.reliability"] <= 0.0 and len(a["logtoku.trace_id"]) == 32  # reliability = -AU*EU
    assert [c.name for c in children] == ["chat scripted", "retrieve", "chat scripted"]
    first, retrieval, second = (dict(c.attributes or {}) for c in children)
    assert first["gen_ai.operation.name"] == "chat" and first["logtoku.attempt"] == 1 and second["logtoku.attempt"] == 2
    assert first["gen_ai.provider.name"] == "logtoku_guard" and first["gen_ai.usage.output_tokens"] == 3
    assert first["gen_ai.response.finish_reasons"] == ("stop",)
    assert retrieval["openinference.span.kind"] == "RETRIEVER" and retrieval["logtoku.retrieval.passages"] == 2
    events = evaluations(root)
    assert [e["gen_ai.evaluation.score.label"] for e in events] == ["retrieve", "pass"]
    assert all(e["gen_ai.evaluation.name"] == "logtoku" for e in events)
    assert events[0]["logtoku.rule"] == "lost" and events[1]["gen_ai.evaluation.score.value"] == a["logtoku.reliability"]
    assert events[0]["gen_ai.evaluation.explanation"].startswith("max_eu ")
    no_text = [
        k
        for s in (root, *children)
        for k in (s.attributes or {})
        if k in ("input.value", "output.value", "gen_ai.input.messages")
    ]
    assert no_text == []  # content is opt-in


def test_retrieve_then_pass_span_tree(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(), retriever=KeywordRetriever(PASSAGES), tracer_provider=provider)
    assert guard.run("Who founded the Zarnovian Institute?").action == "pass"
    check_retrieve_then_pass(exporter)


def test_async_run_span_tree(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(), retriever=KeywordRetriever(PASSAGES), tracer_provider=provider)
    assert asyncio.run(guard.arun("Who founded the Zarnovian Institute?")).action == "pass"
    check_retrieve_then_pass(exporter)


def test_stream_span_tree(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(), retriever=KeywordRetriever(PASSAGES), tracer_provider=provider)
    stream = guard.stream("Who founded the Zarnovian Institute?")
    assert [t.text for t in stream] == ["Zorg", " Q", " Z"]
    assert stream.result.action == "pass"
    check_retrieve_then_pass(exporter)


def test_abstain_without_retriever(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    Guard(ScriptedBackend(by_question), policy(), tracer_provider=provider).run("Who?")
    root, children = tree(exporter)
    a = root.attributes or {}
    assert (a["logtoku.action"], a["logtoku.rule"], a["logtoku.attempts"]) == ("abstain", "lost", 1)
    assert "no retriever configured" in a["logtoku.reason"] and root.status.status_code == StatusCode.UNSET
    assert [c.name for c in children] == ["chat scripted", "retrieve"]
    assert children[1].attributes["logtoku.retrieval.error"] == "no retriever configured"  # type: ignore[index]
    assert [e["gen_ai.evaluation.score.label"] for e in evaluations(root)] == ["retrieve"]


@pytest.mark.parametrize("path", ["run", "stream"])
def test_raise_sets_error_status(provider: TracerProvider, exporter: InMemorySpanExporter, path: str) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(lost="raise"), tracer_provider=provider)
    with pytest.raises(GuardRejectedError):
        if path == "run":
            guard.run("Who?")
        else:
            list(guard.stream("Who?"))
    root, children = tree(exporter)
    assert root.status.status_code == StatusCode.ERROR and root.status.description.startswith("raise: max_eu ")  # type: ignore[union-attr]
    assert (root.attributes or {})["logtoku.action"] == "raise" and [c.name for c in children] == ["chat scripted"]
    assert any(e.name == "exception" for e in root.events)
    assert [e["gen_ai.evaluation.score.label"] for e in evaluations(root)] == ["raise"]


def test_backend_error_ends_spans_with_error(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    def broken(messages: Any) -> Any:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError, match="model crashed"):
        Guard(ScriptedBackend(broken), policy(), tracer_provider=provider).run("Who?")
    root, children = tree(exporter)
    assert root.status.status_code == StatusCode.ERROR and children[0].status.status_code == StatusCode.ERROR
    assert (children[0].attributes or {})["error.type"] == "RuntimeError"


def test_content_only_when_opted_in(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    telemetry = GuardTelemetry(provider, capture_content=True)
    Guard(ScriptedBackend(by_question), policy(), telemetry=telemetry).run("What is the capital of France?")
    root, children = tree(exporter)
    assert (root.attributes or {})["input.value"] == "What is the capital of France?"
    assert (root.attributes or {})["output.value"] == "Paris."
    assert "What is the capital of France?" in (children[0].attributes or {})["gen_ai.input.messages"]  # type: ignore[operator]
    assert "Paris." in (children[0].attributes or {})["gen_ai.output.messages"]  # type: ignore[operator]


def test_spans_nest_under_the_callers_span_and_generation_is_current(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    from opentelemetry import trace

    seen: list[str] = []

    def script(messages: Any) -> Any:
        seen.append(trace.get_current_span().name)  # type: ignore[attr-defined]
        return by_question(messages)

    with provider.get_tracer("app").start_as_current_span("request") as outer:
        Guard(ScriptedBackend(script), policy(), tracer_provider=provider).run("What is the capital of France?")
    root, _ = tree(exporter)
    assert root.parent is not None and root.parent.span_id == outer.get_span_context().span_id
    assert seen == ["chat scripted"]


def test_disabled_telemetry_emits_nothing(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(), telemetry=GuardTelemetry.disabled())
    assert guard.run("Who?").action == "abstain" and not guard.telemetry.enabled
    assert exporter.get_finished_spans() == ()


@pytest.mark.slow
def test_without_opentelemetry_nothing_is_imported_or_emitted() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # as if not installed: any import of it raises ImportError
sys.path.insert(0, "tests/guard")
from logtoku_guard import ScriptedBackend
from logtoku_guard.guard.guard import Guard
from logtoku_guard.guard.telemetry import GuardTelemetry
from test_guard import by_question, policy
guard = Guard(ScriptedBackend(by_question), policy())
assert not guard.telemetry.enabled
assert guard.run("What is the capital of France?").action == "pass"
assert list(guard.stream("Who?")) and guard.run("Who?").action == "abstain"
try:
    GuardTelemetry(object())
except Exception as exc:
    print("refused:", type(exc).__name__)
print("loaded:", sorted(m for m in sys.modules if m.startswith("opentelemetry.")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "refused: ConfigurationError" in proc.stdout and "loaded: []" in proc.stdout


def test_import_logtoku_guard_does_not_import_opentelemetry() -> None:
    code = (
        "import logtoku_guard, logtoku_guard.guard.telemetry, sys; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr


def test_closed_stream_still_ends_its_spans(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    guard = Guard(ScriptedBackend(by_question), policy(), tracer_provider=provider)
    with guard.stream("Who founded the Zarnovian Institute?") as stream:
        next(iter(stream))
    root, children = tree(exporter)
    assert [c.name for c in children] == ["chat scripted"]
    assert (children[0].attributes or {})["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert (root.attributes or {})["logtoku.reason"].find("stream closed by the caller") >= 0  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_console_example_prints_what_its_docstring_says() -> None:
    """examples/otel_console.py: a passing question (one chat span, one evaluation) and an
    invented one (chat, retrieve, chat again, two evaluations), each under a GUARDRAIL span."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("opentelemetry.sdk")
    script = Path(__file__).resolve().parents[2] / "examples" / "otel_console.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    decoder, spans, text = json.JSONDecoder(), [], done.stdout
    for m in re.finditer(r"^\{", text, flags=re.M):
        spans.append(decoder.raw_decode(text[m.start() :])[0])
    names = [s["name"] for s in spans]
    assert names == [
        "chat scripted",
        "apply_guardrail logtoku",
        "chat scripted",
        "retrieve",
        "chat scripted",
        "apply_guardrail logtoku",
    ]
    guards = [s for s in spans if s["name"] == "apply_guardrail logtoku"]
    assert [len(s["events"]) for s in guards] == [1, 2] and all(
        e["name"] == "gen_ai.evaluation.result" for s in guards for e in s["events"]
    )
    assert {s["attributes"]["openinference.span.kind"] for s in guards} == {"GUARDRAIL"}
