"""LlamaCppBackend on the real embedded model (SmolLM2-135M-Instruct, the default F16 weights converted once
from the shipped Q4_1 GGUF): loads in under a second.

Each step's scores are checked against the raw logits that a reference loop reads from the same
llama.cpp context (the same decode calls, one sequence), and the greedy tokens against llama.cpp's
own greedy sampler on those logits. Skipped only where llama-cpp-python is not installed
(``pip install 'logtoku-guard[llamacpp]'``; ``scripts/install.sh --dev`` installs it, so CI runs these,
and under CI a missing llama-cpp-python fails them).

Nothing here decodes in the test process before the smoke check of ``llamacpp_check`` has decoded
in a child process: a build this CPU cannot run fails these tests with the signal and the rebuild,
instead of killing pytest before its summary line.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from pathlib import Path
from typing import Any

import pytest
from support.postgres import in_ci

if importlib.util.find_spec("llama_cpp") is None:  # found without importing: importing loads the native libraries
    if in_ci():
        pytest.fail("llama-cpp-python is not installed: scripts/install.sh --dev must install it under CI", pytrace=False)
    pytest.skip("llama-cpp-python is not installed: pip install 'logtoku-guard[llamacpp]'", allow_module_level=True)

import numpy as np
import torch

from logtoku_guard.backends.base import Backend
from logtoku_guard.backends.embedded import embedded_gguf_path
from logtoku_guard.backends.llamacpp import LlamaCppBackend, llamacpp_model_name
from logtoku_guard.backends.llamacpp_check import ensure_decodes
from logtoku_guard.backends.llamacpp_rows import question_positions
from logtoku_guard.errors import BackendError, ConfigurationError, ModelLoadError, PromptTooLongError
from logtoku_guard.scoring.uncertainty import logsumexp_entropy, rescore
from logtoku_guard.types import DecodingOptions, to_messages

QUESTION = "What is the capital of France?"
GREEDY = DecodingOptions(max_new_tokens=12)


@pytest.fixture(scope="module", autouse=True)
def _decodes_here() -> None:
    """Every test here stands behind the smoke check (the reference loop below calls llama_cpp directly)."""
    try:
        ensure_decodes(embedded_gguf_path(), n_threads=2)
    except BackendError as exc:
        pytest.fail(f"the installed llama.cpp cannot decode on this machine: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def backend() -> Any:
    b = LlamaCppBackend("embedded", n_threads=2, n_ctx=1024, max_logprobs=5)
    yield b
    b.close()


def reference(b: LlamaCppBackend, prompt: str, steps: int) -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """Greedy decoding with llama.cpp's own greedy sampler on the backend's context, one sequence.

    Returns each step's raw logits, the sampler's tokens, and the prefill's logits at the positions
    that predict the question's tokens (as the backend asks for them).
    """
    import llama_cpp

    prepared = b._prepare(to_messages(prompt), DecodingOptions(max_new_tokens=steps))
    ids, kept = prepared.ids, question_positions(prepared)
    m = b._model
    sampler = llama_cpp.llama_sampler_init_greedy()
    logits: list[np.ndarray] = []
    tokens: list[int] = []
    prompt_logits: list[np.ndarray] = []
    with b._lock:
        try:
            entries = [(t, p, 0, p in kept or p == len(ids) - 1) for p, t in enumerate(ids)]
            m.decode(entries)
            for p in kept:
                prompt_logits.append(_read(m, p))
            last, pos = len(ids) - 1, len(ids)
            for _ in range(steps):
                logits.append(_read(m, last))
                token = int(llama_cpp.llama_sampler_sample(sampler, m.ctx, last))
                if token in b._eos_ids:
                    break
                tokens.append(token)
                m.decode([(token, pos, 0, True)])
                last, pos = 0, pos + 1
        finally:
            m.clear()
            llama_cpp.llama_sampler_free(sampler)
    return logits, tokens, prompt_logits


def _read(m: Any, index: int) -> np.ndarray:
    out = np.empty(m.n_vocab, dtype=np.float32)
    m.logits_into(index, out)
    return out


def test_is_a_backend_with_a_name_of_its_own(backend: LlamaCppBackend) -> None:
    assert isinstance(backend, Backend)
    assert backend.model_name == "smollm2-135m-instruct-f16@llamacpp" and backend.k == 2 and backend.evidence == "clamped"
    assert backend.vocab_size == 49152 and backend.max_logprobs == 5 and backend.context_window == 1024
    assert llamacpp_model_name("embedded") == backend.model_name  # the name the evaluation's caches use, unloaded


def test_flash_attention_turned_off_is_the_same_model_computed_another_way(backend: LlamaCppBackend) -> None:
    """``LlamaModel(flash_attn=False)`` reaches llama.cpp's context (its logits are not the default's bit for
    bit) and computes the same model (within float rounding); None keeps llama.cpp's own choice."""
    from logtoku_guard.backends.llamacpp_model import LlamaModel, LlamaTokenizer

    rows = {}
    for setting in (None, False, True):
        m = LlamaModel(backend.model_path, n_ctx=256, n_seq=1, n_threads=1, flash_attn=setting)
        try:
            ids = LlamaTokenizer(m).encode("The committee met on a grey morning to review the harbour's tide tables, and")
            m.decode([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
            rows[setting] = _read(m, len(ids) - 1)
        finally:
            m.close()
    assert np.array_equal(rows[None], rows[True])  # llama.cpp's "auto" is on for this CPU build
    assert not np.array_equal(rows[None], rows[False])
    assert float(np.abs(rows[None] - rows[False]).max()) < 0.05 and rows[None].argmax() == rows[False].argmax()
    with pytest.raises(ConfigurationError, match=r"flash_attn must be True, False or None .*'off'"):
        LlamaModel(backend.model_path, n_ctx=256, n_seq=1, n_threads=1, flash_attn="off")  # type: ignore[arg-type]


def test_the_backend_leaves_flash_attention_to_llama_cpp_unless_told(backend: LlamaCppBackend) -> None:
    """Its context computes as ``LlamaModel`` with llama.cpp's choice does, bit for bit; ``flash_attn=False``
    reaches its own context (long prompts: ``benchmarks/bench_llamacpp.py --parts flash_attn``)."""
    from logtoku_guard.backends.llamacpp_model import LlamaModel

    ids = backend._prepare(to_messages("Who wrote Hamlet?"), DecodingOptions(max_new_tokens=1)).ids

    def first_logits(m: Any) -> np.ndarray:
        try:
            m.decode([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
            return _read(m, len(ids) - 1)
        finally:
            m.clear()

    ours = first_logits(backend._model)
    off = LlamaCppBackend("embedded", n_threads=1, n_ctx=backend._model.n_ctx, flash_attn=False)
    try:
        ours_off = first_logits(off._model)
    finally:
        off.close()
    rows = {}
    for setting in (None, False):
        fresh = LlamaModel(backend.model_path, n_ctx=backend._model.n_ctx, n_seq=16, n_threads=1, flash_attn=setting)
        try:
            rows[setting] = first_logits(fresh)
        finally:
            fresh.close()
    assert np.array_equal(ours, rows[None]) and np.array_equal(ours_off, rows[False])
    assert not np.array_equal(ours, ours_off)


def test_the_name_found_without_loading_is_the_name_each_kind_of_model_gets_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """One function names a llama.cpp model for the backend and for ``eval``'s caches (they were twins, and
    differed on files and packaged models); it reads no file and converts nothing."""
    monkeypatch.delenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", raising=False)
    assert llamacpp_model_name(None) == "smollm2-135m-instruct-f16@llamacpp"
    assert llamacpp_model_name("embedded", weights="q4_1") == "smollm2-135m-instruct@llamacpp"
    assert llamacpp_model_name("default", weights="Q8_0") == "smollm2-135m-instruct-q8_0@llamacpp"
    assert llamacpp_model_name("gemma3-270m") == "gemma-3-270m-q4_k_m@llamacpp"  # its file's name, not assembled
    assert llamacpp_model_name(Path("/nowhere/My.Model.gguf")) == "My.Model@llamacpp"
    with pytest.raises(ConfigurationError, match="'q3'"):
        llamacpp_model_name("embedded", weights="q3")


@pytest.mark.slow
def test_scores_equal_the_library_maths_on_the_raw_logits_and_greedy_equals_llama_cpp_sampler(backend: LlamaCppBackend) -> None:
    g = backend.generate(QUESTION, GREEDY)
    logits, tokens, _ = reference(backend, QUESTION, GREEDY.max_new_tokens)
    assert [t.id for t in g.tokens] == tokens  # llama.cpp's own greedy sampler, token for token
    # F16 answers "The capital of France is Paris." and stops (the sampler reached an end token first)
    assert 0 < len(g.tokens) <= 12 and g.finish_reason == ("length" if len(tokens) == 12 else "stop")
    assert g.text == backend.tokenizer.decode(tokens)
    for t, z in zip(g.tokens, logits):
        order = np.argsort(-z, kind="stable")
        assert t.top_ids == tuple(int(i) for i in order[:2]) and t.top_logits == tuple(float(v) for v in z[order[:2]])
        assert t.alt_ids == tuple(int(i) for i in order[:5]) and t.alt_logits == tuple(float(v) for v in z[order[:5]])
        expected = rescore(
            [t.top_logits]
        )  # logtoku_guard.scoring.uncertainty on the same logits (float64; the digamma series ~1e-11)
        assert t.au == pytest.approx(float(expected.au[0]), abs=1e-9) and t.eu == pytest.approx(float(expected.eu[0]), abs=1e-12)
        lse, entropy = logsumexp_entropy(torch.from_numpy(z).double())
        assert t.logprob == pytest.approx(float(z[t.id]) - float(lse), abs=1e-4)
        assert t.entropy == pytest.approx(float(entropy), abs=1e-4)


def test_prompt_scores_are_the_question_tokens_scored_from_the_prefill(backend: LlamaCppBackend) -> None:
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=1))
    _, _, prompt_logits = reference(backend, QUESTION, 1)
    assert "".join(t.text for t in g.prompt_scores) == QUESTION
    assert len(g.prompt_scores) == len(prompt_logits) > 3
    ids = backend.tokenizer.encode(backend.render(QUESTION))
    for t, z in zip(g.prompt_scores, prompt_logits):
        order = np.argsort(-z, kind="stable")[:2]
        assert t.top_logits == pytest.approx([float(v) for v in z[order]], abs=1e-6)
        assert t.id in ids and t.logprob <= 0.0 and 0.0 < t.eu <= 1.0
    backend.score_prompt = False
    try:
        assert backend.generate(QUESTION, DecodingOptions(max_new_tokens=1)).prompt_scores == ()
    finally:
        backend.score_prompt = True


def test_stop_string_cuts_the_answer(backend: LlamaCppBackend) -> None:
    full = backend.generate(QUESTION, GREEDY)
    stop = full.text[4:7]
    assert stop and stop in full.text
    g = backend.generate(QUESTION, GREEDY.replace(stop=(stop,)))
    assert g.text == full.text[: full.text.find(stop)] and g.finish_reason == "stop" and g.stop_sequence == stop


def test_stream_yields_each_token_with_scores_then_the_generation(backend: LlamaCppBackend) -> None:
    full = backend.generate(QUESTION, GREEDY)
    with backend.stream(QUESTION, GREEDY) as stream:
        tokens = list(stream)
    assert [t.id for t in tokens] == [t.id for t in full.tokens]
    assert all(0.0 < t.eu <= 1.0 and t.au >= 0.0 for t in tokens)
    assert stream.generation.text == full.text and stream.generation.tokens == full.tokens


def test_close_cancels_mid_stream(backend: LlamaCppBackend) -> None:
    stream = backend.stream(QUESTION, DecodingOptions(max_new_tokens=200))
    it = iter(stream)
    first = [next(it), next(it)]
    stream.close()
    g = stream.generation
    assert g.finish_reason == "cancelled" and 2 <= len(g.tokens) < 200 and g.tokens[:2] == tuple(first)
    assert backend.generate(QUESTION, DecodingOptions(max_new_tokens=3)).finish_reason == "length"  # the model is free


def test_batch_rows_are_llama_cpp_sequences_with_the_answers_of_each_alone(backend: LlamaCppBackend) -> None:
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "2+2?"}]
    prompts = [QUESTION, "Name a colour.", chat]
    alone = [backend.generate(p, GREEDY) for p in prompts]
    together = backend.batch(prompts, GREEDY)
    for a, b in zip(alone, together):
        assert [t.id for t in b.tokens] == [t.id for t in a.tokens]
        assert [t.eu for t in b.tokens] == pytest.approx([t.eu for t in a.tokens], abs=1e-3)
        assert b.prompt == a.prompt and len(b.prompt_scores) == len(a.prompt_scores)
    with pytest.raises(ConfigurationError, match="non-empty list"):
        backend.batch([])


def test_two_threads_share_the_model(backend: LlamaCppBackend) -> None:
    prompts = [QUESTION, "Name a colour."]
    expected = [backend.generate(p, GREEDY).text for p in prompts]
    got: dict[int, str] = {}
    errors: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            got[i] = backend.generate(prompts[i], GREEDY).text
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and [got[0], got[1]] == expected


def test_seeded_sampling_repeats_and_top_p_one_token_is_greedy(backend: LlamaCppBackend) -> None:
    opts = DecodingOptions(max_new_tokens=8, temperature=1.2, seed=7)
    a, b = backend.generate(QUESTION, opts), backend.generate(QUESTION, opts)
    assert [t.id for t in a.tokens] == [t.id for t in b.tokens]
    tiny_p = backend.generate(QUESTION, DecodingOptions(max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1))
    assert tiny_p.text == backend.generate(QUESTION, DecodingOptions(max_new_tokens=8)).text


def test_bad_arguments_name_the_value(backend: LlamaCppBackend, tmp_path: Any) -> None:
    with pytest.raises(ModelLoadError, match=r"nope\.bin"):
        LlamaCppBackend(tmp_path / "nope.bin")
    with pytest.raises(ConfigurationError, match="n_ctx"):
        LlamaCppBackend("embedded", n_ctx=0)
    with pytest.raises(ConfigurationError, match="n_threads"):
        LlamaCppBackend("embedded", n_threads=-1)
    with pytest.raises(PromptTooLongError):
        backend.generate("word " * 1100, GREEDY)


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from logtoku_guard.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    with pytest.raises(MissingDependencyError, match=r"logtoku-guard\[llamacpp\]"):
        LlamaCppBackend("embedded")


@pytest.mark.slow
def test_the_server_answers_over_this_backend(backend: LlamaCppBackend) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from logtoku_guard.backends.openai_compat import OpenAICompatibleBackend
    from logtoku_guard.server import BackgroundServer, build_app

    local = backend.generate(QUESTION, GREEDY)
    with BackgroundServer(build_app(backend)) as srv:
        with OpenAICompatibleBackend(srv.base_url, backend.model_name) as remote:
            got = remote.generate(QUESTION, GREEDY)
        r = httpx.post(
            f"{srv.base_url}/chat/completions",
            json={
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 4,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 2,
            },
            timeout=60,
        )
    assert got.text == local.text and [t.id for t in got.tokens] == [t.id for t in local.tokens]
    assert [t.au for t in got.tokens] == pytest.approx([t.au for t in local.tokens], abs=1e-4)
    body = r.json()
    assert r.status_code == 200 and body["model"] == backend.model_name
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and len(content[0]["top_logprobs"]) == 2 and math.isfinite(content[0]["logprob"])
    assert content[0]["token"] == local.tokens[0].text


@pytest.mark.slow
def test_renders_the_same_prompt_text_and_tokens_as_the_transformers_backend(
    backend: LlamaCppBackend, embedded_cache: Any
) -> None:
    from transformers import AutoTokenizer

    from logtoku_guard.backends.embedded import ensure_embedded_model

    tok = AutoTokenizer.from_pretrained(ensure_embedded_model(embedded_cache))
    prompts: list[Any] = [
        QUESTION,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Où est la tour Eiffel ? 🗼"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "  spaces\tand\nlines  "},
        ],
    ]
    for p in prompts:
        turns = [{"role": m.role, "content": m.content} for m in to_messages(p)]
        text = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        assert backend.render(p) == text
        assert backend.tokenizer.encode(text) == tok(text, add_special_tokens=False)["input_ids"]
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        assert backend.tokenizer.offsets(text, enc["input_ids"]) == [tuple(o) for o in enc["offset_mapping"]]


def test_importing_the_backend_module_does_not_import_llama_cpp_and_generating_imports_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, logtoku_guard.backends.llamacpp, logtoku_guard.backends as b; b.LlamaCppBackend; "
        "print('llama_cpp' in sys.modules, 'torch' in sys.modules); "
        "from logtoku_guard.types import DecodingOptions; "
        "g = b.LlamaCppBackend('embedded', n_threads=1).generate('Hi', DecodingOptions(max_new_tokens=3)); "
        "print(len(g.tokens), 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "3", "False", "False"]


TORCH_FREE = """
import json, sys
from typer.testing import CliRunner
from logtoku_guard import Guard
from logtoku_guard.backends.llamacpp import LlamaCppBackend
from logtoku_guard.calibration import load_profile_for
from logtoku_guard.cli import app
from logtoku_guard.types import DecodingOptions
b = LlamaCppBackend("embedded", n_threads=1, n_ctx=1024)
opts = DecodingOptions(max_new_tokens=4)
g = b.generate("What is the capital of France?", opts)
streamed = list(b.stream("Hi", opts))
rows = b.batch(["Hi", "Name a colour."], opts)
guard = Guard(b, profile=load_profile_for(b.model_name), options=opts)
result = guard.run("Who founded the Velmora Institute of Marine Acoustics?")
with guard.stream("What is 2 + 2?") as s:
    for _ in s:
        pass
args = ["Hi", "--backend", "llamacpp", "--max-new-tokens", "3"]
codes = [CliRunner().invoke(app, [cmd, *args]).exit_code for cmd in ("ask", "score")]
print(json.dumps({"reliability": g.score.reliability, "action": result.action, "rows": len(rows), "codes": codes,
                  "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


@pytest.mark.slow  # a fresh interpreter runs the whole path
def test_generating_scoring_deciding_and_the_cli_import_no_torch(tmp_path: Any) -> None:
    """The whole llama.cpp path (load, generate, stream, batch, the response score, a guard's decision
    and stream, ``ask``/``score --backend llamacpp``) runs without torch: a process stays ~200 MiB smaller."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "LOGTOKU_GUARD_CACHE": str(tmp_path)}  # ask's audit store goes there
    proc = subprocess.run([sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["codes"] == [0, 0] and out["rows"] == 2
    assert math.isfinite(out["reliability"]) and out["action"] in {"pass", "warn", "abstain", "retrieve"}


def test_score_command_with_backend_llamacpp(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(tmp_path))
    res = CliRunner().invoke(app, ["score", QUESTION, "--backend", "llamacpp", "--max-new-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["model"] == "smollm2-135m-instruct-f16@llamacpp" and len(data["tokens"]) == 4
    assert (
        data["profile"] is not None and "smollm2-135m-instruct-f16_llamacpp" in data["profile"]
    )  # the shipped llama.cpp profile


def test_langchain_and_llamaindex_adapters_take_this_backend(backend: LlamaCppBackend) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from langchain_logtoku import ChatLogTokU
    from llama_index.llms.logtoku import LogTokULLM

    local = backend.generate(QUESTION, DecodingOptions(max_new_tokens=6)).text
    message = ChatLogTokU(backend=backend, max_tokens=6).invoke(QUESTION)
    assert message.content == local and message.response_metadata["model_name"] == backend.model_name
    assert LogTokULLM(backend=backend, max_new_tokens=6).complete(QUESTION).text == local


def test_a_forced_tool_call_is_valid_and_scored_on_the_raw_logits(backend: LlamaCppBackend) -> None:
    pytest.importorskip("llguidance")
    import json

    from logtoku_guard.tools.constraints import ToolCalls, call_spans

    city = {"properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": city}}]
    g = backend.generate(QUESTION, DecodingOptions(max_new_tokens=40, constraint=ToolCalls(tools, "get_weather")))
    assert g.finish_reason == "stop" and g.text.startswith("<tool_call>") and g.text.endswith("</tool_call>"), g.text
    ((start, end),) = call_spans(g.text)
    assert json.loads(g.text[start:end])["name"] == "get_weather"
    free = backend.generate(QUESTION, DecodingOptions(max_new_tokens=1))
    first, model_first = g.tokens[0], free.tokens[0]
    assert first.id != model_first.id  # the grammar forced '<' where the model wanted another token
    assert first.top_ids == model_first.top_ids and first.top_logits == model_first.top_logits  # recorded before the mask
    assert (first.au, first.eu) == (model_first.au, model_first.eu)


@pytest.fixture(scope="module")
def q4_1_backend() -> Any:
    b = LlamaCppBackend("embedded", n_threads=2, n_ctx=1024, max_logprobs=5, weights="q4_1")
    yield b
    b.close()


@pytest.mark.parametrize("weights", ["q4_1", "f16"])
def test_a_row_admitted_while_another_decodes_gets_its_answer_alone(
    backend: LlamaCppBackend, q4_1_backend: LlamaCppBackend, weights: str
) -> None:
    """A request that arrives mid-answer joins the running batch (its prompt prefilled alone, then decoded
    in the same ``llama_decode`` calls as the first row); both answers equal each one's alone.

    Bit for bit on the shipped Q4_1 file (llama.cpp multiplies Q4_1 row by row on x86, one kernel for
    one row or two). On F16, the default, two rows go through llama.cpp's batched matrix kernel, which
    sums in another order than one row's: the same tokens, logits within float rounding (as the
    transformers backend's batched rows)."""
    backend = q4_1_backend if weights == "q4_1" else backend
    long_opts, short_opts = DecodingOptions(max_new_tokens=40), GREEDY
    alone_long = backend.generate(QUESTION, long_opts)
    alone_short = backend.generate("Name a colour.", short_opts)
    model = backend._model
    calls: list[set[int]] = []
    decode = model.decode

    def recording(entries: Any) -> None:
        calls.append({seq for _, _, seq, _ in entries})
        decode(entries)

    model.decode = recording
    try:
        with backend.stream(QUESTION, long_opts) as first:
            it = iter(first)
            head = [next(it), next(it)]
            joined = backend.generate("Name a colour.", short_opts)
            rest = list(it)
    finally:
        del model.decode  # the instance attribute shadowed the method
    assert any(len(seqs) == 2 for seqs in calls)  # the two rows were decoded together
    for got, alone in (([*head, *rest], alone_long.tokens), (list(joined.tokens), alone_short.tokens)):
        assert [t.id for t in got] == [t.id for t in alone]
        if weights == "q4_1":
            assert [t.top_logits for t in got] == [t.top_logits for t in alone]  # bit for bit: cells in order, < 256 in use
            assert [(t.au, t.eu) for t in got] == [(t.au, t.eu) for t in alone]
        else:
            np.testing.assert_allclose([t.top_logits for t in got], [t.top_logits for t in alone], rtol=0, atol=0.02)
            np.testing.assert_allclose([(t.au, t.eu) for t in got], [(t.au, t.eu) for t in alone], rtol=0, atol=1e-3)


@pytest.mark.slow  # seconds of prefill per case
@pytest.mark.parametrize("where", ["question", "system"], ids=["long question", "long system prompt"])
def test_a_long_prompt_fed_in_chunks_gets_the_scores_of_one_whole_prefill(backend: LlamaCppBackend, where: str) -> None:
    """Chunks of 128 tokens or more (the smallest accepted, ``prefill_budget_s=0``) leave llama.cpp's
    logits as one whole prefill gives them, but for the rounding of another ubatch split (measured
    here: 0.03 in log p with the long question, up to 0.17 with the long system prompt, as changing
    ``n_ubatch`` does), and the same greedy tokens. A time-budgeted prefill (``prefill_budget_s=0.2``) feeds
    pieces of 32 tokens or fewer (``chunked_prefill.piece_at``), which ggml rounds as it rounds
    short ubatches: up to 0.5 in log p from one whole prefill (chunks of 32 or 64 tokens moved it
    as much), the same greedy tokens, and the same bits whatever the budget and the load
    (``test_fair_prefill_llamacpp.py``).
    The question's scores are taken call by call across the chunks, each token once, in order."""
    passage = "Retrieval augmented generation adds context before answering a question. " * 65
    question, system = (passage + "What does it add?", None) if where == "question" else ("What does it add?", passage)
    options = DecodingOptions(max_new_tokens=8)
    assert backend.prefill_chunk == 256
    results = [backend.generate(question, options, system=system)]
    for chunk, budget in ((0, 0.0), (128, 0.0), (256, 0.2)):
        other = LlamaCppBackend("embedded", n_threads=2, n_ctx=1024, max_logprobs=5, prefill_chunk=chunk, prefill_budget_s=budget)
        try:
            results.append(other.generate(question, options, system=system))
        finally:
            other.close()
    chunked, whole, small, pieces = results
    assert whole.prompt_tokens > 3 * 256
    assert len(whole.prompt_scores) > (3 * 256 if where == "question" else 3)
    for g, logprob, eu in ((chunked, 0.25, 2e-3), (small, 0.25, 2e-3), (pieces, 0.6, 5e-3)):
        assert [t.id for t in g.tokens] == [t.id for t in whole.tokens]
        assert [(t.index, t.id, t.text) for t in g.prompt_scores] == [(t.index, t.id, t.text) for t in whole.prompt_scores]
        for x, y in zip((*g.tokens, *g.prompt_scores), (*whole.tokens, *whole.prompt_scores)):
            assert x.logprob == pytest.approx(y.logprob, abs=logprob) and x.eu == pytest.approx(y.eu, abs=eu)


@pytest.mark.parametrize("concurrent", [True, False], ids=["beside the batch", "in the loop"])
def test_a_long_prompt_cancelled_while_fed_in_chunks_ends_at_once(concurrent: bool) -> None:
    """The client goes away during the first chunk: no chunk is fed after it, the row ends
    ``"cancelled"`` with no tokens, and the next request is answered. Beside the batch the chunks
    run on the side context (its thread stops at the chunk's end), in the loop on the batch's."""
    from support.gate import CallGate

    b = LlamaCppBackend("embedded", n_threads=2, n_ctx=1024, max_logprobs=5, prefill_chunk=128, concurrent_prefill=concurrent)
    try:
        assert b.concurrent_prefill is concurrent
        calls: list[int] = []
        ctx = b._model.side_context() if concurrent else b._model
        real = ctx.decode
        ctx.decode = lambda entries: (calls.append(len(entries)), real(entries))[1]  # type: ignore[method-assign]
        gate = CallGate(ctx, "decode")
        stream = b.stream("Retrieval augmented generation adds context. " * 60 + "Why?", DecodingOptions(max_new_tokens=40))
        with gate.held():
            stream._cancel()  # close() would wait for the end
            fed = len(calls)
        stream.close()
        g = stream.generation
        assert g.finish_reason == "cancelled" and g.tokens == ()
        assert len(calls) == fed + 1  # the chunk held when it was cancelled, none after it
        assert b.generate(QUESTION, GREEDY).text
    finally:
        b.close()


def test_a_model_that_wants_bos_gets_it_once(backend: LlamaCppBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma's GGUF asks for BOS (``tokenizer.ggml.add_bos_token``; without it Gemma 3 answers
    "??????"); SmolLM2's does not. A prompt gets BOS first when its model wants it and its
    template wrote none, and the question's token positions move with it."""
    tok = backend._tokenizer
    assert tok.add_bos is False  # the embedded model's GGUF
    monkeypatch.setattr(backend, "_render", lambda messages: "Question: " + messages[-1].content)  # no template, no BOS
    plain = backend._prepare(to_messages(QUESTION), GREEDY)
    assert plain.ids[0] != tok.bos_token_id
    monkeypatch.setattr(tok, "add_bos", True)
    with_bos = backend._prepare(to_messages(QUESTION), GREEDY)
    assert with_bos.ids == [tok.bos_token_id, *plain.ids]
    assert plain.span is not None and with_bos.span is not None
    moved = (with_bos.span.start - 1, with_bos.span.end - 1, with_bos.span.texts)
    assert moved == (plain.span.start, plain.span.end, plain.span.texts)
    bos_text = tok.token_text(tok.bos_token_id)
    monkeypatch.setattr(backend, "_render", lambda messages: f"{bos_text}Question: Hi")
    assert backend._prepare(to_messages("Hi"), GREEDY).ids.count(tok.bos_token_id) == 1  # the template wrote it: not twice


def test_the_shipped_q4_1_guard_flags_the_answer_to_france_that_is_not_about_france(q4_1_backend: LlamaCppBackend) -> None:
    """Round 3: llama.cpp on the shipped Q4_1 file answered "What is the capital of France?" with
    "L'Étoile, la Marseillaise, la femme au martyre..." (a near-tie at the first token) and the guard
    then shipped passed it (guard_score 0.545). The guard refit on both question styles flags it.
    Should another build answer otherwise at that near-tie, the answer must name Paris and pass."""
    from logtoku_guard import Guard, default_policy
    from logtoku_guard.calibration import load_profile_for

    backend = q4_1_backend
    assert backend.model_name == "smollm2-135m-instruct@llamacpp"  # the shipped file keeps its name and guard
    profile = load_profile_for(backend.model_name, backend.k, backend.evidence)
    guard = Guard(backend, default_policy(), profile=profile, options=DecodingOptions(max_new_tokens=64))
    result = guard.run(QUESTION)
    first = result.attempts[0]
    if first.generation.text.startswith("L'"):
        assert first.decision.action == "retrieve" and result.action == "abstain", result.reason
        assert first.decision.stats.question_echo == 0.0  # nothing of the question in the answer
    else:
        assert "Paris" in first.generation.text and result.action == "pass", first.generation.text


@pytest.mark.slow  # converts the embedded model to F16 in a fresh cache (seconds), checks the build, answers
def test_ask_with_the_default_weights_answers_the_readme_question_with_paris_and_passes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: `ask --backend llamacpp "What is the capital of France?"` answered "L'Étoile..." on the
    shipped Q4_1 weights and abstained. The default weights are now F16 (float activations, as the
    transformers backend computes): the answer is Paris, and the guard fitted on F16's own answers passes it."""
    import json

    from typer.testing import CliRunner

    from logtoku_guard.cli import app

    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(tmp_path))
    monkeypatch.delenv("LOGTOKU_GUARD_LLAMACPP_WEIGHTS", raising=False)
    res = CliRunner().invoke(app, ["ask", QUESTION, "--backend", "llamacpp", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["model"] == "smollm2-135m-instruct-f16@llamacpp"
    assert data["answer"] == "The capital of France is Paris." and data["action"] == "pass", (data["answer"], data["reason"])
    assert [p.name.endswith(".f16.gguf") for p in (tmp_path / "models").iterdir()] == [True]  # converted once, here


@pytest.mark.slow  # converts the embedded model (seconds) and loads the copy
def test_q8_0_weights_are_a_model_of_their_own_that_reuses_no_profile(tmp_path: Any) -> None:
    """weights='q8_0' runs llama.cpp's Q8_0 copy of the embedded model (converted once into the cache)
    under a name of its own, so the profile and guard fitted on the shipped Q4_1 outputs are not used for it."""
    from logtoku_guard.calibration import load_profile_for

    b = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, weights="q8_0", cache_dir=tmp_path)
    try:
        assert b.model_name == "smollm2-135m-instruct-q8_0@llamacpp"
        assert b.model_path.parent == tmp_path / "models" and b.model_path.name.endswith(".q8_0.gguf")
        assert b._model.metadata("general.file_type") == "7"  # LLAMA_FTYPE_MOSTLY_Q8_0
        assert load_profile_for("smollm2-135m-instruct@llamacpp", 2, "clamped") is not None  # the shipped one
        assert load_profile_for(b.model_name, b.k, b.evidence, cache_dir=tmp_path) is None
        g = b.generate(QUESTION, GREEDY)
        assert g.model == b.model_name and len(g.tokens) > 0 and g.prompt_scores
    finally:
        b.close()
    with pytest.raises(ConfigurationError, match=r"weights='q8_0' converts the embedded model only"):
        LlamaCppBackend(embedded_gguf_path(), weights="q8_0")


def test_logits_rows_read_llama_cpp_s_buffer_in_place_and_copy_rows_that_are_apart(backend: LlamaCppBackend) -> None:
    """The question's prefill rows are scored from llama.cpp's own buffer (a view: no copy per row);
    rows with another output between them come back as a copy; both equal logits_into's rows."""
    m = backend._model
    ids = backend.tokenizer.encode(backend.render(QUESTION))
    wanted = {3, 4, 5, 6, 9, len(ids) - 1}
    with backend._lock:
        try:
            m.decode([(t, p, 0, p in wanted) for p, t in enumerate(ids)])
            one = np.empty(m.n_vocab, dtype=np.float32)
            rows = {}
            for i in sorted(wanted):
                m.logits_into(i, one)
                rows[i] = one.copy()
            view = m.logits_rows([3, 4, 5, 6])
            assert not view.flags.owndata and view.shape == (4, m.n_vocab)  # llama.cpp's memory
            assert all(np.array_equal(view[j], rows[i]) for j, i in enumerate([3, 4, 5, 6]))
            apart = m.logits_rows([5, 9])  # entry 6 asked for logits too: not side by side
            assert apart.flags.owndata and np.array_equal(apart[0], rows[5]) and np.array_equal(apart[1], rows[9])
            assert m.logits_rows([]).shape == (0, m.n_vocab)
        finally:
            m.clear()


@pytest.mark.slow  # converts the embedded model to F16 (270 MB, seconds) and loads it
def test_f16_weights_answer_the_readme_question_as_the_transformers_backend_does(tmp_path: Any) -> None:
    """The shipped Q4_1 answers "What is the capital of France?" with "L'Étoile..." (issue 42): the prompt's
    ids are those of the transformers backend, and the first token is a near-tie ("L" 24.74 against "The"
    24.65) that llama.cpp's 8-bit activations tip. With F16 weights (float activations) llama.cpp tips it
    as transformers' float32 does ("The" 25.29 against "L" 25.23) and answers Paris."""
    b = LlamaCppBackend("embedded", n_threads=1, n_ctx=256, weights="f16", cache_dir=tmp_path)
    try:
        g = b.generate(QUESTION, DecodingOptions(max_new_tokens=16))
        assert g.model == "smollm2-135m-instruct-f16@llamacpp"
        assert g.text.startswith("The capital of France is Paris"), g.text
        first = g.tokens[0]
        assert first.top_ids[0] == first.id and first.top_logits[0] - first.top_logits[1] < 0.5  # still a near-tie
    finally:
        b.close()
