"""``logtoku-guard audit``: console injection, safe export, purge that keeps open reviews, exit 2 on bad input."""

from __future__ import annotations

import errno
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_support import INJECTIONS, make_record, wide_consoles  # noqa: F401 (an autouse fixture)
from typer.testing import CliRunner

from logtoku_guard.audit import AuditStore, _files
from logtoku_guard.cli import app

runner = CliRunner()
OLD = datetime.now(timezone.utc) - timedelta(days=10)
N = len(INJECTIONS)  # old passed records, one per injection; then 3 reviewed (pending, claimed, decided) and 1 recent


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.fixture
def store(tmp_path: Path) -> str:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        for text in INJECTIONS.values():
            audit.record(make_record(prompt=text, action="pass", rule=None, created_at=OLD))
        audit.record_for_review(make_record(prompt="pending one", created_at=OLD))
        claimed = audit.record_for_review(make_record(prompt="claimed one", created_at=OLD))
        audit.claim(claimed.id, "alice")
        decided = audit.record_for_review(make_record(prompt="decided one", created_at=OLD))
        audit.approve(decided.id, "alice")
        audit.record(make_record(prompt="recent", action="pass"))
    return str(path)


def test_audit_tail_prints_injected_text_literally(store: str) -> None:
    res = invoke("audit", "tail", "--store", store)
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.output and "\r" not in res.output
    assert "What is [/x] this?" in res.output and "[link=https://evil.example]here" in res.output
    assert "before\\x1b[2Jafter" in res.output and "visible\\x0dHIDDEN" in res.output


def test_errors_show_paths_with_brackets_literally(store: str, tmp_path: Path) -> None:
    target = tmp_path / "[/x][link=http://e]" / "out.jsonl"
    res = invoke("audit", "export", str(target), "--store", store)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert str(target.parent) in res.output and "does not exist" in res.output


def test_export_refuses_the_store_itself_and_existing_files(store: str, tmp_path: Path) -> None:
    res = invoke("audit", "export", store, "--force", "--store", store)
    assert res.exit_code == 2 and "file of the audit store itself" in res.output
    with AuditStore(store) as audit:
        assert audit.count() == N + 4
    out = tmp_path / "out.jsonl"
    out.write_text("old")
    res = invoke("audit", "export", str(out), "--store", store)
    assert res.exit_code == 2 and "exists" in res.output and "--force" in res.output and out.read_text() == "old"
    res = invoke("audit", "export", str(out), "--force", "--store", store)
    assert res.exit_code == 0 and len(out.read_text().splitlines()) == N + 4


@pytest.mark.parametrize("where", ["missing/out.jsonl", "."])
def test_export_io_errors_exit_2_naming_the_path(store: str, tmp_path: Path, where: str) -> None:
    target = tmp_path / where
    res = invoke("audit", "export", str(target), "--store", store)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "error:" in res.output and ("does not exist" in res.output or "is a folder" in res.output)


def test_export_on_a_full_disk_exits_2_and_leaves_nothing(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Full:
        def __init__(self, fd: int) -> None:
            import os

            os.close(fd)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *a: object) -> None:
            pass

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files, "_open_text", Full)
    out_dir = tmp_path / "exports"
    out_dir.mkdir()
    res = invoke("audit", "export", str(out_dir / "out.jsonl"), "--store", store)
    assert res.exit_code == 2 and "No space left on device" in res.output and "disk has space" in res.output
    assert list(out_dir.iterdir()) == []


def test_an_empty_store_file_is_an_error_not_a_new_store(tmp_path: Path) -> None:
    empty = tmp_path / "audit.db"
    empty.touch()
    res = invoke("audit", "tail", "--store", str(empty))
    assert res.exit_code == 2 and "empty (0 bytes)" in res.output and str(empty) in res.output
    assert empty.stat().st_size == 0


def test_purge_keeps_undecided_reviews_and_dry_run_deletes_nothing(store: str) -> None:
    res = invoke("audit", "purge", "--days", "1", "--dry-run", "--store", store)
    assert res.exit_code == 0, res.output
    assert f"{N + 1} record(s)" in res.output and "would be removed" in res.output and "approved 1" in res.output
    assert "2 old record(s) kept" in res.output and "nothing was deleted" in res.output
    with AuditStore(store) as audit:
        assert audit.count() == N + 4
    res = invoke("audit", "purge", "--days", "0", "--store", store)
    assert res.exit_code == 0 and f"{N + 2} record(s)" in res.output and "2 old record(s) kept" in res.output
    with AuditStore(store) as audit:
        assert sorted(i.record.prompt for i in audit.pending(include_claimed=True)) == ["claimed one", "pending one"]
    res = invoke("audit", "purge", "--days", "0", "--include-undecided", "--store", store)
    assert res.exit_code == 0 and "2 record(s)" in res.output and "claimed 1, pending 1" in res.output
    with AuditStore(store) as audit:
        assert audit.count() == 0


@pytest.mark.parametrize("days", ["1e9", "1e300", "nan", "inf", "-1"])
def test_purge_bad_days_exit_2(store: str, days: str) -> None:
    res = invoke("audit", "purge", f"--days={days}", "--store", store)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "--days" in res.output and "Traceback" not in res.output
    assert "purge(" not in res.output and "days=" not in res.output  # no Python call as the fix


def test_export_json_lines_parse(store: str, tmp_path: Path) -> None:
    out = tmp_path / "a.jsonl"
    assert invoke("audit", "export", str(out), "--store", store).exit_code == 0
    assert {json.loads(line)["prompt"] for line in out.read_text().splitlines()} >= set(INJECTIONS.values())


def _refused(res: Any, *pieces: str) -> str:
    text = " ".join(res.output.split())
    assert res.exit_code == 2, text
    assert "Traceback" not in text and (res.exception is None or isinstance(res.exception, SystemExit))
    for piece in pieces:
        assert piece in text, (piece, text)
    return text


@pytest.mark.parametrize("n", ["9223372036854775808", "-1", "-99999999999999999999999"])
def test_tail_count_out_of_range_is_refused(store: str, n: str) -> None:
    _refused(invoke("audit", "tail", "-n", n, "--store", store), f"-n {n}", "from 0 to 9223372036854775807")


@pytest.mark.parametrize("command", [["audit", "tail"], ["audit", "export", "out.jsonl"]])
def test_read_commands_never_create_a_store(tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    typo = tmp_path / "typo.db"
    _refused(invoke(*command, "--store", str(typo)), "no audit store at", "typo.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_read_commands_without_store_never_create_the_default_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(tmp_path / "cache"))
    _refused(invoke("audit", "tail"), "no audit store at", str(tmp_path / "cache" / "audit.db"))
    assert not (tmp_path / "cache").exists()


def test_export_onto_an_existing_file_names_the_cli_flag(store: str, tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("keep me")
    text = _refused(invoke("audit", "export", str(target), "--store", store), "--force")
    assert "overwrite=True" not in text and target.read_text() == "keep me"
    assert invoke("audit", "export", str(target), "--store", store, "--force").exit_code == 0


def test_tail_reads_a_store_this_user_may_only_read(store: str, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    copy = folder / "audit.db"
    copy.write_bytes(Path(store).read_bytes())
    copy.chmod(0o444)
    folder.chmod(0o555)
    try:
        if os.access(copy, os.W_OK) or os.access(folder, os.W_OK):
            pytest.skip("file permissions are not enforced for this user (root?)")
        res = invoke("audit", "tail", "--json", "--store", str(copy))
        assert res.exit_code == 0, res.output
        assert len(json.loads(res.output)["records"]) == len(
            json.loads(invoke("audit", "tail", "--json", "--store", store).output)["records"]
        )
        assert sorted(p.name for p in folder.iterdir()) == ["audit.db"]
    finally:
        folder.chmod(0o755)
