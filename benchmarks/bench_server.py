"""Throughput of ``logtoku-guard serve`` on loopback: tokens/s at 1, 4, 8, 16 concurrent clients.

Starts the real server (uvicorn, 127.0.0.1, a free port) in this process and sends chat
requests from client threads over HTTP. Prints, for each concurrency, the completion tokens
per second (all clients together) and the median request latency, then the ratio of 8
requests sent at once to the same 8 sent one after another (the "Done when" figure of
issue 15: >= 3x once concurrent requests are batched).

Concurrent requests share one running batch of up to ``--max-batch`` rows (continuous
batching: they join it between decoding steps and leave it as they end,
:mod:`logtoku_guard.backends.batching`); ``--max-batch 1`` gives the unbatched baseline (one
generation at a time). The load average
is printed before and after: on a shared machine the figures move with the other processes.

    python benchmarks/bench_server.py                 # embedded SmolLM2-135M-Instruct
    python benchmarks/bench_server.py --tiny          # a tiny random model (seconds; plumbing only)
    python benchmarks/bench_server.py --max-tokens 32 --rounds 2 --max-batch 8 --cache-dir /tmp/ltg-cache
    python benchmarks/bench_server.py --backend llamacpp --concurrency 1 8   # serve --backend llamacpp, 8 users / 1
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Who wrote Hamlet?",
    "What is the boiling point of water in Celsius?",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
    "Name a planet with rings.",
    "What language is spoken in Brazil?",
]


def tiny_backend(**kwargs: Any) -> Any:
    """The tests' tiny random Llama (tests/support/tiny.py)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path.insert(0, str(tests))
    from support.tiny import make_model, make_tokenizer  # type: ignore[import-not-found]

    from logtoku_guard.backends.transformers import TransformersBackend

    tok = make_tokenizer()
    return TransformersBackend("tiny", model_obj=make_model(tok), tokenizer=tok, **kwargs)


def run(base_url: str, model: str, clients: int, per_client: int, max_tokens: int) -> tuple[float, int, list[float]]:
    """Wall seconds, completion tokens and per-request latencies of ``clients`` x ``per_client`` requests.

    Each client thread builds its HTTP client (an ``httpx.Client``: tens of milliseconds of
    Python each, serialised by the GIL) before the clock starts, so that 8 clients at once
    are not charged 8 client constructions that one client sending 8 requests pays once.
    """
    import httpx

    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    ready = threading.Barrier(clients + 1)  # clients built before the clock starts

    def client(c: int) -> None:
        try:
            with httpx.Client(base_url=base_url, timeout=600) as http:
                ready.wait()
                for i in range(per_client):
                    q = QUESTIONS[(c + i) % len(QUESTIONS)]
                    body = {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens}
                    body["temperature"] = 0
                    t = time.perf_counter()
                    r = http.post("/chat/completions", json=body)
                    r.raise_for_status()
                    with lock:
                        latencies.append(time.perf_counter() - t)
                        tokens[0] += r.json()["usage"]["completion_tokens"]
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return wall, tokens[0], latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["transformers", "llamacpp"], default="transformers", help="the served backend")
    parser.add_argument("--model", default=None, help="model for the backend (default: the embedded one)")
    parser.add_argument("--tiny", action="store_true", help="use the tests' tiny random model")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="requests per client at each concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--max-batch", type=int, default=8, help="backend max_batch (1: no batching)")
    parser.add_argument("--threads", type=int, default=None, help="backend threads (default: the backend's choice)")
    parser.add_argument("--cache-dir", default=None, help="cache folder of the embedded model")
    parser.add_argument("--prefix-cache-mb", type=int, default=None, help="backend prefix_cache_mb (0: no prefix caching)")
    args = parser.parse_args()

    from logtoku_guard.server import BackgroundServer, build_app

    kwargs: dict[str, Any] = {"max_batch": args.max_batch, "threads": args.threads}
    if args.prefix_cache_mb is not None:
        kwargs["prefix_cache_mb"] = args.prefix_cache_mb
    if args.backend == "llamacpp":
        from logtoku_guard.backends.llamacpp import LlamaCppBackend

        backend: Any = LlamaCppBackend(args.model, n_threads=args.threads, max_batch=args.max_batch, cache_dir=args.cache_dir)
    elif args.tiny:
        backend = tiny_backend(**kwargs)
    else:
        from logtoku_guard import TransformersBackend

        backend = TransformersBackend(args.model, device="cpu", cache_dir=args.cache_dir, **kwargs)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.backend == "llamacpp":
        print(f"# llama.cpp, backend threads {backend.n_threads}, model {backend.model_name}")
    else:
        import torch

        print(f"# torch {torch.__version__}, backend threads {backend.threads}, model {backend.model_name}")
    prefix_cache = getattr(backend, "prefix_cache", None)
    cache = prefix_cache.max_bytes // 2**20 if prefix_cache is not None else 0
    print(f"# max_tokens={args.max_tokens}, greedy, {args.rounds} request(s) per client, max_batch={backend.max_batch}")
    print(f"# prefix cache {cache} MiB")
    print(f"# load average before: {os.getloadavg()[0]:.2f} (other processes share this machine)")
    with BackgroundServer(build_app(backend)) as srv:
        run(srv.base_url, backend.model_name, 2, 1, args.max_tokens)  # warm-up
        print(f"{'clients':>8} {'requests':>9} {'tokens':>7} {'wall s':>8} {'tokens/s':>9} {'median latency s':>17}")
        for c in args.concurrency:
            wall, tokens, lat = run(srv.base_url, backend.model_name, c, args.rounds, args.max_tokens)
            print(f"{c:>8} {len(lat):>9} {tokens:>7} {wall:>8.2f} {tokens / wall:>9.1f} {statistics.median(lat):>17.3f}")
        seq_wall, seq_tokens, _ = run(srv.base_url, backend.model_name, 1, 8, args.max_tokens)
        con_wall, con_tokens, _ = run(srv.base_url, backend.model_name, 8, 1, args.max_tokens)
    print(f"8 sequential: {seq_wall:.2f} s ({seq_tokens} tokens); 8 concurrent: {con_wall:.2f} s ({con_tokens} tokens)")
    print(f"ratio 8-concurrent vs 8-sequential (time): {seq_wall / con_wall:.2f}x (target >= 3x)")
    b = backend._batcher
    print(f"batches started: {b.batches}, requests that joined a running batch: {b.joins}, largest: {b.largest} rows")
    if prefix_cache is not None:
        print(f"prefix cache: {prefix_cache.stats()}")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
