#!/usr/bin/env python
"""A synchronous ``generate`` vs the same call in a worker thread, idle and beside a busy process.

On 2-core machines torch's default intra-op threads (one per core) spin against any other
busy process: a synchronous generation was measured 4-7x slower than the same generation in
a worker thread. This benchmark measures, greedy, ``--tokens`` new tokens, median of
``--repeats`` runs interleaved (sync, thread, sync, thread...):

1. ``backend.generate`` called synchronously vs from a ``threading.Thread``, with the backend's
   default threads (:func:`logtoku_guard.backends.transformers.default_threads`), idle and
   with a competing CPU-bound subprocess (``python -c "while True: pass"``). Target: sync
   within 20% of the thread-run in both cases.
2. The cause: raw ``model.generate`` (no backend) in the main thread vs a worker thread, with
   torch's default thread count and with each of ``--threads-list``, idle and busy.

    python benchmarks/bench_threads.py --cache-dir /tmp/ltg-cache     # embedded SmolLM2-135M
    python benchmarks/bench_threads.py --tiny                          # the tests' tiny model

The load average is printed: other processes on a shared machine move the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TARGET = 1.20


@contextmanager
def competitor(on: bool) -> Iterator[None]:
    """A CPU-bound subprocess spinning for the duration of the block (when ``on``)."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def in_thread(fn: Callable[[], Any]) -> None:
    errors: list[BaseException] = []

    def work() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if errors:
        raise errors[0]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def pair(fn: Callable[[], Any], repeats: int) -> tuple[float, float, float, float]:
    """Median sync and thread seconds (interleaved), and their spreads ((max - min) / median)."""
    sync: list[float] = []
    thread: list[float] = []
    for i in range(repeats):
        order = [("s", fn), ("t", lambda: in_thread(fn))]
        if i % 2:
            order.reverse()
        for name, f in order:
            (sync if name == "s" else thread).append(timed(f))
    ms, mt = statistics.median(sync), statistics.median(thread)
    return ms, mt, (max(sync) - min(sync)) / ms, (max(thread) - min(thread)) / mt


def load_backend(args: argparse.Namespace) -> Any:
    from logtoku_guard.backends.transformers import TransformersBackend

    if args.tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.tiny import make_model, make_tokenizer  # type: ignore[import-not-found]

        tok = make_tokenizer()
        return TransformersBackend("tiny", model_obj=make_model(tok), tokenizer=tok, threads=args.threads)
    return TransformersBackend(args.model, device="cpu", cache_dir=args.cache_dir, threads=args.threads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model (default: the embedded one)")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny random model")
    p.add_argument("--cache-dir", default=None, help="cache folder of the embedded model")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="backend threads (default: the backend's choice)")
    p.add_argument("--threads-list", default="1,2", help="torch thread counts for the raw section (default 1,2)")
    p.add_argument("--skip-raw", action="store_true", help="only the backend section")
    args = p.parse_args()

    import torch

    torch_default = torch.get_num_threads()
    backend = load_backend(args)
    from logtoku_guard.types import DecodingOptions

    opts = DecodingOptions(max_new_tokens=args.tokens)
    question = "Explain photosynthesis in one paragraph."
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__} (default {torch_default} threads), model {backend.model_name}")
    print(f"# {args.tokens} greedy tokens, median of {args.repeats} interleaved runs; load average {os.getloadavg()[0]:.2f}")
    backend.generate(question, opts)  # warm-up
    worst = 0.0
    print(f"\n1. backend.generate (threads={backend.threads}): sync vs worker thread")
    print(f"{'competitor':>11} {'sync s':>8} {'thread s':>9} {'sync/thread':>12} {'spread s/t':>12}")
    for busy in (False, True):
        with competitor(busy):
            ms, mt, ss, st = pair(lambda: backend.generate(question, opts), args.repeats)
        worst = max(worst, ms / mt)
        print(f"{'busy' if busy else 'idle':>11} {ms:>8.3f} {mt:>9.3f} {ms / mt:>11.2f}x {ss:>5.0%}/{st:<5.0%}")
    if not args.skip_raw:
        model, tok = backend.model, backend.tokenizer
        enc = tok([backend.render(question)], return_tensors="pt", add_special_tokens=False)
        cfg = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False}
        cfg["pad_token_id"] = tok.pad_token_id

        print("\n2. raw model.generate: main thread vs worker thread, per torch thread count")
        print(f"{'threads':>8} {'competitor':>11} {'main s':>8} {'thread s':>9} {'main/thread':>12}")
        counts = [torch_default] + [int(x) for x in args.threads_list.split(",") if int(x) != torch_default]
        for n in counts:

            def raw(n: int = n) -> None:
                torch.set_num_threads(n)
                with torch.inference_mode():
                    model.generate(**enc, **cfg)

            for busy in (False, True):
                with competitor(busy):
                    ms, mt, _, _ = pair(raw, args.repeats)
                label = f"{n}{' (torch default)' if n == torch_default else ''}"
                print(f"{label:>8} {'busy' if busy else 'idle':>11} {ms:>8.3f} {mt:>9.3f} {ms / mt:>11.2f}x")
    print(f"\nworst backend sync/thread ratio: {worst:.2f}x (target <= {TARGET:.2f}x); load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
