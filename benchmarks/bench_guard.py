"""Guard decision overhead per response, excluding generation.

Times `Decider.decide` (statistics + policy rules) and the whole post-generation path
(`decide` + `conclude`, i.e. answer building without a store) over pre-generated answers of a
scripted backend, with the calibrated default policy and a richer 5-rule policy.

    python benchmarks/bench_guard.py [--responses 2000] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

from logtoku_guard import Decider, Policy, ScriptedAnswer, ScriptedBackend, default_policy
from logtoku_guard.calibration import build_profile
from logtoku_guard.decision.results import Attempt, GuardTimings

RICH = {
    "name": "rich",
    "rules": [
        {"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": {"quantile": 0.99}}, "action": "abstain"},
        {
            "name": "shaky-start",
            "when": {
                "all": [
                    {"stat": "first_eu", "op": ">", "value": {"quantile": 0.9}},
                    {"stat": "n_tokens", "op": "<", "value": 40},
                ]
            },
            "action": "warn",
        },
        {"name": "q1", "when": {"stat": "quadrant_i_share", "op": ">", "value": {"quantile": 0.9}}, "action": "warn"},
        {"name": "low", "when": {"stat": "reliability", "op": "<", "value": {"quantile": 0.1}}, "action": "retrieve"},
        {
            "name": "not-mean",
            "when": {"not": {"stat": "reliability_mean", "op": ">", "value": {"quantile": 0.05}}},
            "action": "warn",
        },
    ],
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    rng = random.Random(0)

    def answer() -> ScriptedAnswer:
        rows = [sorted([rng.uniform(0, 30), rng.uniform(0, 30)], reverse=True) for _ in range(args.tokens)]
        return ScriptedAnswer([f" w{i}" for i in range(args.tokens)], rows)

    answers = [answer() for _ in range(args.responses)]
    backend = ScriptedBackend(answers + answers[:200], model_name="bench")
    generations = [backend.generate("q") for _ in range(args.responses)]
    profile = build_profile([backend.generate("q") for _ in range(200)], "bench")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"command: python benchmarks/bench_guard.py --responses {args.responses} --tokens {args.tokens}")
    timings = GuardTimings(0.0, 0.0, 0.0, 0.0)
    for name, policy in (("default (2 rules)", default_policy()), ("rich (5 rules)", Policy.from_dict(RICH))):
        decider = Decider(policy, profile)
        decide, total = [], []
        for g in generations:
            t0 = time.perf_counter()
            d = decider.decide(g)
            t1 = time.perf_counter()
            decider.conclude("q", d, [Attempt(g, d)], timings)
            t2 = time.perf_counter()
            decide.append((t1 - t0) * 1e3)
            total.append((t2 - t0) * 1e3)
        for label, xs in (("decide", decide), ("decide+conclude", total)):
            print(
                f"{name:<18} {label:<16} median {statistics.median(xs):.3f} ms  p99 {percentile(xs, 0.99):.3f} ms  "
                f"max {max(xs):.3f} ms  (target p99 < 1 ms: {'met' if percentile(xs, 0.99) < 1 else 'NOT met'})"
            )


if __name__ == "__main__":
    main()
