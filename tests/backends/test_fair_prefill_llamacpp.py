"""The time-budgeted prefill through the real llama.cpp backend (embedded GGUF).

A long prompt is fed in the pieces of :func:`~logtoku_guard.backends.chunked_prefill.piece_at`,
each its own ``llama_decode``, whatever the budget: its answer and question scores are the same bits
under a budget that takes one piece a step and under one that takes them all. A short request sent
while the worker is held inside the long prompt's first piece is answered (as alone) before the long
prompt has its first token. The order is read from the backend's own record of its rows as they
end; no timing is asserted.
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

from logtoku_guard.backends.chunked_prefill import piece_at
from logtoku_guard.backends.embedded import embedded_gguf_path
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.backends.llamacpp_check import ensure_decodes
from logtoku_guard.errors import BackendError, ConfigurationError
from logtoku_guard.types import DecodingOptions

LONG = "The committee met to review the harbour's tide tables. " * 22 + "What was reviewed?"
SHORT = "Hi"


@pytest.fixture(scope="module", autouse=True)
def _decodes_here() -> None:
    try:
        ensure_decodes(embedded_gguf_path(), n_threads=2)
    except BackendError as exc:
        pytest.fail(f"the installed llama.cpp cannot decode on this machine: {exc}", pytrace=False)


def make(budget: float) -> LlamaCppBackend:
    return LlamaCppBackend("embedded", n_threads=2, n_ctx=1024, max_logprobs=5, prefill_budget_s=budget)


def record_calls(backend: LlamaCppBackend) -> list[tuple[int, int, int]]:
    """Each ``llama_decode`` of the backend: (sequence id of its first entry, its first position, its tokens)."""
    calls: list[tuple[int, int, int]] = []
    real = backend._model.decode

    def recording(entries: Any) -> None:
        calls.append((entries[0][2], entries[0][1], len(entries)))
        real(entries)

    backend._model.decode = recording  # type: ignore[method-assign]
    return calls


@pytest.mark.slow  # three prefills of a 300-token prompt
def test_a_long_prompt_gets_the_same_pieces_and_bits_whatever_the_budget_and_a_short_request_goes_first() -> None:
    one_piece, all_pieces = make(1e-6), make(60.0)
    try:
        options = DecodingOptions(max_new_tokens=2)
        results = []
        layouts = []
        for backend in (one_piece, all_pieces):
            calls = record_calls(backend)
            results.append(backend.generate(LONG, options))
            layouts.append([(pos, n) for _, pos, n in calls if n > 1])  # the prompt's calls (decode steps are 1 token)
        n_long = results[0].prompt_tokens
        assert n_long > 256  # longer than prefill_chunk: fed in pieces
        fed = 0
        for pos, n in layouts[0]:
            assert pos == fed and n == min(piece_at(fed), n_long - fed)
            fed += n
        assert fed == n_long and layouts[0] == layouts[1]
        a, b = results
        same = [(t.id, t.top_logits, t.logprob, t.eu) for t in b.tokens]
        assert [(t.id, t.top_logits, t.logprob, t.eu) for t in a.tokens] == same
        assert [(t.index, t.top_logits, t.logprob) for t in a.prompt_scores] == [
            (t.index, t.top_logits, t.logprob) for t in b.prompt_scores
        ]

        # a short request sent while the worker is inside the long prompt's first piece ends first, as alone
        backend = one_piece
        alone = backend.generate(SHORT, DecodingOptions(max_new_tokens=3))
        order = ended_order(backend)
        gate = CallGate(backend._model, "decode")
        got: dict[str, Any] = {}
        long = threading.Thread(target=lambda: got.update(long=backend.generate(LONG, DecodingOptions(max_new_tokens=1))))
        long.start()
        with gate.held():
            short = threading.Thread(target=lambda: got.update(short=backend.generate(SHORT, DecodingOptions(max_new_tokens=3))))
            short.start()
            wait_until(lambda: backend.requests_waiting == 1, "the short request to reach the batcher")
        long.join(300)
        short.join(300)
        assert order == [alone.prompt_tokens, n_long]
        assert [t.id for t in got["short"].tokens] == [t.id for t in alone.tokens]
        assert [t.id for t in got["long"].tokens] == [t.id for t in a.tokens[:1]]
    finally:
        one_piece.close()
        all_pieces.close()


def test_a_bad_budget_is_refused_before_the_model_loads() -> None:
    with pytest.raises(ConfigurationError, match=r"prefill_budget_s must be .*got -1"):
        LlamaCppBackend("embedded", prefill_budget_s=-1)
    b = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, prefill_budget_s=0)
    try:
        assert b.prefill_budget_s is None and b.prefill_chunk == 256  # 0: one fixed chunk a step, as before
    finally:
        b.close()
