"""A bounded loopback load test: 200 requests from 16 client threads, none lost or mixed, memory back to its start."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402
from logtoku_guard.types import DecodingOptions  # noqa: E402

CLIENTS = 16
REQUESTS = 200
WORDS = ["Paris", "Rome", "France", "Italy", "capital", "model", "city", "Europe"]


def prompts() -> list[str]:
    return [f"Question {i}: tell me about {WORDS[i % len(WORDS)]} and {WORDS[(i * 3 + 1) % len(WORDS)]}" for i in range(CLIENTS)]


@pytest.mark.slow  # a minute of load: in the full suite, not the fast lane
def test_200_requests_from_16_clients(tiny_backend: Any) -> None:
    questions = prompts()
    # A random tiny model barely reads its prompt: a per-client seed (sampling) and length make every
    # client's answer its own, so an answer delivered to the wrong client is seen. The clients' seeded
    # rows share batches, each drawing from its own stream: the same answer as alone, every time.
    options = [DecodingOptions(max_new_tokens=3 + c % 4, temperature=1.0, seed=1000 + c) for c in range(CLIENTS)]
    expected = [tiny_backend.generate(q, o).text for q, o in zip(questions, options)]
    assert len(set(expected)) == CLIENTS
    proc = psutil.Process()
    per_client = [REQUESTS // CLIENTS + (1 if c < REQUESTS % CLIENTS else 0) for c in range(CLIENTS)]
    with BackgroundServer(build_app(tiny_backend)) as srv:

        def run_round(counts: list[int]) -> tuple[list[list[str]], list[BaseException]]:
            answers: list[list[str]] = [[] for _ in range(CLIENTS)]
            errors: list[BaseException] = []

            def client(c: int) -> None:
                try:
                    with httpx.Client(base_url=srv.base_url, timeout=120) as http:
                        for _ in range(counts[c]):
                            body = {
                                "messages": [{"role": "user", "content": questions[c]}],
                                "max_tokens": options[c].max_new_tokens,
                                "temperature": 1.0,
                                "seed": options[c].seed,
                            }
                            r = http.post("/chat/completions", json=body)
                            r.raise_for_status()
                            answers[c].append(r.json()["choices"][0]["message"]["content"])
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            hung = [t.name for t in threads if t.is_alive()]  # a request that never ends is a failure, not a slow pass
            assert not hung, f"clients still waiting after 300 s: {hung}"
            return answers, errors

        run_round([2] * CLIENTS)  # warm-up: allocator pools, thread pools, connection state
        gc.collect()
        rss_start = proc.memory_info().rss
        answers, errors = run_round(per_client)
        gc.collect()
        rss_end = proc.memory_info().rss
    assert not errors, errors[:3]
    assert sum(len(a) for a in answers) == REQUESTS  # none lost
    assert tiny_backend._batcher.largest > 1  # seeded rows shared batches
    for c in range(CLIENTS):  # none mixed: every client got its own prompt's answer, every time
        assert answers[c] == [expected[c]] * per_client[c]
    assert rss_end - rss_start < 64 * 2**20, f"RSS grew by {(rss_end - rss_start) / 2**20:.1f} MiB over {REQUESTS} requests"
