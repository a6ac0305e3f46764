"""Reviewer accounts (hashed tokens), wait_for_decision, and the serve / add-reviewer commands."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from logtoku_guard.audit import AuditStore
from logtoku_guard.audit.reviewers import ReviewerRegistry
from logtoku_guard.audit.waiting import ReviewTimeoutError
from logtoku_guard.cli.review_serve import add_reviewer, is_loopback, serve
from logtoku_guard.errors import ConfigurationError, ReviewError, UnknownReviewItemError

from .support import queue


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


def test_add_reviewer_prints_a_token_that_logs_in(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    result = CliRunner().invoke(_cli(), ["add-reviewer", "dana", "--store", str(db)])
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    with AuditStore(db) as store:
        assert ReviewerRegistry(store).authenticate(token).name == "dana"  # type: ignore[union-attr]
    again = CliRunner().invoke(_cli(), ["add-reviewer", "dana", "--store", str(db)])
    assert again.exit_code == 2


def test_serve_refuses_a_remote_host_without_allow_remote(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "--allow-remote" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.com")


def test_serve_prints_one_line_with_the_tokened_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    result = CliRunner().invoke(_cli(), ["serve", "--store", str(tmp_path / "a.db"), "--port", "8999"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("http://127.0.0.1:8999/?token=")
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8999
