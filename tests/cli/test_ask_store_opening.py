"""``ask`` opens its audit store in a thread of its own while the model loads (issue 42 item 5):
the two overlap, the record is still written, and the store's error is still the one reported."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from cli_support import scripted_loader
from rich.console import Console
from typer.testing import CliRunner

from logtoku_guard import AuditStore, ScriptedAnswer
from logtoku_guard.calibration import ModelProfile, calibrate
from logtoku_guard.cli import _common, app

runner = CliRunner()
ANSWER = ScriptedAnswer(["The", " capital", " is", " Paris", "."], [[9.0, 1.0], [3.0, 2.5], [12.0, 0.5], [1.2, 1.1], [6.0, 5.0]])


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "out", Console(width=1000))
    monkeypatch.setattr(_common, "err", Console(width=1000, stderr=True))


def profile(tmp_path: Path) -> Path:
    backend = scripted_loader(ANSWER)("fake", 2, "cpu", "auto", None)
    made: ModelProfile = calibrate(backend, ["q1", "q2", "q3"])
    return made.save(tmp_path / "p.json")


def ask(tmp_path: Path, store: Path, *extra: str) -> Any:
    return runner.invoke(
        app, ["ask", "hi", "--model", "fake", "--profile", str(profile(tmp_path)), "--store", str(store), *extra]
    )


def test_the_store_opens_while_the_model_loads_and_gets_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loading = threading.Event()
    seen: dict[str, Any] = {}
    open_store, load = _common.open_store, scripted_loader(ANSWER)

    def opening(store: str | None, cache_dir: Path | None = None, **kw: Any) -> AuditStore:
        # Finishes only once the model's load has begun: a store opened before the load (the old
        # order) waits out the timeout and the test fails.
        seen["overlapped"] = loading.wait(timeout=20)
        seen["thread"] = threading.current_thread()
        return open_store(store, cache_dir, **kw)

    def loader(*args: Any, **kw: Any) -> Any:
        seen["load_thread"] = threading.current_thread()
        loading.set()
        return load(*args, **kw)

    monkeypatch.setattr(_common, "open_store", opening)
    monkeypatch.setattr(_common, "load_backend", loader)
    res = ask(tmp_path, tmp_path / "a.db", "--json")
    assert res.exit_code == 0, res.output
    assert seen["overlapped"] is True and seen["thread"] is not seen["load_thread"]
    import json

    trace = json.loads(res.stdout)["trace_id"]
    with AuditStore(tmp_path / "a.db") as audit:
        assert audit.get(trace).answer == "The capital is Paris."


def test_a_store_that_cannot_open_is_reported_and_nothing_is_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "load_backend", scripted_loader(ANSWER))
    bad = tmp_path / "audit.db-wal"  # SQLite's side file: refused by AuditStore
    res = ask(tmp_path, bad)
    assert res.exit_code != 0
    assert "audit.db-wal" in " ".join(res.output.split()) and "Paris" not in res.output


def test_the_store_error_comes_before_the_model_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.errors import BackendError

    def broken(*args: Any, **kw: Any) -> Any:
        raise BackendError("the model file is damaged")

    monkeypatch.setattr(_common, "load_backend", broken)
    res = ask(tmp_path, tmp_path / "audit.db-wal")
    assert res.exit_code != 0 and "audit.db-wal" in " ".join(res.output.split()) and "damaged" not in res.output
    # With a store that opens, the model's own error is the one reported, and the store is closed.
    res = ask(tmp_path, tmp_path / "good.db")
    assert res.exit_code != 0 and "damaged" in res.output
