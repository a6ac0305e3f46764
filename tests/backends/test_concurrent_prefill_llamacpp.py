"""A long prompt prefilled beside the batch on llama.cpp (``concurrent_prefill``, the default).

A prompt longer than ``prefill_chunk`` is fed on a second llama.cpp context on the same weights by a
thread of its own, while the batch's context goes on decoding; once in, its KV cells are copied into
the batch's context and it joins with its first token. What is checked on the real backend
(embedded GGUF): the answer and the question's scores are the bits the in-loop chunks give; the
prompt's calls all go to the side context, in :func:`~logtoku_guard.backends.chunked_prefill.chunk_at`
chunks; a short request sent while the side thread is held inside the long prompt is answered, as
alone, before the long one; a failure there fails that request only; a copy that finds no room waits
and is retried; the copy itself is exact. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

import pytest
from support.ended import ended_order
from support.gate import CallGate
from support.postgres import in_ci
from support.same import wait_until

if importlib.util.find_spec("llama_cpp") is None:  # found without importing: importing loads the native libraries
    if in_ci():
        pytest.fail("llama-cpp-python is not installed: scripts/install.sh --dev must install it under CI", pytrace=False)
    pytest.skip("llama-cpp-python is not installed: pip install 'logtoku-guard[llamacpp]'", allow_module_level=True)

import numpy as np

from logtoku_guard.backends.chunked_prefill import chunk_at
from logtoku_guard.backends.embedded import embedded_gguf_path
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.backends.llamacpp_check import ensure_decodes
from logtoku_guard.backends.llamacpp_model import LlamaModel
from logtoku_guard.errors import BackendError, ConfigurationError
from logtoku_guard.types import DecodingOptions

LONG = "The committee met to review the harbour's tide tables. " * 22 + "What was reviewed?"
SHORT = "Hi"


@pytest.fixture(scope="module", autouse=True)
def _decodes_here() -> None:
    try:
        ensure_decodes(embedded_gguf_path(), n_threads=1)
    except BackendError as exc:
        pytest.fail(f"the installed llama.cpp cannot decode on this machine: {exc}", pytrace=False)


def make(concurrent: bool) -> LlamaCppBackend:
    return LlamaCppBackend("embedded", n_threads=1, n_ctx=1024, max_logprobs=5, concurrent_prefill=concurrent)


def prompt_calls(ctx: Any) -> list[tuple[int, int]]:
    """Each prompt call of ``ctx`` (more than one token): (its first position, its tokens)."""
    calls: list[tuple[int, int]] = []
    real = ctx.decode

    def recording(entries: Any) -> None:
        if len(entries) > 1:
            calls.append((entries[0][1], len(entries)))
        real(entries)

    ctx.decode = recording
    return calls


def bits(g: Any) -> tuple[list[Any], list[Any]]:
    return (
        [(t.id, t.top_logits, t.logprob, t.eu) for t in g.tokens],
        [(t.index, t.top_logits, t.logprob) for t in g.prompt_scores],
    )


def test_a_long_prompt_beside_the_batch_gets_the_loops_bits_and_a_short_request_goes_first() -> None:
    beside, in_loop = make(True), make(False)
    try:
        assert beside.concurrent_prefill and not in_loop.concurrent_prefill
        assert beside._model._side is None  # opened by the first long prompt, not before
        options = DecodingOptions(max_new_tokens=4)
        beside.generate(SHORT, options)
        assert beside._model._side is None  # a short prompt is prefilled in the batch's context

        main_calls = prompt_calls(beside._model)
        side_calls = prompt_calls(beside._model.side_context())
        a = beside.generate(LONG, options)
        b = in_loop.generate(LONG, options)
        n_long = a.prompt_tokens
        assert n_long > 256 and beside.prefill_chunk == 256  # longer than a chunk: fed beside the batch
        assert bits(a) == bits(b) and len(a.prompt_scores) > 200
        assert main_calls == []  # every prompt token went to the side context...
        fed = 0
        for pos, n in side_calls:  # ...in chunk_at's chunks (cut where a call's logits rows run out)
            assert pos == fed
            fed += n
        assert fed == n_long
        starts = {pos for pos, _ in side_calls}
        at = 0
        while at < n_long:
            assert at in starts
            at += chunk_at(at, 256) or n_long

        # a short request sent while the side thread is held inside the long prompt ends first, as alone
        alone = beside.generate(SHORT, DecodingOptions(max_new_tokens=3))
        order = ended_order(beside)
        gate = CallGate(beside._model.side_context(), "decode")
        got: dict[str, Any] = {}
        long = threading.Thread(target=lambda: got.update(long=beside.generate(LONG, options)))
        long.start()
        with gate.held():
            short = threading.Thread(target=lambda: got.update(short=beside.generate(SHORT, DecodingOptions(max_new_tokens=3))))
            short.start()
            wait_until(lambda: "short" in got, "the short request to be answered while the long prompt is held", seconds=120)
        long.join(300)
        short.join(300)
        assert order == [alone.prompt_tokens, n_long]
        assert bits(got["short"])[0] == bits(alone)[0]
        assert bits(got["long"]) == bits(a)
    finally:
        beside.close()
        in_loop.close()


def test_a_failure_in_the_side_prefill_fails_that_request_only() -> None:
    b = make(True)
    try:
        ctx = b._model.side_context()

        def broken(entries: Any) -> None:
            msg = "llama_decode failed with code -3: see llama.cpp's log (verbose=True)"
            raise RuntimeError(msg)

        ctx.decode = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="code -3"):
            b.generate(LONG, DecodingOptions(max_new_tokens=2))
        assert b.generate(SHORT, DecodingOptions(max_new_tokens=2)).tokens  # the backend goes on
    finally:
        b.close()


def test_a_long_prompt_whose_cells_find_no_room_waits_for_it_then_joins() -> None:
    """llama.cpp places a copied sequence's cells side by side; when the batch's cache has no such run,
    the copy is refused, the row waits (no new row admitted) and the copy is tried again each step."""
    b = make(True)
    try:
        options = DecodingOptions(max_new_tokens=3)
        want = b.generate(LONG, options)
        real = b._model.copy_sequence
        tries: list[bool] = []

        def crowded(source: Any, seq: int) -> bool:
            tries.append(len(tries) >= 3)
            return real(source, seq) if tries[-1] else False

        b._model.copy_sequence = crowded  # type: ignore[method-assign]
        got = b.generate(LONG, options)
        assert tries == [False, False, False, True]
        assert bits(got) == bits(want)
    finally:
        b.close()


def test_copy_sequence_moves_a_sequence_exactly_or_says_there_is_no_room() -> None:
    b = LlamaCppBackend("embedded", n_threads=1, n_ctx=512, max_logprobs=5)
    path = b.model_path
    b.close()  # it found (or converted) the default weights' file
    m = LlamaModel(path, n_ctx=1024, n_seq=4, n_threads=1)
    try:
        side = m.side_context()
        assert m.side_context() is side and side.n_ctx == m.n_ctx
        rng = np.random.default_rng(7)
        prompt = [int(t) for t in rng.integers(100, 40000, 600)]
        side.decode([(t, p, 0, False) for p, t in enumerate(prompt)])
        side.decode([(prompt[0], 600, 0, True)])
        want = side.logits_rows([0]).copy()

        m.decode([(t, p, 1, False) for p, t in enumerate(prompt[:500])])  # 500 of 1,024 cells taken
        assert m.copy_sequence(side, 0) is False  # 600 side by side do not fit
        m.forget(1)
        side.forget(0)
        side.decode([(t, p, 0, False) for p, t in enumerate(prompt)])
        assert m.copy_sequence(side, 0) is True
        m.decode([(prompt[0], 600, 0, True)])
        assert np.array_equal(m.logits_rows([0]), want)  # decodes there as it would have here
    finally:
        m.close()


def test_concurrent_prefill_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"concurrent_prefill must be True, False or None .*got 'yes'"):
        LlamaCppBackend("embedded", concurrent_prefill="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"prefill_budget_s=0.2 .* concurrent_prefill=True .* pass one of them"):
        LlamaCppBackend("embedded", prefill_budget_s=0.2, concurrent_prefill=True)
    budgeted = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, prefill_budget_s=0.2)
    whole = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, prefill_chunk=0)
    try:
        assert budgeted.concurrent_prefill is False  # a budget shares the loop's time: in the loop
        assert whole.concurrent_prefill is False  # no chunking: every prompt whole, in the loop
    finally:
        budgeted.close()
        whole.close()
