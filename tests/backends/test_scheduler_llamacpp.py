"""The scheduler on LlamaCppBackend (the real embedded GGUF, small contexts): no request blocks the queue (issue 43, N2).

- A request that does not fit the KV cells left beside the running rows waits; a later short request
  that fits is admitted around it and answered before the waiting one starts decoding (N2's
  llama.cpp reproducer: two long requests sharing a 4,096-cell cache, then "Say hello.", scaled
  down to a 256-cell cache).
- A request that cannot fit the cache at all is refused at once (before it is queued, while the
  worker is busy) naming the limit; through the server, a 400.
- Greedy and sampled rows decode in the same ``llama_decode`` calls, each answer equal to its alone.

The order is read from the worker thread (rows as they end, tokens as they are chosen) and the
batches from the entries of each ``decode`` call: no timing is asserted. Skipped only where
llama-cpp-python is not installed (as ``tests/backends/test_llamacpp.py``).
"""

from __future__ import annotations

import importlib.util
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.postgres import in_ci

if importlib.util.find_spec("llama_cpp") is None:
    if in_ci():
        pytest.fail("llama-cpp-python is not installed: scripts/install.sh --dev must install it under CI", pytrace=False)
    pytest.skip("llama-cpp-python is not installed: pip install 'logtoku-guard[llamacpp]'", allow_module_level=True)

from support.gate import CallGate
from support.same import wait_until

from logtoku_guard.backends.embedded import embedded_gguf_path
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.backends.llamacpp_check import ensure_decodes
from logtoku_guard.backends.llamacpp_rows import prefill_steps, shadow
from logtoku_guard.errors import BackendError, PromptTooLongError
from logtoku_guard.types import DecodingOptions, to_messages

LONG_A = "Count from one to one hundred, writing every number in words."
LONG_B = "List the numbers from one to one hundred, one per line, in words."
SHORT = "Say hello."


def prompt_tokens(backend: Any, text: str) -> int:
    """Tokens of ``text``'s prompt as the backend feeds it (chat template applied)."""
    return len(backend._prepare(to_messages(text), DecodingOptions()).ids)


@pytest.fixture(scope="module", autouse=True)
def _decodes_here() -> None:
    try:
        ensure_decodes(embedded_gguf_path(), n_threads=2)
    except BackendError as exc:
        pytest.fail(f"the installed llama.cpp cannot decode on this machine: {exc}", pytrace=False)


def waiting(backend: LlamaCppBackend) -> int:
    return backend._batcher.waiting


class Events:
    """What the worker does, in order: ``("end", prompt)`` as a row ends; ``("token", name)`` as a
    watched request gets a token; ``("step", seqs)`` for each ``decode`` call's sequences."""

    def __init__(self, backend: LlamaCppBackend) -> None:
        self.seen: list[tuple[str, Any]] = []
        real = backend._generation

        def record(row: Any) -> Any:
            g = real(row)
            self.seen.append(("end", g.prompt))
            return g

        backend._generation = record  # type: ignore[method-assign]
        decode = backend._model.decode

        def watched(entries: Any) -> Any:
            self.seen.append(("step", tuple(seq for _, _, seq, _ in entries)))
            return decode(entries)

        backend._model.decode = watched  # type: ignore[method-assign,assignment]

    def index(self, event: tuple[str, Any]) -> int:
        return self.seen.index(event)


@pytest.mark.slow
def test_a_request_that_does_not_fit_now_waits_without_blocking_a_short_one_behind_it() -> None:
    backend = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, max_batch=4)
    try:
        long_opts = DecodingOptions(max_new_tokens=100)
        n_a = prompt_tokens(backend, LONG_A)
        n_b = prompt_tokens(backend, LONG_B)
        n_s = prompt_tokens(backend, SHORT)
        cells = backend.context_window  # llama.cpp rounds n_ctx up to a multiple of 256
        assert n_a + 100 + n_b + 100 > cells >= n_a + 100 + n_s + 8  # B cannot sit beside A; the short one can
        alone = {
            p: backend.generate(p, o)
            for p, o in [(LONG_A, long_opts), (LONG_B, long_opts), (SHORT, DecodingOptions(max_new_tokens=8))]
        }
        assert len(alone[LONG_A].tokens) > 40  # A keeps decoding long after the short request is answered
        gate = CallGate(backend._model, "decode")
        events = Events(backend)
        results: dict[str, Any] = {}

        def run(name: str, prompt: str, options: DecodingOptions) -> None:
            on_token = (lambda _row, _t: events.seen.append(("token", name))) if name == "B" else None
            results[name] = backend._run([prompt], options, None, on_token=on_token)[0]

        stream = backend.stream(LONG_A, long_opts)
        tokens = iter(stream)
        next(tokens)  # A is decoding
        threads = [
            threading.Thread(target=run, args=("B", LONG_B, long_opts)),
            threading.Thread(target=run, args=("S", SHORT, DecodingOptions(max_new_tokens=8))),
        ]
        with gate.held():
            for k, t in enumerate(threads, 1):
                t.start()
                wait_until(lambda k=k: waiting(backend) == k, "the request to queue")
        rest = list(tokens)
        for t in threads:
            t.join(300)
        # the short request, queued after B, was answered before B got its first token
        assert events.index(("end", SHORT)) < events.index(("token", "B"))
        assert events.index(("end", SHORT)) < events.index(("end", LONG_A))
        assert stream.generation.text == alone[LONG_A].text and len(rest) + 1 == len(alone[LONG_A].tokens)
        assert results["S"].text == alone[SHORT].text
        assert results["B"].text == alone[LONG_B].text
    finally:
        backend.close()


def test_a_waiting_row_is_not_starved_rows_that_would_delay_it_wait_too() -> None:
    # a 512-cell cache: one running row of 400 cells with 100 steps left; a waiting row needs 300
    steps, spare = shadow([(400, 100)], 512 - 400, 300)
    assert (steps, spare) == (100, 512 - 300)
    assert shadow([(200, 50), (250, 10)], 62, 300) == (10, 12)  # the row ending first frees enough
    assert shadow([(200, 50), (250, 10)], 62, 400) == (50, 112)  # both must end first
    assert shadow([], 512, 100) == (0, 412)
    assert prefill_steps(20, 0, 256) == 1 and prefill_steps(20, 20, 256) == 0 and prefill_steps(20, 0, None) == 1
    assert prefill_steps(1000, 0, 256) > 1000 // 256


def test_a_request_that_cannot_fit_the_cache_is_refused_at_once_naming_the_limit() -> None:
    backend = LlamaCppBackend("embedded", n_threads=1, n_ctx=256)
    try:
        gate = CallGate(backend._model, "decode")
        stream = backend.stream(SHORT, DecodingOptions(max_new_tokens=30))
        tokens = iter(stream)
        next(tokens)
        with gate.held(), ThreadPoolExecutor(1) as pool:
            refused = pool.submit(backend.generate, "word " * 400)
            with pytest.raises(PromptTooLongError, match="context window is 256 tokens"):
                refused.result(60)  # answered while the running batch is held: never queued
            assert waiting(backend) == 0
        list(tokens)
    finally:
        backend.close()


@pytest.mark.slow  # a server on the real GGUF
def test_the_server_answers_a_request_that_cannot_fit_the_cache_with_a_400() -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from support.served import llamacpp_served

    from logtoku_guard.server import BackgroundServer, build_app

    backend = llamacpp_served(n_ctx=256)
    with BackgroundServer(build_app(backend)) as srv:
        body = {"messages": [{"role": "user", "content": "word " * 400}], "max_tokens": 4}
        r = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 400 and "context window is 256 tokens" in r.json()["error"]["message"]
    backend.close()


@pytest.mark.slow
def test_greedy_and_sampled_rows_decode_in_the_same_calls_and_equal_their_alone_answers() -> None:
    backend = LlamaCppBackend("embedded", n_threads=1, n_ctx=1024, max_batch=4)
    try:
        first = ("Count from one to ten.", DecodingOptions(max_new_tokens=24))
        joiners = [
            ("Tell me about Rome.", DecodingOptions(max_new_tokens=8, temperature=0.7, seed=7)),
            ("Hi", DecodingOptions(max_new_tokens=8)),
            ("What is two plus two?", DecodingOptions(max_new_tokens=8)),
        ]
        alone = [backend.generate(p, o) for p, o in [first, *joiners]]
        sampled_again = backend.generate(*joiners[0])
        assert sampled_again.text == alone[1].text  # seeded: reproducible
        gate = CallGate(backend._model, "decode")
        events = Events(backend)
        stream = backend.stream(*first)
        tokens = iter(stream)
        next(tokens)
        with ThreadPoolExecutor(3) as pool:
            with gate.held():
                futures = []
                for k, (p, o) in enumerate(joiners, 1):
                    futures.append(pool.submit(backend.generate, p, o))
                    wait_until(lambda k=k: waiting(backend) == k, "the request to queue")
            list(tokens)
            together = [stream.generation, *(f.result(120) for f in futures)]
        widest = max(len(set(seqs)) for kind, seqs in events.seen if kind == "step")
        assert widest == 4  # the sampled row and the three greedy rows in one decode call
        for a, b in zip(alone, together, strict=True):
            assert [t.id for t in a.tokens] == [t.id for t in b.tokens]
    finally:
        backend.close()
