"""Fairness through the real server: a long prompt cannot stall a short request sent beside it.

A client sends a prompt several chunks long; while the server's worker is held inside that
prompt's first chunk (a gate on the model's decoder, or on llama.cpp's ``decode``), a second
client sends a short question. With chunked prefill the short answer ends before the long prompt
has its first token; prefilled whole (``prefill_chunk=0``, the behaviour before), it waits behind
the whole prefill. The order is read from the backend's own record of its rows as they end, in
its worker thread: no timing is asserted. Both backends.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from support.ended import ended_order  # noqa: E402
from support.gate import CallGate, Gate  # noqa: E402
from support.same import wait_until  # noqa: E402
from support.served import llamacpp_served, tiny_served  # noqa: E402

from logtoku_guard.backends.chunked_prefill import MIN_PREFILL_CHUNK  # noqa: E402
from logtoku_guard.backends.staged import SIDE_THREAD  # noqa: E402
from logtoku_guard.server import BackgroundServer, build_app  # noqa: E402

PASSAGE = "The committee met on a grey morning to review the harbour's tide tables and the ferry timetable. "


@pytest.mark.parametrize("kind", ["transformers", pytest.param("llamacpp", marks=pytest.mark.slow)])  # the real GGUF: slow
@pytest.mark.parametrize("chunk", [MIN_PREFILL_CHUNK, 0], ids=["chunked", "whole (the failure this fixes)"])
def test_a_short_request_is_answered_while_a_long_prompt_is_prefilled(kind: str, chunk: int, tiny_tokenizer: Any) -> None:
    # chunked, the long prompt is fed by a thread of its own (concurrent_prefill, the default): the gate
    # holds that thread only, and the loop answers the short request meanwhile
    if kind == "transformers":
        backend = tiny_served(tiny_tokenizer, max_positions=2048, prefill_chunk=chunk)
        gate: Gate = Gate(backend.model.model, thread=SIDE_THREAD if backend.concurrent_prefill else None)
    else:
        backend = llamacpp_served(prefill_chunk=chunk)
        gate = CallGate(backend._model.side_context() if backend.concurrent_prefill else backend._model, "decode")
    assert backend.concurrent_prefill is bool(chunk)
    long_text = PASSAGE * 30 + "What was reviewed?"
    n_long = backend.count_tokens(backend.render(long_text))
    assert n_long > 4 * MIN_PREFILL_CHUNK
    order = ended_order(backend)
    replies: dict[str, Any] = {}
    with BackgroundServer(build_app(backend)) as srv:
        url = srv.base_url + "/chat/completions"

        def ask(name: str, text: str, max_tokens: int) -> None:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
            replies[name] = httpx.post(url, json=body, timeout=120)

        alone = httpx.post(url, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}).json()
        order.clear()
        long = threading.Thread(target=ask, args=("long", long_text, 1))
        long.start()
        with gate.held():  # the worker waits inside the long prompt's first chunk (or its whole prefill)
            short = threading.Thread(target=ask, args=("short", "Hi", 3))
            short.start()
            if chunk:  # answered while the long prompt's thread is held inside its first chunk
                wait_until(lambda: "short" in replies, "the short request to be answered beside the held long prompt", 120)
            else:  # the worker is held inside the whole prefill: the short request waits in the queue
                wait_until(lambda: backend.requests_waiting == 1, "the short request to reach the batcher")
        long.join(120)
        short.join(120)
    getattr(backend, "close", lambda: None)()
    assert replies["long"].status_code == 200 and replies["short"].status_code == 200
    assert replies["short"].json()["choices"][0]["message"] == alone["choices"][0]["message"]
    n_short = alone["usage"]["prompt_tokens"]
    assert order == ([n_short, n_long] if chunk else [n_long, n_short])
