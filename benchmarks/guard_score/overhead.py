"""Cost of the prompt-side scores and the new statistics on a guarded answer (issue 12).

Runs the same questions with prompt scoring on and off (alternating, after a warm-up), and
times the new statistics (ResponseStats with prompt/word statistics + guard score) against
the generation itself. Prints the ratios: wall time (time to first token, whole answer) and,
steadier on a shared machine, the **paired CPU time** of each question's two runs (the same
tokens are generated either way; ``time.process_time`` counts the batcher's worker thread):
the median of the per-question ratios with its interquartile range, and the ratio of the sums.

    LOGTOKU_GUARD_CACHE=... python benchmarks/guard_score/overhead.py [--n 12] [--max-new-tokens 32] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from logtoku_eval.fabricated import load_fabricated
from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.scoring.guard_score import fit_guard, with_guard_score
from logtoku_guard.scoring.stats import ResponseStats
from logtoku_guard.types import DecodingOptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each question with scoring on and with it off")
    args = ap.parse_args()
    backend = TransformersBackend(device=args.device)
    items = load_fabricated("test")
    questions = [it.question for it in items[: args.n // 2]] + [it.question for it in items[-(args.n - args.n // 2) :]]
    opts = DecodingOptions(max_new_tokens=args.max_new_tokens)
    backend.generate(questions[0], opts)  # warm-up
    on, off, first_on, first_off, stat_s = [], [], [], [], []
    cpu_on, cpu_off = [], []
    gens = []
    for q in questions * args.repeats:
        for flag in (False, True) if len(on) % 2 else (True, False):
            backend.score_prompt = flag  # read when the request is made
            c = time.process_time()
            g = backend.generate(q, opts)
            (cpu_on if flag else cpu_off).append(time.process_time() - c)
            (on if flag else off).append(g.timings.total_s)
            (first_on if flag else first_off).append(g.timings.first_token_s or 0.0)
            if flag:
                assert g.prompt_scores, "prompt scoring was asked for and did not run"
                gens.append(g)
            else:
                assert not g.prompt_scores, "prompt scoring ran when it was off"
    rows = [ResponseStats.from_generation(g) for g in gens]
    guard = fit_guard(rows, [i < len(rows) // 2 for i in range(len(rows))], ["overhead-bench"], folds=0)
    for g in gens:
        t = time.perf_counter()
        with_guard_score(ResponseStats.from_generation(g), guard)
        stat_s.append(time.perf_counter() - t)
    base = [ResponseStats.from_tokens(g.tokens, g.top_n) for g in gens[:1]]  # noqa: F841 - import warm
    t_base = []
    for g in gens:
        t = time.perf_counter()
        ResponseStats.from_tokens(g.tokens, g.top_n)
        t_base.append(time.perf_counter() - t)
    m = statistics.median
    print(f"questions: {len(questions)}, max_new_tokens {args.max_new_tokens}, device {backend.device}")
    print(
        f"median time to first token (prefill): off {m(first_off):.4f} s, on {m(first_on):.4f} s, "
        f"ratio {m(first_on) / m(first_off):.3f}"
    )
    ratio = m(on) / m(off)
    print(f"median total answer time: off {m(off):.4f} s, on {m(on):.4f} s, ratio {ratio:.3f}")
    print(f"sum total answer time: off {sum(off):.3f} s, on {sum(on):.3f} s, ratio {sum(on) / sum(off):.3f}")
    paired = sorted(a / b for a, b in zip(cpu_on, cpu_off, strict=True))
    q1, _, q3 = statistics.quantiles(paired, n=4)
    print(
        f"paired CPU time (scoring on / off, per question): median {m(paired):.4f} (IQR {q1:.4f}..{q3:.4f}, "
        f"min..max {paired[0]:.4f}..{paired[-1]:.4f}); sums {sum(cpu_on):.3f} / {sum(cpu_off):.3f} s = "
        f"{sum(cpu_on) / sum(cpu_off):.4f} (target < 1.02)"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    extra = m(stat_s) - m(t_base)
    print(
        f"new statistics + guard score: median {1000 * m(stat_s):.2f} ms vs {1000 * m(t_base):.2f} ms before "
        f"(+{1000 * extra:.2f} ms = {100 * extra / m(on):.2f}% of an answer)"
    )


if __name__ == "__main__":
    main()
