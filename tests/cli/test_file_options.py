"""Every command-line option that reads a file refuses a named pipe, a device, a folder and a missing
path promptly, with a message naming the path and what it is, before any model loads (issue 43, F15/F16).

A named pipe used to hang ``audit stats --profile`` and ``/dev/zero`` grew it to 5 GB; ``calibrate
--prompts FIFO`` said the pipe "does not exist". Each case runs in a thread with a deadline, so a
read that blocks fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from logtoku_guard.cli import _common, app

pytestmark = pytest.mark.skipif(
    not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs named pipes and /dev/zero"
)

OPTIONS: dict[str, tuple[str, ...]] = {
    "ask --policy": ("ask", "hi?", "--policy", "{path}", "--store", "{store}"),
    "ask --profile": ("ask", "hi?", "--profile", "{path}", "--store", "{store}"),
    "ask --context-file": ("ask", "hi?", "--context-file", "{path}", "--store", "{store}"),
    "score --profile": ("score", "hi?", "--profile", "{path}"),
    "calibrate --prompts": ("calibrate", "--prompts", "{path}"),
    "calibrate --labels": ("calibrate", "--labels", "{path}"),
    "serve --policy": ("serve", "--policy", "{path}"),
    "serve --profile": ("serve", "--profile", "{path}"),
    "audit stats --profile": ("audit", "stats", "--store", "{store}", "--profile", "{path}"),
}
KINDS = {
    "fifo": ("named pipe", "not a regular file"),
    "device": ("device", "not a regular file"),
    "folder": ("folder",),
    "missing": ("does not exist", "No such file"),
}


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("a model was loaded: the file option should have been refused first")

    monkeypatch.setattr(_common, "load_backend", refuse)
    monkeypatch.setattr(_common, "out", Console(width=1000, color_system=None))
    monkeypatch.setattr(_common, "err", Console(width=1000, color_system=None, stderr=True))


def target(kind: str, tmp_path: Path) -> Path:
    if kind == "fifo":
        p = tmp_path / "pipe.yaml"
        os.mkfifo(p)
        return p
    if kind == "device":
        return Path("/dev/zero")
    if kind == "folder":
        p = tmp_path / "folder.json"
        p.mkdir()
        return p
    return tmp_path / "missing.json"


def run_with_deadline(args: list[str], seconds: float = 60.0) -> Any:
    box: dict[str, Any] = {}

    def go() -> None:
        box["result"] = CliRunner().invoke(app, args)

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{args} did not answer within {seconds} s (a blocking read?)"
    return box["result"]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_file_option_refuses_pipes_devices_folders_and_missing_paths(option: str, kind: str, tmp_path: Path) -> None:
    path = target(kind, tmp_path)
    args = [a.format(path=path, store=tmp_path / "audit.db") for a in OPTIONS[option]]
    res = run_with_deadline(args)
    text = res.output
    assert res.exit_code == 2, (option, kind, res.exit_code, text, res.exception)
    assert "Traceback" not in text and (res.exception is None or isinstance(res.exception, SystemExit)), text
    assert str(path) in text, (option, kind, text)
    assert any(phrase in text for phrase in KINDS[kind]), (option, kind, text)
    if kind == "fifo":
        assert "does not exist" not in text, text  # F16: a pipe is named as a pipe
