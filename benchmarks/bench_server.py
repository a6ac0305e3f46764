"""Throughput of ``logtoku-guard serve`` on loopback: tokens/s at 1, 4, 8, 16 concurrent clients.

Starts the real server (uvicorn, 127.0.0.1, a free port) in this process and sends chat
requests from client threads over HTTP. Prints, for each concurrency, the completion tokens
per second (all clients together) and the median request latency, then the ratio of 8
requests sent at once to the same 8 sent one after another (the "Done when" figure of
issue 15: >= 3x once concurrent requests are batched).

Today generation runs one request at a time behind the backend (no batching yet), so the
ratio is ~1 and throughput does not grow with concurrency: that is the expected baseline.

    python benchmarks/bench_server.py                 # embedded SmolLM2-135M-Instruct
    python benchmarks/bench_server.py --tiny          # a tiny random model (seconds; plumbing only)
    python benchmarks/bench_server.py --max-tokens 32 --rounds 2
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


def tiny_backend() -> Any:
    """The tests' tiny random Llama (tests/conftest.py or its support module)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    sys.path.insert(0, str(tests))
    try:
        from support import make_model, make_tokenizer  # type: ignore[import-not-found]
    except ImportError:
        from conftest import make_model, make_tokenizer  # type: ignore[import-not-found,no-redef]
    from logtoku_guard.backends.transformers import TransformersBackend

    tok = make_tokenizer()
    return TransformersBackend("tiny", model_obj=make_model(tok), tokenizer=tok)


def run(base_url: str, model: str, clients: int, per_client: int, max_tokens: int) -> tuple[float, int, list[float]]:
    """Wall seconds, completion tokens and per-request latencies of ``clients`` x ``per_client`` requests."""
    import httpx

    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(c: int) -> None:
        try:
            with httpx.Client(base_url=base_url, timeout=600) as http:
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

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return wall, tokens[0], latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model for TransformersBackend (default: the embedded one)")
    parser.add_argument("--tiny", action="store_true", help="use the tests' tiny random model")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="requests per client at each concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    args = parser.parse_args()

    from logtoku_guard.server import BackgroundServer, build_app

    backend = tiny_backend() if args.tiny else __import__("logtoku_guard").TransformersBackend(args.model, device="cpu")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    import torch

    print(f"# torch {torch.__version__} ({torch.get_num_threads()} threads), model {backend.model_name}")
    print(f"# max_tokens={args.max_tokens}, greedy, {args.rounds} request(s) per client; no batching (one generation at a time)")
    with BackgroundServer(build_app(backend)) as srv:
        run(srv.base_url, backend.model_name, 2, 1, args.max_tokens)  # warm-up
        print(f"{'clients':>8} {'requests':>9} {'tokens':>7} {'wall s':>8} {'tokens/s':>9} {'median latency s':>17}")
        for c in args.concurrency:
            wall, tokens, lat = run(srv.base_url, backend.model_name, c, args.rounds, args.max_tokens)
            print(f"{c:>8} {len(lat):>9} {tokens:>7} {wall:>8.2f} {tokens / wall:>9.1f} {statistics.median(lat):>17.3f}")
        seq_wall, seq_tokens, _ = run(srv.base_url, backend.model_name, 1, 8, args.max_tokens)
        con_wall, con_tokens, _ = run(srv.base_url, backend.model_name, 8, 1, args.max_tokens)
    print(f"8 sequential: {seq_wall:.2f} s ({seq_tokens} tokens); 8 concurrent: {con_wall:.2f} s ({con_tokens} tokens)")
    print(
        f"ratio 8-concurrent vs 8-sequential (time): {seq_wall / con_wall:.2f}x (target >= 3x needs batching; ~1x expected today)"
    )


if __name__ == "__main__":
    main()
