"""Reviewer accounts (hashed tokens), wait_for_decision, and the serve / add-reviewer commands."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from logtoku_guard import ReviewTimeoutError
from logtoku_guard.audit import AuditStore
from logtoku_guard.audit.reviewers import ReviewerRegistry
from logtoku_guard.cli.review_serve import add_reviewer, is_loopback, serve
from logtoku_guard.errors import ConfigurationError, ReviewError, UnknownReviewItemError

from .support import free_port, queue


def test_tokens_are_stored_hashed_and_authenticate(store: AuditStore) -> None:
    registry = ReviewerRegistry(store)
    reviewer, token = registry.add("alice")
    assert reviewer.name == "alice" and len(token) >= 40
    with store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT token_sha256 FROM logtoku_reviewers")).scalar_one()
    assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in stored
    assert registry.authenticate(token) == reviewer
    assert registry.authenticate(token + "x") is None and registry.authenticate("") is None
    registry.set_disabled("alice")
    assert registry.authenticate(token) is None
    assert [r.disabled for r in ReviewerRegistry(store).list()] == [True]  # the table survives a second registry


@pytest.mark.parametrize("name", ["", "admin", "ADMIN", "has space", "x" * 65, "-dash"])
def test_bad_or_reserved_names_are_refused(store: AuditStore, name: str) -> None:
    with pytest.raises(ConfigurationError):
        ReviewerRegistry(store).add(name)


def test_duplicate_names_are_refused(store: AuditStore) -> None:
    ReviewerRegistry(store).add("bob")
    with pytest.raises(ConfigurationError, match="already exists"):
        ReviewerRegistry(store).add("bob")


def test_wait_for_decision_returns_once_another_thread_decides(store: AuditStore) -> None:
    item = queue(store)

    def decide() -> None:
        time.sleep(0.3)
        store.approve(item.id, "alice", edited_answer="The capital is Paris.")

    t = threading.Thread(target=decide)
    t.start()
    start = time.monotonic()
    decided = store.wait_for_decision(item.id, timeout=10, poll_interval=0.05)
    t.join()
    assert 0.25 < time.monotonic() - start < 5
    assert decided.status == "approved" and decided.final_answer == "The capital is Paris."


def test_wait_for_decision_times_out_with_a_library_error(store: AuditStore) -> None:
    item = queue(store)
    with pytest.raises(ReviewTimeoutError, match="still 'pending'") as info:
        store.wait_for_decision(item.id, timeout=0.1, poll_interval=0.02)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ReviewError)
    assert info.value.item.id == item.id
    with pytest.raises(UnknownReviewItemError):
        store.wait_for_decision(999, timeout=1)
    with pytest.raises(ConfigurationError):
        store.wait_for_decision(item.id, timeout=1, poll_interval=0)


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("serve")(serve)
    app.command("add-reviewer")(add_reviewer)
    return app


def test_add_reviewer_prints_a_labelled_token_that_logs_in(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    result = CliRunner().invoke(_cli(), ["add-reviewer", "dana", "--store", str(db)])
    assert result.exit_code == 0, result.output
    label, _, token = result.output.strip().rpartition(": ")
    assert label.startswith("token of reviewer dana (shown once") and " " not in token
    with AuditStore(db) as store:
        assert ReviewerRegistry(store).authenticate(token).name == "dana"  # type: ignore[union-attr]
    again = CliRunner().invoke(_cli(), ["add-reviewer", "dana", "--store", str(db)])
    assert again.exit_code == 2
    as_json = CliRunner().invoke(_cli(), ["add-reviewer", "erin", "--store", str(db), "--json"])
    assert as_json.exit_code == 0, as_json.output
    row = json.loads(as_json.output)
    assert row["name"] == "erin"
    with AuditStore(db) as store:
        assert ReviewerRegistry(store).authenticate(row["token"]).name == "erin"  # type: ignore[union-attr]


def test_serve_refuses_a_remote_host_without_allow_remote(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.com")


def _no_serving(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Make uvicorn return at once; returns what it was given (the listening sockets)."""
    import uvicorn

    seen: dict[str, Any] = {}

    def run(self: Any, sockets: list[socket.socket] | None = None) -> None:
        seen["sockets"] = [s.getsockname() for s in sockets or []]

    monkeypatch.setattr(uvicorn.Server, "run", run)
    return seen


def test_serve_prints_one_line_with_the_tokened_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _no_serving(monkeypatch)
    port = free_port()
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--port", str(port)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"http://127.0.0.1:{port}/?token=")
    assert seen["sockets"] == [("127.0.0.1", port)]


def test_serve_port_0_prints_the_port_it_got(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _no_serving(monkeypatch)
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--port", "0"])
    assert result.exit_code == 0, result.output
    (_, port) = seen["sockets"][0]
    assert port != 0 and result.output.startswith(f"http://127.0.0.1:{port}/?token=")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "70000"], "--port must be a TCP port from 1 to 65535, got 70000"),
        (["--port", "-1"], "--port must be a TCP port from 1 to 65535, got -1"),
        (["--claim-ttl", "1e300"], "--claim-ttl 1e+300 is not a usable number of minutes; give one from 0.1 to"),
        (["--claim-ttl", "nan"], "--claim-ttl nan is not a usable number of minutes"),
        (["--claim-ttl", "0"], "--claim-ttl 0 is not a usable number of minutes"),
    ],
)
def test_serve_refuses_bad_numbers_before_printing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    seen = _no_serving(monkeypatch)
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), *args])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "token=" not in result.output and "Traceback" not in result.output
    assert expected in " ".join(result.output.split()), result.output
    assert seen == {}


def test_serve_on_a_port_in_use_says_so_and_prints_no_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _no_serving(monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "token=" not in result.output
    assert f"port {port} on 127.0.0.1 is already in use" in " ".join(result.output.split())
    assert seen == {}
