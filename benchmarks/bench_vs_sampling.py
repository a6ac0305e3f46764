#!/usr/bin/env python
"""Cost of single-pass LogTokU against the 10-sample baselines, at equal question count.

Both sides run the evaluation harness's own code paths (``logtoku_eval``) on the
first N TruthfulQA questions with the embedded model, into a fresh temporary cache:

* single pass: the greedy answer with its raw top-5 logits (``run_greedy``, batch 1 and
  batch 8), then every single-pass score re-computed from the logits (``single_pass_scores``:
  LogTokU, probability, entropy);
* sampling baselines: the same greedy answer (the answer whose reliability is judged), plus
  ``--samples`` answers at temperature 0.5 per question (``run_sampling``: one batch of n per
  question, as the harness does), then the baselines' scoring (``sampling_scores``:
  LN-entropy, lexical similarity by pairwise ROUGE-L, and the semantic-entropy stand-in,
  which embeds every sample with MiniLM and clusters them).

Reported: seconds per question of each stage, generated tokens, and the cost ratio
(sampling baselines / single pass) with single-pass greedy at batch 1 and at batch 8. The
MiniLM load is a one-off and is reported apart. Timings on a shared machine vary by a few
percent; the ratio is the figure that matters.

Run: ``LOGTOKU_GUARD_CACHE=/tmp/ltg-cache python benchmarks/bench_vs_sampling.py [--questions N]
[--samples 10] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=16, help="first N TruthfulQA questions (default 16)")
    p.add_argument("--samples", type=int, default=10, help="sampled answers per question (default 10, the paper's)")
    p.add_argument("--temperature", type=float, default=0.5, help="sampling temperature (default 0.5, the paper's)")
    p.add_argument("--data-dir", default=None, help="shared datasets folder (default: $LOGTOKU_GUARD_DATA or ../shared/data)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = p.parse_args(argv)
    if args.questions < 1:
        p.error(f"--questions must be at least 1, got {args.questions}")
    if args.samples < 2:
        p.error(f"--samples must be at least 2 (the baselines compare samples), got {args.samples}")
    return args


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from logtoku_eval.datasets import load_truthfulqa
    from logtoku_eval.generate import SamplingSpec, greedy_cache, run_greedy, run_sampling, samples_cache
    from logtoku_eval.judges import MINILM_PACKAGE, TransformerEmbedder
    from logtoku_eval.methods import sampling_scores, single_pass_scores
    from logtoku_guard.backends.transformers import TransformersBackend

    items = load_truthfulqa(data_dir=args.data_dir, limit=args.questions)
    n = len(items)
    load_s, backend = timed(TransformersBackend, None, k=5)
    spec = SamplingSpec(n=args.samples, temperature=args.temperature)
    figures: dict[str, Any] = {
        "questions": n,
        "samples": args.samples,
        "temperature": args.temperature,
        "torch_threads": torch.get_num_threads(),
        "model_load_s": load_s,
        "loadavg_start": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: one question through both paths (first-call allocations, thread pools)
        run_greedy(backend, items[:1], greedy_cache(os.path.join(tmp, "warm"), "m", "d"), batch_size=1)
        run_sampling(backend, items[:1], samples_cache(os.path.join(tmp, "warm"), "m", "d", SamplingSpec(n=2)))

        greedy_b1_s, records = timed(run_greedy, backend, items, greedy_cache(os.path.join(tmp, "b1"), "m", "d"), batch_size=1)
        greedy_b8_s, records8 = timed(run_greedy, backend, items, greedy_cache(os.path.join(tmp, "b8"), "m", "d"), batch_size=8)
        score_single_s, single = timed(single_pass_scores, records)
        sample_s, samples = timed(run_sampling, backend, items, samples_cache(tmp, "m", "d", spec), spec=spec)
        embedder = None
        embed_load_s = float("nan")
        if importlib.util.find_spec(MINILM_PACKAGE) is not None:
            embedder = TransformerEmbedder()
            embed_load_s, _ = timed(embedder.embed, ["warm-up"])
        score_sampling_s, sampled = timed(sampling_scores, samples, embedder)

    same = sum(a.answer == b.answer for a, b in zip(records, records8))
    greedy_tokens = sum(len(r.tokens) for r in records)
    sample_tokens = sum(s.n_tokens for rec in samples for s in rec.samples)
    single_b1 = greedy_b1_s + score_single_s
    single_b8 = greedy_b8_s + score_single_s
    sampling = greedy_b1_s + sample_s + score_sampling_s
    figures.update(
        {
            "greedy_batch1_s": greedy_b1_s,
            "greedy_batch8_s": greedy_b8_s,
            "single_pass_scoring_s": score_single_s,
            "sampling_generation_s": sample_s,
            "sampling_scoring_s": score_sampling_s,
            "minilm_load_and_first_embed_s": embed_load_s,
            "greedy_tokens": greedy_tokens,
            "sampled_tokens": sample_tokens,
            "batch8_answers_equal_batch1": same,
            "single_pass_per_question_s": single_b1 / n,
            "sampling_per_question_s": sampling / n,
            "ratio_vs_single_batch1": sampling / single_b1,
            "ratio_vs_single_batch8": (greedy_b8_s + sample_s + score_sampling_s) / single_b8,
            "semantic_variant": embedder is not None,
            "methods_single": sorted(single),
            "methods_sampling": sorted(sampled),
            "loadavg_end": os.getloadavg()[0],
            "nan_check": bool(np.isfinite(single["logtoku-k2-clamped-top25"]).any()),
        }
    )
    f = figures
    print(f"{n} TruthfulQA questions, embedded SmolLM2-135M-Instruct, torch threads {f['torch_threads']}")
    print(f"load average {f['loadavg_start']:.2f} at the start, {f['loadavg_end']:.2f} at the end")
    print("\nstage                                   seconds   per question")
    rows = [
        ("greedy answers, batch 1", greedy_b1_s),
        ("greedy answers, batch 8", greedy_b8_s),
        ("single-pass scores (all variants)", score_single_s),
        (f"{args.samples} samples per question (one batch each)", sample_s),
        ("sampling baselines' scoring", score_sampling_s),
    ]
    for name, s in rows:
        print(f"{name:<40}{s:8.2f} {1000 * s / n:10.1f} ms")
    print(f"(MiniLM load and first embedding, once: {embed_load_s:.2f} s; not counted)")
    print(f"\ngenerated tokens: greedy {greedy_tokens}, sampled {sample_tokens} ({sample_tokens / max(greedy_tokens, 1):.1f}x)")
    print(f"batch-8 answers equal to batch-1 answers: {same}/{n}")
    print(f"\nsingle pass (greedy batch 1 + scores):       {1000 * single_b1 / n:8.1f} ms per question")
    print(f"sampling baselines (greedy + samples + scores): {1000 * sampling / n:8.1f} ms per question")
    print(
        f"cost ratio, sampling baselines / single pass: {f['ratio_vs_single_batch1']:.1f}x (batch 1), "
        f"{f['ratio_vs_single_batch8']:.1f}x (greedy at batch 8 on both sides)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
