"""A positive temperature too small to divide by decodes greedily, on both backends (issue 43, N7).

The reproducer: temperature 1e-38 on transformers gave "vania fourteenth Liu Cassinippm tomb...":
the logits divided by it overflow float32, and the draw is noise. llama.cpp was right at every
value. Now both take the arg-max below :data:`~logtoku_guard.types.GREEDY_BELOW`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from logtoku_guard.types import GREEDY_BELOW, DecodingOptions

TINY = (1e-38, 1e-45, 1e-20, GREEDY_BELOW / 2)


def test_a_tiny_temperature_is_greedy_in_the_options() -> None:
    for t in TINY:
        assert not DecodingOptions(temperature=t).sampling
    assert DecodingOptions(temperature=GREEDY_BELOW).sampling and not DecodingOptions(temperature=0).sampling


@pytest.mark.parametrize("temperature", TINY)
def test_transformers_decodes_a_tiny_temperature_greedily(tiny_backend: Any, temperature: float) -> None:
    greedy = tiny_backend.generate("Count from one to ten", DecodingOptions(max_new_tokens=12))
    tiny = tiny_backend.generate("Count from one to ten", DecodingOptions(max_new_tokens=12, temperature=temperature, seed=3))
    assert [t.id for t in tiny.tokens] == [t.id for t in greedy.tokens]


@pytest.mark.slow  # llama.cpp's smoke check, model load and five decodes: a minute on a busy CPU
def test_llamacpp_agrees() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed: pip install 'logtoku-guard[llamacpp]'")
    from logtoku_guard.backends.embedded import embedded_gguf_path
    from logtoku_guard.backends.llamacpp import LlamaCppBackend
    from logtoku_guard.backends.llamacpp_check import ensure_decodes

    ensure_decodes(embedded_gguf_path(), n_threads=2)
    backend = LlamaCppBackend("embedded", n_threads=2, n_ctx=512)
    try:
        greedy = backend.generate("What is the capital of France?", DecodingOptions(max_new_tokens=8))
        for t in TINY:
            tiny = backend.generate("What is the capital of France?", DecodingOptions(max_new_tokens=8, temperature=t, seed=3))
            assert [x.id for x in tiny.tokens] == [x.id for x in greedy.tokens]
    finally:
        backend.close()
