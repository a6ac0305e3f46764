"""What OpenTelemetry tracing adds to one guard decision (issue 14: under 0.5 ms per decision).

Runs ``Guard.run`` on pre-generated answers (generation costs nothing here, so the figure is
the guard's own work) in interleaved rounds of three configurations, in one process:

- ``off``: ``telemetry=GuardTelemetry.disabled()`` (what a guard does without OpenTelemetry);
- ``noop``: OpenTelemetry installed, no SDK configured (the global no-op provider);
- ``sdk``: an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` into the in-memory exporter
  (every span built, ended and exported synchronously: an upper bound for a batch processor).

Two routes: ``pass`` (1 GUARDRAIL span, 1 chat span, 1 event) and ``retrieve-then-pass``
(1 + 3 spans, 2 events). Prints the median microseconds per decision, the ratio to ``off``
and the overhead per decision in ms.

    python benchmarks/bench_telemetry.py [--decisions 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend
from logtoku_guard.guard.telemetry import GuardTelemetry
from logtoku_guard.types import ChatMessage, DecodingOptions, Generation, Prompt

SURE = ScriptedAnswer(["Paris", " is", " the", " capital", "."] * 8, [[30.0, 5.0, 1.0]] * 40)
LOST = ScriptedAnswer(["Zorg", " Q", " Z", "."] * 10, [[0.6, 0.5, 0.1]] * 40)
POLICY = Policy.from_dict(
    {"name": "bench", "rules": [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "retrieve"}]}
)


class Replay:
    """A backend that hands back answers generated once (the guard's own cost is all that is timed)."""

    def __init__(self) -> None:
        scripted = ScriptedBackend(lambda m: SURE, k=2)
        self.sure = scripted.generate("q")
        self.lost = ScriptedBackend(lambda m: LOST, k=2).generate("q")
        self.model_name, self.k, self.evidence, self.top_n = scripted.model_name, 2, scripted.evidence, scripted.top_n

    def generate(self, prompt: Prompt, options: DecodingOptions | None = None) -> Generation:
        messages: list[ChatMessage] = prompt if isinstance(prompt, list) else []  # type: ignore[assignment]
        text = messages[-1].content if messages else str(prompt)
        return self.sure if ("France" in text or "Context" in text) else self.lost


def per_decision_us(guard: Guard, question: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        guard.run(question)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    backend: Any = Replay()
    retriever = lambda q: ["Paris is the capital of France."]  # noqa: E731
    guards = {
        "off": Guard(backend, POLICY, retriever=retriever, telemetry=GuardTelemetry.disabled()),
        "noop": Guard(backend, POLICY, retriever=retriever),
        "sdk": Guard(backend, POLICY, retriever=retriever, tracer_provider=provider),
    }
    routes = {"pass": "What is the capital of France?", "retrieve-then-pass": "Who founded the Zarnovian Institute?"}
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    print(f"# {machine}, load {os.getloadavg()}")
    for route, question in routes.items():
        for guard in guards.values():
            per_decision_us(guard, question, 200)  # warm up
        times: dict[str, list[float]] = {name: [] for name in guards}
        for _ in range(args.rounds):
            for name, guard in guards.items():
                times[name].append(per_decision_us(guard, question, args.decisions))
                exporter.clear()
        off = statistics.median(times["off"])
        print(f"\n{route}: median of {args.rounds} rounds x {args.decisions} decisions")
        for name in guards:
            med = statistics.median(times[name])
            paired = statistics.median(t - o for t, o in zip(times[name], times["off"], strict=True))
            overhead = f"overhead {paired / 1000:+.3f} ms/decision (paired median)"
            print(f"  {name:<5} {med:8.1f} us/decision  ratio {med / off:5.2f}  {overhead}")
    print(f"\nload at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
