"""Fairness: the latency of short requests alone, beside one long prompt, and beside a queue of long prompts.

For each backend (``--backend``, both by default) and each ``--chunk`` setting, three scenarios on
the embedded model, each short request "Who wrote Hamlet?" with ``--short-tokens`` tokens:

- **alone**: the short request with nothing beside it (median of 5);
- **one long**: one client sends a ``--long-tokens`` prompt (``--long-max-tokens`` answer tokens);
  while it is in flight, ``--clients`` threads send short requests back to back;
- **queue**: ``--queue`` such long prompts are sent ``--gap`` seconds apart, then the short
  clients start, until every long request is answered. On llama.cpp the KV cache is sized
  (``--n-ctx``, by default one long request plus 256 cells) so that a second long request does not
  fit beside the first: issue 43's N2, where that request blocked every short one behind it.

Printed per scenario: how many short requests were answered, their median, p99 and max latency
and the ratios of median and p99 to alone, and each long request's time (with ``--long-alone``,
also the long request with nothing beside it, and the ratio). ``--chunk 0`` prefills every prompt
whole (the behaviour before chunked prefill); the default is the backend's own. On llama.cpp
``--budget`` compares prefill step budgets (seconds a step may feed a long prompt, in pieces:
``chunked_prefill.BudgetedPrefill``; 0 = one fixed chunk a step, the behaviour before), and
``--prefill beside`` / ``--prefill loop`` (both backends) where a long prompt is prefilled: beside
the batch by a thread of its own (the default, ``concurrent_prefill``: on llama.cpp on a second
context on the same weights, on transformers on the prompt's own KV cache), or in the decoding
loop, taking turns with the decoding rows (as before; a llama.cpp budget always runs there).

``--steps`` (llama.cpp) times every scheduler step of the loop beside the long prompt(s) and prints
where a short request's time goes: the long prompt's chunk (or pieces) a step, the decoding steps
between, and the steps that ran while the slowest short requests were in flight.

The requests go straight to the backend's batcher from threads, as the server's worker threads
send them: the server adds HTTP parsing, not scheduling. The load average and this process's CPU
time are printed: on a shared machine the wall-clock figures move with the other processes, and
the ratios to alone (measured in the same run) are what to compare.

    python benchmarks/bench_fairness.py                                         # both backends, defaults
    python benchmarks/bench_fairness.py --backend llamacpp --long-tokens 2930 --long-max-tokens 1024 --n-ctx 4096
    python benchmarks/bench_fairness.py --backend transformers --chunk 0 --chunk 256
    python benchmarks/bench_fairness.py --backend llamacpp --long-tokens 7500 --long-max-tokens 4 --scenario one \
        --budget 0 --budget 0.2 --long-alone
    python benchmarks/bench_fairness.py --backend llamacpp --long-tokens 7500 --long-max-tokens 4 --scenario one --steps
    python benchmarks/bench_fairness.py --backend llamacpp --long-tokens 7500 --long-max-tokens 4 --scenario one \
        --prefill beside --prefill loop --long-alone
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


def build(kind: str, chunk: int | None, n_ctx: int, budget: float | None = None, concurrent: bool | None = None) -> Any:
    from logtoku_guard.backends.chunked_prefill import DEFAULT_PREFILL_BUDGET_S, DEFAULT_PREFILL_CHUNK

    size = DEFAULT_PREFILL_CHUNK if chunk is None else chunk
    if kind == "llamacpp":
        from logtoku_guard.backends.llamacpp import LlamaCppBackend

        seconds = DEFAULT_PREFILL_BUDGET_S if budget is None else budget
        return LlamaCppBackend(
            "embedded", n_threads=1, n_ctx=n_ctx, prefill_chunk=size, prefill_budget_s=seconds, concurrent_prefill=concurrent
        )
    from logtoku_guard.backends.transformers import TransformersBackend

    return TransformersBackend(threads=1, prefill_chunk=size, concurrent_prefill=concurrent is not False)


def long_prompt(backend: Any, tokens: int, n: int = 0) -> str:
    """A user turn of about ``tokens`` tokens once rendered, ending with a question (``n`` makes each distinct)."""
    unit = backend.count_tokens(PASSAGE)
    return f"Report {n}. " + PASSAGE * max(1, (tokens - 40) // unit) + "What was reviewed?"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def beside(
    backend: Any,
    prompts: list[str],
    long_opts: DecodingOptions,
    clients: int,
    short: DecodingOptions,
    gap: float,
    t0: float | None = None,
) -> dict[str, Any]:
    """Short requests sent back to back by ``clients`` threads while the long ``prompts`` (sent ``gap`` s apart) are in flight."""
    latencies: list[float] = []
    started: list[tuple[float, float]] = []  # (start since t0, latency) of each short request
    t0 = time.perf_counter() if t0 is None else t0
    long_times: list[float] = []
    lock = threading.Lock()
    pending = threading.Semaphore(0)
    left = [len(prompts)]

    def long_client(prompt: str) -> None:
        t = time.perf_counter()
        backend.generate(prompt, long_opts)
        with lock:
            long_times.append(time.perf_counter() - t)
            left[0] -= 1
        pending.release()

    def short_client() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
            t = time.perf_counter()
            backend.generate(SHORT, short)
            with lock:  # every short request sent while a long one was in flight counts
                latencies.append(time.perf_counter() - t)
                started.append((t - t0, latencies[-1]))

    runners = []
    for prompt in prompts:
        runners.append(threading.Thread(target=long_client, args=(prompt,)))
        runners[-1].start()
        time.sleep(gap)
    while backend.running_rows == 0 and left[0]:
        time.sleep(0.01)
    threads = [threading.Thread(target=short_client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in runners + threads:
        th.join()
    return {"short": latencies, "long": sorted(long_times), "started": started}


_ORIGINAL: dict[str, Any] = {}
"""The decode loop's own methods, before :class:`StepTimes` wraps them (each run wraps the originals)."""


class StepTimes:
    """Every step of the llama.cpp decode loop, timed (``--steps``): when it started, its seconds, the rows
    decoding and admitted, and the seconds of it spent feeding a long prompt (a chunk, or budgeted pieces)."""

    def __init__(self) -> None:
        from logtoku_guard.backends import llamacpp_loop

        self.steps: list[dict[str, float]] = []
        self.t0 = time.perf_counter()
        loop = llamacpp_loop.LlamaDecodeLoop
        step, feed = _ORIGINAL.setdefault("step", loop._step), _ORIGINAL.setdefault("feed", loop._feed_long)  # unwrapped
        current: dict[str, float] = {}

        def timed_step(this: Any) -> None:
            current.clear()
            current.update(at=time.perf_counter() - self.t0, live=len(this.live), admitted=len(this.admitted), feed=0.0)
            t = time.perf_counter()
            step(this)
            self.steps.append({**current, "seconds": time.perf_counter() - t})

        def timed_feed(this: Any, row: Any, first: Any) -> bool:
            t, fed = time.perf_counter(), row.fed
            joined = feed(this, row, first)
            current.update(feed=time.perf_counter() - t, fed=fed, tokens=row.fed - fed)
            return joined

        loop._step, loop._feed_long = timed_step, timed_feed  # type: ignore[method-assign,assignment]

    def summary(self, shorts: list[tuple[float, float]]) -> str:
        feeds = [s for s in self.steps if s["feed"] > 0]
        decoding = [s["seconds"] for s in self.steps if s["feed"] == 0 and s["live"] > 0]
        lines = [f"    {len(self.steps)} steps; {len(feeds)} fed the long prompt, {len(decoding)} only decoded"]
        if feeds:
            per_token = [s["feed"] / s["tokens"] for s in feeds if s.get("tokens")]
            lines.append(
                f"    long prompt a step: median {statistics.median(s['feed'] for s in feeds):.2f} s, max "
                f"{max(s['feed'] for s in feeds):.2f} s; per prompt token median {1000 * statistics.median(per_token):.1f} ms "
                f"(first chunk {1000 * per_token[0]:.1f} ms, last {1000 * per_token[-1]:.1f} ms)"
            )
        if decoding:
            lines.append(
                f"    a decoding step: median {1000 * statistics.median(decoding):.0f} ms, max {1000 * max(decoding):.0f} ms"
            )
        for start, took in sorted(shorts, key=lambda x: -x[1])[:3]:
            during = [s for s in self.steps if start <= s["at"] + s["seconds"] and s["at"] <= start + took]
            fed = sum(s["feed"] for s in during)
            lines.append(
                f"    a slowest short request ({took:.2f} s from {start:.1f} s) overlapped {len(during)} steps, which fed "
                f"the long prompt for {fed:.2f} s (the longest {max((s['feed'] for s in during), default=0):.2f} s)"
            )
        return "\n".join(lines)


def report(scenario: str, r: dict[str, Any], alone: float, long_alone: float | None = None) -> None:
    short = r["short"]
    longs = ", ".join(f"{t:.1f}" for t in r["long"])
    if long_alone is not None:
        longs += f" (alone {long_alone:.1f} s: {r['long'][-1] / long_alone:.2f}x)"
    if not short:
        print(f"  {scenario}: long request(s) {longs} s; no short request answered beside them", flush=True)
        return
    med, tail = statistics.median(short), p99(short)
    print(
        f"  {scenario}: {len(short)} short requests: median {med:.2f} s ({med / alone:.1f}x alone), "
        f"p99 {tail:.2f} s ({tail / alone:.1f}x), max {max(short):.2f} s; long request(s) answered in {longs} s",
        flush=True,
    )


def slowest(r: dict[str, Any], n: int) -> None:
    """The ``n`` slowest short requests: when each started (seconds into the scenario) and its time."""
    for start, took in sorted(r["started"], key=lambda x: -x[1])[:n]:
        print(f"    slow short request: started {start:.1f} s in, took {took:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["llamacpp", "transformers"], action="append", help="default: both")
    parser.add_argument(
        "--chunk", type=int, action="append", help="prefill chunk(s) to compare; 0 = whole (default: the backend's)"
    )
    parser.add_argument("--long-tokens", type=int, default=2000, help="tokens of each long prompt")
    parser.add_argument("--long-max-tokens", type=int, default=64, help="max_new_tokens of each long request")
    parser.add_argument("--queue", type=int, default=2, help="long prompts in the queue scenario")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between the long requests of the queue")
    parser.add_argument("--n-ctx", type=int, default=0, help="llama.cpp KV cells (default: one long request + 256)")
    parser.add_argument("--clients", type=int, default=2, help="threads sending short requests back to back")
    parser.add_argument("--short-tokens", type=int, default=8, help="max_new_tokens of each short request")
    parser.add_argument("--scenario", choices=["one", "queue"], action="append", help="default: both")
    parser.add_argument(
        "--budget", type=float, action="append", help="llama.cpp prefill step budget(s) in seconds; 0 = fixed chunks"
    )
    parser.add_argument(
        "--prefill",
        choices=["beside", "loop"],
        action="append",
        help="where a long prompt is prefilled (beside the batch by a thread of its own, or in the loop); "
        "default: the backend's (beside, unless a llama.cpp budget is given)",
    )
    parser.add_argument("--long-alone", action="store_true", help="also time one long request with nothing beside it")
    parser.add_argument("--slowest", type=int, default=0, help="print the N slowest short requests: when each started, its time")
    parser.add_argument("--steps", action="store_true", help="llama.cpp: time each scheduler step, say where the time goes")
    args = parser.parse_args()
    kinds = args.backend or ["transformers", "llamacpp"]
    chunks: list[int | None] = list(args.chunk) if args.chunk else [None]
    scenarios = args.scenario or ["one", "queue"]
    n_ctx = args.n_ctx or args.long_tokens + args.long_max_tokens + 256
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    short = DecodingOptions(max_new_tokens=args.short_tokens)
    long_opts = DecodingOptions(max_new_tokens=args.long_max_tokens)
    cpu0 = time.process_time()
    budgets: list[float | None] = list(args.budget) if args.budget else [None]
    places: list[bool | None] = [{"beside": True, "loop": False}[p] for p in args.prefill] if args.prefill else [None]
    runs = [
        (k, c, b, p)
        for k in kinds
        for c in chunks
        for b in (budgets if k == "llamacpp" else [None])
        for p in places
        if not (p and b)  # a budget shares the loop's time: it is never beside
    ]
    for kind, chunk, budget, place in runs:
        backend = build(kind, chunk, n_ctx, budget, place)
        label = "whole" if chunk == 0 else f"chunk {getattr(backend, 'prefill_chunk', chunk)}"
        if chunk != 0:
            seconds = getattr(backend, "prefill_budget_s", None)
            if backend.concurrent_prefill:
                where = "a second context" if kind == "llamacpp" else "a thread of its own"
                label += f", prefilled beside the batch ({where})"
            else:
                label += f", budget {seconds} s a step" if seconds else ", fixed chunks in the loop"
        extra = f", n_ctx {n_ctx}" if kind == "llamacpp" else ""
        prompts = [long_prompt(backend, args.long_tokens, n) for n in range(max(args.queue, 1))]
        n_long = backend.count_tokens(backend.render(prompts[0]))
        backend.generate(SHORT, short)  # warm-up
        alone = []
        for _ in range(5):
            t = time.perf_counter()
            backend.generate(SHORT, short)
            alone.append(time.perf_counter() - t)
        base = statistics.median(alone)
        print(
            f"{kind}, {label}{extra}: long prompts {n_long} tokens + {args.long_max_tokens}; short alone median {base:.2f} s",
            flush=True,
        )
        long_alone = None
        if args.long_alone:
            t = time.perf_counter()
            backend.generate(prompts[-1], long_opts)
            long_alone = time.perf_counter() - t
            print(f"  long request alone: {long_alone:.1f} s", flush=True)
        if "one" in scenarios:
            steps = StepTimes() if args.steps and kind == "llamacpp" else None
            r = beside(backend, prompts[:1], long_opts, args.clients, short, 0.0, steps.t0 if steps else None)
            report("beside one long prompt", r, base, long_alone)
            slowest(r, args.slowest)
            if steps is not None:
                print(steps.summary(r["started"]), flush=True)
        if "queue" in scenarios:
            steps = StepTimes() if args.steps and kind == "llamacpp" else None
            r = beside(backend, prompts[: args.queue], long_opts, args.clients, short, args.gap, steps.t0 if steps else None)
            report(f"beside a queue of {args.queue} long prompts", r, base)
            slowest(r, args.slowest)
            if steps is not None:
                print(steps.summary(r["started"]), flush=True)
        if hasattr(backend, "close"):
            backend.close()
    print(f"load after {os.getloadavg()[0]:.2f}; this process's CPU time {time.process_time() - cpu0:.0f} s")


if __name__ == "__main__":
    main()
