"""The scheduler on TransformersBackend: no request blocks the ones behind it (issue 43, N2).

- Greedy and sampled rows share a batch: a seeded sampled request (temperature 0.7, seed 7) queued
  between greedy ones no longer keeps them from joining the running batch; each row keeps its own
  sampling settings and random stream, so every answer equals the same request alone.
- A request that cannot fit the model's window at all is refused at once, before it is queued,
  even while the worker is busy; through the server it is a 400 that names the limit.

Batches are made deterministic by holding the worker inside a forward pass
(:class:`support.gate.Gate`) while requests queue; the schedule is read from the model's forward
passes and from the order in which rows end (in the worker thread), never from timings. The
llama.cpp side: ``tests/backends/test_scheduler_llamacpp.py``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.gate import Forwards
from support.joins import gated, join_mid_generation, queued
from support.same import assert_same, wait_until

from logtoku_guard.backends.batching import row_seed
from logtoku_guard.errors import PromptTooLongError
from logtoku_guard.types import DecodingOptions

RUNNING = "Count from one to ten, slowly, and then stop counting"
SAMPLED = DecodingOptions(max_new_tokens=12, temperature=0.7, seed=7)
GREEDY = DecodingOptions(max_new_tokens=12)


class Ended:
    """The prompts of the backend's rows as they end (their order is the schedule's)."""

    def __init__(self, backend: Any) -> None:
        self.order: list[str] = []
        real = backend._generation

        def record(row: Any) -> Any:
            g = real(row)
            self.order.append(g.prompt)
            return g

        backend._generation = record


def test_a_seeded_sampled_request_and_greedy_ones_join_one_running_batch_and_equal_their_alone_answers(
    tiny_tokenizer: Any,
) -> None:
    """N2 on transformers, scaled down: A greedy and long; B sampled (0.7, seed 7); C and D greedy
    and short, queued behind B. All three join A's batch at one step, decode in the same forward
    passes, and end before A; every answer equals its own alone (B's too: its own seeded stream)."""
    backend, gate, model = gated(tiny_tokenizer)
    model.generation_config.min_new_tokens = 12  # no early EOS: every joiner runs its 12 tokens beside A
    forwards = Forwards(backend.model)
    ended = Ended(backend)
    first = (RUNNING, DecodingOptions(max_new_tokens=40))
    joiners = [("Tell me about Rome", SAMPLED), ("Hi", GREEDY), ("Paris or Rome?", GREEDY)]
    alone = [backend.generate(p, o) for p, o in [first, *joiners]]
    again = backend.generate(*joiners[0])
    assert [t.id for t in again.tokens] == [t.id for t in alone[1].tokens]  # seeded: reproducible
    other_seed = backend.generate(joiners[0][0], SAMPLED.replace(seed=8))
    greedy_b = backend.generate(joiners[0][0], GREEDY)
    assert [t.id for t in alone[1].tokens] not in ([t.id for t in other_seed.tokens], [t.id for t in greedy_b.tokens])
    ended.order.clear()
    mark = len(forwards.seen)
    together = join_mid_generation(backend, gate, first, joiners)  # asserts all three joined the running batch
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)
    steps = [f for f in forwards.seen[mark:] if f.new == 1]
    assert max(f.rows for f in steps) == 4  # the sampled row and the greedy rows in one decoding step
    assert ended.order.index(RUNNING) == 3  # each joiner ended before the long running row
    assert all(t.temperature is None for g in together for t in g.tokens)  # no dynamic schedule in this batch


def test_the_rows_of_one_seeded_request_draw_their_own_streams(tiny_backend: Any) -> None:
    prompt = "Tell me about Rome"
    options = DecodingOptions(max_new_tokens=12, temperature=1.5, seed=7)
    rows = tiny_backend.batch([prompt, prompt], options)
    assert [t.id for t in rows[0].tokens] == [t.id for t in tiny_backend.generate(prompt, options).tokens]
    assert [t.id for t in rows[0].tokens] != [t.id for t in rows[1].tokens]  # not one stream twice
    assert [t.id for t in rows[1].tokens] == [t.id for t in tiny_backend.batch([prompt, prompt], options)[1].tokens]
    assert row_seed(7, 0) == 7 and row_seed(7, 1) != 7 and row_seed(None, 3) is None
    assert 0 <= row_seed(2**64 - 1, 5) < 2**64  # type: ignore[operator]


def test_a_request_that_cannot_fit_is_refused_at_once_while_the_worker_is_busy(tiny_tokenizer: Any) -> None:
    backend, gate, _ = gated(tiny_tokenizer, max_positions=64)
    stream = backend.stream(RUNNING, DecodingOptions(max_new_tokens=20))
    tokens = iter(stream)
    next(tokens)
    with gate.held(), ThreadPoolExecutor(1) as pool:  # the worker is inside a forward pass
        refused = pool.submit(backend.generate, "one two three four five six seven eight nine ten " * 10)
        with pytest.raises(PromptTooLongError, match="context window is 64 tokens") as info:
            refused.result(30)  # answered while the running batch is held: never queued
        assert queued(backend) == 0
    assert info.value.context_window == 64
    list(tokens)
    assert stream.generation.finish_reason == "length"


def test_the_server_answers_a_request_that_cannot_fit_with_a_400_naming_the_limit(tiny_tokenizer: Any) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from support.served import tiny_served

    from logtoku_guard.server import BackgroundServer, build_app

    backend = tiny_served(tiny_tokenizer, max_positions=64)
    with BackgroundServer(build_app(backend)) as srv:
        url = srv.base_url + "/chat/completions"
        body = {"messages": [{"role": "user", "content": "one two three four five six " * 20}], "max_tokens": 4}
        for stream in (False, True):
            r = httpx.post(url, json={**body, "stream": stream}, timeout=60)
            if stream and r.status_code == 200:  # a stream may open first: its error event must name the limit
                assert "context window is 64 tokens" in r.text
                continue
            assert r.status_code == 400, r.text
            assert "context window is 64 tokens" in r.json()["error"]["message"]
        ok = httpx.post(url, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200


def test_greedy_requests_queued_behind_a_dynamic_schedule_wait_their_turn_and_are_not_lost(tiny_tokenizer: Any) -> None:
    """The one setting that still splits batches (another dynamic temperature schedule) keeps first
    come, first served: nothing is overtaken, everything is answered as alone."""
    from logtoku_guard import DynamicTemperature

    backend, gate, model = gated(tiny_tokenizer)
    model.generation_config.min_new_tokens = 6
    dynamic = DecodingOptions(max_new_tokens=6, dynamic=DynamicTemperature(t_max=1.2, t_min=0.2), seed=3)
    alone = [backend.generate("Hi", dynamic), backend.generate("Paris or Rome?", GREEDY)]
    stream = backend.stream(RUNNING, DecodingOptions(max_new_tokens=20))
    tokens = iter(stream)
    next(tokens)
    results: dict[str, Any] = {}
    threads = []
    with gate.held():
        for k, (name, (p, o)) in enumerate({"dynamic": ("Hi", dynamic), "greedy": ("Paris or Rome?", GREEDY)}.items(), 1):
            threads.append(threading.Thread(target=lambda n=name, p=p, o=o: results.update({n: backend.generate(p, o)})))
            threads[-1].start()
            wait_until(lambda k=k: queued(backend) == k, "the request to queue")
    list(tokens)
    for t in threads:
        t.join(60)
    assert_same(alone[0], results["dynamic"])
    assert_same(alone[1], results["greedy"])
