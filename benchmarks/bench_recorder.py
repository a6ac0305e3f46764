#!/usr/bin/env python
"""Per-step cost of the backend's step recorder (pairing, detokenization, stop handling) vs answer length.

``StepRecorder`` runs once per decoding step inside ``generate``. This drives it directly
with precomputed step scores (no model forward pass), the embedded model's real tokenizer
and real text ids (README text plus accented, CJK and emoji text, so multi-byte characters
split across tokens), and times each step. The per-step cost must not grow with the answer:
the figures at ``--lengths`` 64 and 1024 should be about equal (before incremental
detokenization, the 1024-token figure was 7x (batch 1) to 17x (batch 8) the 64-token one).

Run: ``LOGTOKU_GUARD_CACHE=/tmp/ltg-cache python benchmarks/bench_recorder.py [--lengths 64,1024]
[--batch-sizes 1,8] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="64,1024", help="answer lengths in tokens, comma-separated (default 64,1024)")
    p.add_argument("--batch-sizes", default="1,8", help="rows per step, comma-separated (default 1,8)")
    p.add_argument("--repeats", type=int, default=7, help="timed answers per setting (default 7)")
    args = p.parse_args(argv)
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
        args.batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    except ValueError:
        p.error("--lengths and --batch-sizes take comma-separated integers")
    if not args.lengths or not args.batch_sizes or min(args.lengths + args.batch_sizes) < 1 or args.repeats < 1:
        p.error("lengths, batch sizes and --repeats must be positive")
    return args


def run(tokenizer: Any, ids: list[int], n: int, batch: int) -> list[float]:
    """Seconds of each of ``n`` recorder steps for ``batch`` rows (row b reads the text from offset 37 b)."""
    import torch

    from logtoku_guard.backends.recorder import StepRecorder, StepScores
    from logtoku_guard.scoring.uncertainty import logsumexp_entropy, logtoku

    recorder = StepRecorder(
        k=2,
        evidence="clamped",
        tokenizer=tokenizer,
        rows=batch,
        stop=(),
        eos_ids=frozenset({tokenizer.eos_token_id}),
        on_token=None,
        cancel=None,
    )
    logits = torch.randn(batch, len(tokenizer), generator=torch.Generator().manual_seed(0))
    values_t, top_ids_t = logits.topk(2, dim=-1)
    au_t, eu_t = logtoku(values_t, "clamped")
    lse_t, entropy_t = logsumexp_entropy(logits)
    values, top_ids, au, eu = values_t.tolist(), top_ids_t.tolist(), au_t.tolist(), eu_t.tolist()
    lse, entropy = lse_t.tolist(), entropy_t.tolist()
    steps = []
    for s in range(n):
        chosen = torch.tensor([[ids[(s + 37 * b) % len(ids)]] for b in range(batch)])
        recorder.pending = StepScores(values, top_ids, au, eu, logits, lse, entropy)
        t = time.perf_counter()
        recorder(chosen)
        steps.append(time.perf_counter() - t)
    return steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from logtoku_guard.backends.embedded import ensure_embedded_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())
    readme = Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text(encoding="utf-8") * 4 + " naïve café 日本語 🙂 " * 50
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    run(tokenizer, ids, 256, max(args.batch_sizes))  # warm-up
    print(f"step recorder, embedded tokenizer, {args.repeats} answers per setting (median of answers)")
    print(f"{'batch':>5} {'tokens':>7} {'mean ms/step':>13} {'last-64 ms/step':>16}")
    for batch in args.batch_sizes:
        for n in args.lengths:
            runs = [run(tokenizer, ids, n, batch) for _ in range(args.repeats)]
            mean = statistics.median(1000 * sum(r) / n for r in runs)
            last = statistics.median(1000 * statistics.mean(r[-64:]) for r in runs)
            print(f"{batch:>5} {n:>7} {mean:>13.3f} {last:>16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
