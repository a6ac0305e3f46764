"""Cost of the prompt-side scores and the new statistics on a guarded answer (issue 12).

Runs the same questions with prompt scoring on and off (alternating, after a warm-up), and
times the new statistics (ResponseStats with prompt/word statistics + guard score) against
the generation itself. Prints the ratios.

    LOGTOKU_GUARD_CACHE=... python benchmarks/guard_score/overhead.py [--n 12] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

from logtoku_guard.backends.transformers import TransformersBackend
from logtoku_guard.evaluation.fabricated import load_fabricated
from logtoku_guard.guard_score import fit_guard, with_guard_score
from logtoku_guard.stats import ResponseStats
from logtoku_guard.types import DecodingOptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    backend = TransformersBackend(device=args.device)
    items = load_fabricated("test")
    questions = [it.question for it in items[: args.n // 2]] + [it.question for it in items[-(args.n - args.n // 2) :]]
    opts = DecodingOptions(max_new_tokens=args.max_new_tokens)
    backend.generate(questions[0], opts)  # warm-up
    on, off, first_on, first_off, stat_s = [], [], [], [], []
    gens = []
    for q in questions:
        for flag in (False, True) if len(on) % 2 else (True, False):
            backend.score_prompt = flag
            g = backend.generate(q, opts)
            (on if flag else off).append(g.timings.total_s)
            (first_on if flag else first_off).append(g.timings.first_token_s or 0.0)
            if flag:
                gens.append(g)
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
    extra = m(stat_s) - m(t_base)
    print(
        f"new statistics + guard score: median {1000 * m(stat_s):.2f} ms vs {1000 * m(t_base):.2f} ms before "
        f"(+{1000 * extra:.2f} ms = {100 * extra / m(on):.2f}% of an answer)"
    )


if __name__ == "__main__":
    main()
