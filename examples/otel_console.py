"""Traces of guard decisions in OpenTelemetry, printed by the SDK's console exporter.

Runs the guard on a scripted backend (no model needed): one confident question that passes,
and one invented-entity question that is retrieved for, answered again and passed. Each prints
one span tree: ``apply_guardrail logtoku`` (GUARDRAIL) with its ``chat``/``retrieve`` children
and one ``gen_ai.evaluation.result`` event per scored answer.

Run: .venv/bin/python examples/otel_console.py   (needs: pip install 'logtoku-guard[otel]' opentelemetry-sdk)
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.guard.keyword_retriever import KeywordRetriever
from logtoku_guard.types import ChatMessage

SURE = ScriptedAnswer(["Paris", "."], [[30.0, 5.0], [25.0, 2.0]])
LOST = ScriptedAnswer(["Zorg", " Q", " Z"], [[0.6, 0.5], [0.5, 0.4], [0.4, 0.1]])


def answer(messages: list[ChatMessage]) -> ScriptedAnswer:
    text = messages[-1].content
    return SURE if "France" in text or "Context" in text else LOST


def main() -> None:
    provider = TracerProvider()  # in an application: trace.set_tracer_provider(provider) once, then Guard(...) alone
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    policy = Policy.from_dict(
        {
            "name": "demo",
            "version": "1",
            "rules": [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "retrieve"}],
        }
    )
    retriever = KeywordRetriever(["The Zarnovian Institute was founded by Dr. Elena Marwick."])
    guard = Guard(ScriptedBackend(answer), policy, retriever=retriever, tracer_provider=provider)
    for question in ("What is the capital of France?", "Who founded the Zarnovian Institute?"):
        result = guard.run(question)
        print(f"# {question!r} -> {result.action} after {len(result.attempts)} attempt(s)")
    provider.shutdown()


if __name__ == "__main__":
    main()
