"""Bad command-line input exits with status 2 and a message naming the value and the fix, never a traceback.

Each case checks that no model is loaded when the input can be judged without one
(``load_backend`` is replaced by a function that fails the test), and that the output holds
no ``Traceback``. The cases with a real loader (truncated ``.gguf``, empty folder) fail
inside model loading, before any weights are read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from logtoku_guard.cli import _common, app
from logtoku_guard.errors import InvalidPromptError
from logtoku_guard.types import ChatMessage, to_messages

runner = CliRunner()
BAD_UTF8 = b"caf\xe9 au lait\n\xff\xfe broken\n"


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model is a test failure: every case here must be refused before that."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail(f"a model was loaded for {args!r}: the bad input should have been refused first")

    monkeypatch.setattr(_common, "load_backend", refuse)
    monkeypatch.setattr(_common, "out", Console(width=1000))
    monkeypatch.setattr(_common, "err", Console(width=1000, stderr=True))


def fails(*args: str, expect: tuple[str, ...]) -> str:
    """Run the CLI; assert exit 2, no traceback, and every ``expect`` piece in the output."""
    res = runner.invoke(app, list(args))
    text = res.output
    assert res.exit_code == 2, (res.exit_code, text, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in text
    for piece in expect:
        assert piece in text, (piece, text)
    return text


def test_ask_context_file_with_invalid_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "ctx.txt"
    bad.write_bytes(BAD_UTF8)
    fails("ask", "hi?", "--context-file", str(bad), "--store", str(tmp_path / "a.db"), expect=("ctx.txt", "UTF-8"))


def test_calibrate_prompts_with_invalid_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.txt"
    bad.write_bytes(BAD_UTF8)
    fails("calibrate", "--prompts", str(bad), expect=("prompts.txt", "UTF-8", "offset 3"))


def test_calibrate_prompts_with_a_bad_jsonl_line(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"question": "ok?"}\n{"question": "broken\n')
    fails("calibrate", "--prompts", str(bad), expect=("prompts.jsonl:2", "JSON"))


def test_calibrate_batch_size_zero(tmp_path: Path) -> None:
    good = tmp_path / "prompts.txt"
    good.write_text("What is the capital of France?\n")
    fails("calibrate", "--prompts", str(good), "--batch-size", "0", expect=("--batch-size", "0"))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_score_non_finite_thresholds(value: str) -> None:
    fails("score", "hi?", "--au-threshold", value, "--eu-threshold", "0.5", expect=("--au-threshold", value))
    fails("score", "hi?", "--au-threshold", "0.5", "--eu-threshold", value, expect=("--eu-threshold", value))


@pytest.mark.parametrize("command", [["score", "hi?"], ["calibrate"], ["ask", "hi?"]])
def test_bogus_device(command: list[str], tmp_path: Path) -> None:
    extra = ["--store", str(tmp_path / "a.db")] if command[0] == "ask" else []
    fails(*command, *extra, "--device", "bogus", expect=("'bogus'", "cpu", "cuda"))


def test_cache_dir_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "cache"
    file.write_text("not a folder")
    fails("score", "hi?", "--cache-dir", str(file), expect=(str(file), "not a folder", "CLI: --cache-dir", "Python: cache_dir="))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs POSIX permissions and a non-root user")
def test_cache_dir_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        fails("score", "hi?", "--cache-dir", str(locked / "sub"), expect=(str(locked), "writable"))
        fails("score", "hi?", "--cache-dir", str(locked), expect=(str(locked), "writable"))
    finally:
        locked.chmod(0o700)


def test_cache_dir_without_write_permission_as_any_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same refusal when the permission check says no (root may write anywhere, so it is simulated)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    fails("score", "hi?", "--cache-dir", str(locked / "sub"), expect=(str(locked), "writable"))


def test_profile_given_a_folder(tmp_path: Path) -> None:
    text = fails("score", "hi?", "--profile", str(tmp_path), expect=(str(tmp_path), "folder"))
    assert "does not exist" not in text


def test_lone_surrogate_in_the_prompt() -> None:
    fails("score", "caf\udce9?", expect=("surrogate", "position 3"))


def test_lone_surrogate_through_the_library() -> None:
    with pytest.raises(InvalidPromptError, match="position 1"):
        to_messages("a\ud800b")
    with pytest.raises(InvalidPromptError, match=r"message 1.*position 0"):
        to_messages([ChatMessage("user", "fine"), ChatMessage("assistant", "\udfff")])
    with pytest.raises(InvalidPromptError, match=r"system.*position 2"):
        to_messages("fine", system="ab\udc80")


# -- cases that reach the (real) model loader: refused before any weights are read -------------
@pytest.fixture
def real_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    monkeypatch.setattr(_common, "err", Console(width=1000, stderr=True))


def test_truncated_gguf(tmp_path: Path, real_loader: None) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    fails("score", "hi?", "--model", str(gguf), "--device", "cpu", expect=("model.gguf", "GGUF"))


def test_empty_model_folder(tmp_path: Path, real_loader: None) -> None:
    folder = tmp_path / "empty-model"
    folder.mkdir()
    fails("score", "hi?", "--model", str(folder), "--device", "cpu", expect=(str(folder), "config.json", "weights"))


# -- calibrate --out: never replaces other data, checked before the model loads ----------------
def _profile(tmp_path: Path) -> Path:
    from logtoku_guard import ScriptedAnswer, ScriptedBackend
    from logtoku_guard.calibration import calibrate

    answers = [ScriptedAnswer(["a", "b"], [[3.0, 1.0], [2.0, 1.5]]) for _ in range(3)]
    return calibrate(ScriptedBackend(answers), ["q1?", "q2?", "q3?"]).save(tmp_path / "profile.json")


def test_calibrate_out_refuses_an_audit_store(tmp_path: Path) -> None:
    from logtoku_guard.audit import AuditStore

    store = tmp_path / "audit.db"
    AuditStore(store).close()
    before = store.read_bytes()
    fails("calibrate", "--out", str(store), expect=(str(store), "not a model profile", "--force"))
    assert store.read_bytes() == before


def test_calibrate_out_refuses_any_other_file_and_names_no_content(tmp_path: Path) -> None:
    secret = tmp_path / "notes.txt"
    secret.write_text("root:x:0:0:secret-content\n")
    text = fails("calibrate", "--out", str(secret), expect=(str(secret), "not JSON", "--force"))
    assert "secret-content" not in text


def test_calibrate_out_refuses_a_folder_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    fails("calibrate", "--out", str(folder), expect=(str(folder), "is a folder", "profile.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_calibrate_out_refuses_a_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    fails("calibrate", "--out", str(fifo), "--force", expect=(str(fifo), "not a regular file"))


def test_calibrate_out_accepts_a_profile_a_new_path_and_force(tmp_path: Path) -> None:
    _common.check_profile_out(_profile(tmp_path), force=False)  # re-calibrating replaces a profile
    _common.check_profile_out(tmp_path / "new" / "p.json", force=False)
    other = tmp_path / "other.txt"
    other.write_text("x")
    _common.check_profile_out(other, force=True)


def test_profile_save_failure_leaves_the_target_and_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.calibration import ModelProfile
    from logtoku_guard.errors import ConfigurationError

    path = _profile(tmp_path)
    before = path.read_bytes()
    profile = ModelProfile.load(path)

    def full_disk(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(ConfigurationError, match="No space left"):
        profile.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]
    with pytest.raises(ConfigurationError, match="is a folder"):
        profile.save(tmp_path)


def test_profile_that_is_another_file_never_echoes_its_content(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:secret-line\n")
    text = fails("score", "hi?", "--profile", str(passwd), expect=(str(passwd), "not a model profile", "not JSON", "calibrate"))
    assert "root:x" not in text and "secret-line" not in text and "pydantic" not in text
    other_json = tmp_path / "other.json"
    other_json.write_text('{"password": "hunter2-secret"}')
    text = fails("score", "hi?", "--profile", str(other_json), expect=(str(other_json), "not a model profile"))
    assert "hunter2" not in text


def test_score_seed_beyond_64_bits() -> None:
    fails(
        "score",
        "hi?",
        "--seed",
        "18446744073709551616",
        "--temperature",
        "1",
        expect=("--seed 18446744073709551616", "from 0 to 18446744073709551615"),
    )


@pytest.mark.parametrize("command", [("score", "hi?"), ("ask", "hi?"), ("calibrate",)])
def test_unknown_backend_is_refused_before_loading(command: tuple[str, ...], tmp_path: Path) -> None:
    extra = ("--store", str(tmp_path / "a.db")) if command[0] == "ask" else ()
    fails(*command, *extra, "--backend", "vllm", expect=("--backend", "transformers, llamacpp", "'vllm'"))


def test_device_with_the_llamacpp_backend_is_refused_before_loading() -> None:
    fails("score", "hi?", "--backend", "llamacpp", "--device", "cuda", expect=("--device cuda", "llama.cpp"))


def test_serve_refuses_an_unknown_backend() -> None:
    pytest.importorskip("fastapi")
    fails("serve", "--port", "0", "--backend", "vllm", expect=("--backend", "'vllm'"))


@pytest.mark.parametrize(
    "args",
    [
        [b"ask", b"hi", b"--store", b"\xff\xfe"],
        [b"review", b"list", b"--store", b"\xff\xfe"],
        [b"review", b"claim", b"1", b"-r", b"al\xffice"],
        [b"review", b"approve", b"1", b"-r", b"alice", b"--answer", b"\xc3\x28"],
        [b"review", b"reject", b"1", b"-r", b"alice", b"--note", b"why\xfe"],
    ],
)
def test_an_argument_that_is_not_utf8_is_a_clear_error(args: list[bytes], tmp_path: Any) -> None:
    """F17: Python keeps undecodable argv bytes as lone surrogates; writing them anywhere raised UnicodeEncodeError."""
    import subprocess
    import sys

    env = {**os.environ, "LOGTOKU_GUARD_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"logtoku_guard.cli", *args], capture_output=True, env=env, timeout=120
    )
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "is not valid UTF-8" in err and "Traceback" not in err, err
