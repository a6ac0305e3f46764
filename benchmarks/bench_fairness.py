"""Fairness: the latency of short requests while one long prompt is prefilled beside them.

One client sends a long prompt (default ~7.7k tokens, near the embedded model's 8192-token
context); while it is being answered, ``--clients`` client threads send short questions back to
back. Printed for each ``--chunk`` setting: the short requests' latency (median, p99, max, how
many were answered while the long one ran), the same short request alone, and the long request's
own time. ``--chunk 0`` prefills every prompt whole (the behaviour before chunked prefill: each
short request that arrives during the long prefill waits for all of it); a chunk of N tokens
feeds the long prompt N tokens per decoding step (:mod:`logtoku_guard.backends.chunked_prefill`).

The requests go straight to the backend's batcher from threads, as the server's worker threads
send them: the server adds HTTP parsing, not scheduling. The load average is printed before and
after: on a shared machine the figures move with the other processes.

    python benchmarks/bench_fairness.py --backend llamacpp                  # chunks 0, 256, 128
    python benchmarks/bench_fairness.py --backend transformers --chunk 0 --chunk 256
    python benchmarks/bench_fairness.py --backend llamacpp --long-tokens 2000 --clients 1
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from typing import Any

from logtoku_guard.types import DecodingOptions

PASSAGE = (
    "The committee met on a grey morning to review the harbour's tide tables, the ferry timetable "
    "and the new lighting on the northern pier; each item was read aloud and noted in the minutes. "
)
SHORT = "Who wrote Hamlet?"


def build(kind: str, chunk: int, n_ctx: int) -> Any:
    if kind == "llamacpp":
        from logtoku_guard.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend("embedded", n_threads=1, n_ctx=n_ctx, prefill_chunk=chunk)
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(prefill_chunk=chunk, threads=1)


def long_prompt(backend: Any, tokens: int) -> str:
    """A user turn of about ``tokens`` tokens once rendered, ending with a question."""
    unit = backend.count_tokens(PASSAGE)
    text = PASSAGE * max(1, (tokens - 40) // unit) + "What was reviewed?"
    return text


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def measure(backend: Any, prompt: str, clients: int, short_tokens: int) -> dict[str, Any]:
    short = DecodingOptions(max_new_tokens=short_tokens)
    alone = []
    for _ in range(3):
        t = time.perf_counter()
        backend.generate(SHORT, short)
        alone.append(time.perf_counter() - t)
    done = threading.Event()
    latencies: list[float] = []
    lock = threading.Lock()
    long_time: list[float] = []

    def long_client() -> None:
        t = time.perf_counter()
        g = backend.generate(prompt, DecodingOptions(max_new_tokens=4))
        long_time.extend([time.perf_counter() - t, float(g.prompt_tokens)])
        done.set()

    def short_client() -> None:
        while not done.is_set():  # each short request sent while the long one is in flight counts
            t = time.perf_counter()
            backend.generate(SHORT, short)
            with lock:
                latencies.append(time.perf_counter() - t)

    runner = threading.Thread(target=long_client)
    runner.start()
    while backend.running_rows == 0 and not done.is_set():
        time.sleep(0.01)
    threads = [threading.Thread(target=short_client) for _ in range(clients)]
    for th in threads:
        th.start()
    runner.join()
    for th in threads:
        th.join()
    return {"alone": statistics.median(alone), "short": latencies, "long_s": long_time[0], "long_tokens": int(long_time[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["llamacpp", "transformers"], default="llamacpp")
    parser.add_argument("--chunk", type=int, action="append", help="prefill chunk(s) to compare; 0 = whole (default: 0 256 128)")
    parser.add_argument("--long-tokens", type=int, default=7700)
    parser.add_argument("--clients", type=int, default=2, help="threads sending short requests back to back")
    parser.add_argument("--short-tokens", type=int, default=8, help="max_new_tokens of each short request")
    args = parser.parse_args()
    chunks = args.chunk or [0, 256, 128]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    rows = []
    for chunk in chunks:
        backend = build(args.backend, chunk, n_ctx=args.long_tokens + 400)
        prompt = long_prompt(backend, args.long_tokens)
        r = measure(backend, prompt, args.clients, args.short_tokens)
        if hasattr(backend, "close"):
            backend.close()
        short = r["short"]
        rows.append((chunk, r))
        label = "whole" if chunk == 0 else f"{chunk} tokens/step"
        if short:
            print(
                f"{args.backend} chunk {label}: long prompt {r['long_tokens']} tokens answered in {r['long_s']:.1f} s; "
                f"{len(short)} short requests beside it: median {statistics.median(short):.2f} s, "
                f"p99 {p99(short):.2f} s, max {max(short):.2f} s (alone {r['alone']:.2f} s)",
                flush=True,
            )
        else:
            print(f"{args.backend} chunk {label}: long prompt {r['long_s']:.1f} s; no short request beside it", flush=True)
    base = next((r for c, r in rows if c == 0 and r["short"]), None)
    for chunk, r in rows:
        if base is not None and chunk != 0 and r["short"]:
            print(
                f"chunk {chunk} vs whole: short p99 {p99(base['short']) / p99(r['short']):.1f}x lower, "
                f"long prompt {r['long_s'] / base['long_s']:.2f}x the time"
            )
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
