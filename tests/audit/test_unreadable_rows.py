"""The store's rows are data (issue 43, N8/N9): a row whose time, number or text cannot be read is
reported with its id and left out, by every read, command and page; it never takes down a view.

A fuzz pass writes garbage of every kind (text, a malformed date, numbers, bytes, text that is not
UTF-8, NULL, JSON of the wrong shape, a 5000-digit number, JSON nested past the parser) into every
column of both tables by raw SQL, one value at a time, and checks each read: the rows it returns
plus the rows it reports as skipped are all the rows there are (nothing lost silently, nothing
raised), a skipped row names the row that was changed, single reads either answer or raise
:class:`UnreadableRowError` naming it, and the review page never answers 500. The CLI commands are
run for every column with its first value the store cannot read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient
from typer.testing import CliRunner

from logtoku_guard.audit import AuditRecord, AuditStore
from logtoku_guard.audit.records import StoredRows
from logtoku_guard.audit.schema import _records, _reviews
from logtoku_guard.cli import _common, app
from logtoku_guard.errors import ConfigurationError, UnknownTraceError, UnreadableRowError
from logtoku_guard.review_web import create_app
from logtoku_guard.review_web.queue_page import QueueFilter, list_queue

TOKEN = "admin-token-for-the-unreadable-rows-test-0123"
GARBAGE: dict[str, str] = {
    "text": "'garbage'",
    "impossible date": "'2026-13-45 10:00:00'",
    "year 0": "'0000-01-01 00:00:00'",
    "integer": "12345",
    "negative": "-7",
    "real": "1.5",
    "blob": "x'ff00fe'",
    "not UTF-8": "CAST(x'ff61' AS TEXT)",
    "NULL": "NULL",
    "JSON list": "'[1, \"x\"]'",
    "JSON object of text": '\'{"reliability": "high"}\'',
    "broken JSON": "'{\"reliability\": '",
    "5000-digit number": '\'{"reliability": 1' + "0" * 5000 + "}'",
    "deep JSON": "'" + "[" * 100_000 + "]" * 100_000 + "'",
}
RECORD_COLUMNS = [c.name for c in _records.columns if c.name != "id"]
REVIEW_COLUMNS = [c.name for c in _reviews.columns if c.name != "id"]
COLUMNS = [("audit_records", c) for c in RECORD_COLUMNS] + [("review_items", c) for c in REVIEW_COLUMNS]
YEAR_0 = ("year 0", "audit_records", "created_at")
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)


def record(i: int, **changes: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "model": "tiny",
        "policy_name": "p",
        "policy_version": "1",
        "prompt": f"question {i}?",
        "answer": "Paris.",
        "action": "human_review",
        "reason": "guard_score 0.1 < 0.3",
        "rule": "low-guard-score",
        "reliability": 0.4,
        "created_at": T0 + timedelta(hours=i),
        "tokens": [{"token": "Paris", "quadrant": "I"}, {"token": ".", "quadrant": "III"}],
        "stats": {"reliability": 0.4, "guard_score": 0.1 * i, "max_eu": 0.3},
        "timings": {"total_s": 0.5},
    }
    fields.update(changes)
    return AuditRecord(**fields)


class Fixture:
    """Five records: one passed, four queued (item 1 pending, 2 approved, 3 rejected, 4 claimed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with AuditStore(path) as store:
            store.record(record(0, action="pass", rule=None))
            for i in range(1, 5):
                store.record_for_review(record(i))
            store.approve(2, "ann")
            store.reject(3, "ann", "wrong")
            store.claim(4, "bob")
        self.raw = sqlite3.connect(path, isolation_level=None)
        self.raw.text_factory = lambda b: b.decode("utf-8", "replace")  # this test's own reads of what it wrote
        (self.target_record,) = self.raw.execute("SELECT id FROM audit_records WHERE review_id = 2").fetchone()
        self.target = {"audit_records": self.target_record, "review_items": 2}

    def corrupt(self, table: str, column: str, literal: str) -> str | None:
        """Write ``literal`` into ``column`` of the target row; the SQL to undo it (None: the database refused it)."""
        row = self.target[table]
        (old,) = self.raw.execute(f"SELECT quote({column}) FROM {table} WHERE id = ?", (row,)).fetchone()
        try:
            self.raw.execute(f"UPDATE {table} SET {column} = {literal} WHERE id = ?", (row,))
        except (sqlite3.IntegrityError, sqlite3.OperationalError):  # NOT NULL, CHECK, UNIQUE
            return None
        return f"UPDATE {table} SET {column} = {old} WHERE id = {row}"


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    f = Fixture(tmp_path_factory.mktemp("unreadable") / "audit.db")
    yield f
    f.raw.close()


@pytest.fixture(scope="module")
def store(fx: Fixture) -> Iterator[AuditStore]:
    with AuditStore(fx.path) as s:
        yield s


@pytest.fixture(scope="module")
def page(store: AuditStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, TOKEN), base_url="http://127.0.0.1") as client:
        r = client.get(f"/?token={TOKEN}", headers={"Sec-Fetch-Site": "none"}, follow_redirects=False)
        assert r.status_code == 303
        yield client


def accounted(rows: StoredRows[Any], total: int, fx: Fixture, what: str) -> bool:
    """Every row returned or reported; a reported row is the changed one. True when one was skipped."""
    assert len(rows) + len(rows.skipped) == total, (what, len(rows), [s.describe() for s in rows.skipped])
    for s in rows.skipped:
        assert s.row_id == fx.target[s.table], (what, s.describe())
        assert s.problem and s.column and s.value, (what, s)
    return bool(rows.skipped)


def check_store(store: AuditStore, fx: Fixture, tmp: Path, before_window: bool = False, csv: bool = False) -> set[str]:
    """Every read of the store with one changed row; the reads that could not read it.
    ``before_window``: the changed time is text that sorts before any window (year 0): out of it."""
    bad = set()
    for what, rows, total in (
        ("tail", store.tail(100), 5),
        ("decisions", store.decisions(), 5),
        ("decisions since", store.decisions(since=T0 - timedelta(days=1)), 4 if before_window else 5),
        ("pending", store.pending(include_claimed=True), 2),
        ("decided", store.decided(), 2),
    ):
        if accounted(rows, total, fx, what):
            bad.add(what)
    skipped: list[Any] = []
    verdicts = list(store.verdicts(skipped=skipped))
    if accounted(StoredRows(verdicts, skipped), 2, fx, "verdicts"):
        bad.add("verdicts")
    for fmt in ("jsonl", "csv") if csv else ("jsonl",):
        n = store.export(tmp / f"out.{fmt}", fmt, overwrite=True)
        assert n + len(n.skipped) == 5 and all(s.row_id == fx.target[s.table] for s in n.skipped)
        if fmt == "jsonl":
            lines = (tmp / "out.jsonl").read_text(encoding="utf-8").splitlines()
            assert len(lines) == n and all(json.loads(line)["trace_id"] for line in lines)
        if n.skipped:
            bad.add("export")
    queue = list_queue(store, QueueFilter(view="all"))
    assert len(queue.rows) + len(queue.skipped) == 4 and all(s.row_id == fx.target[s.table] for s in queue.skipped)
    if queue.skipped:
        bad.add("queue")
    try:
        store.review_item(2)
    except UnreadableRowError as e:
        assert e.row.row_id == fx.target[e.row.table] and "row" in str(e) and e.row.column in str(e)
        bad.add("item")
    trace = fx.raw.execute("SELECT trace_id FROM audit_records WHERE id = ?", (fx.target_record,)).fetchone()[0]
    if isinstance(trace, str):
        try:
            store.get(trace)
        except UnreadableRowError as e:
            assert e.row.row_id == fx.target_record
            bad.add("get")
        except UnknownTraceError:  # the trace id itself was changed (bytes that are not UTF-8 read back here as U+FFFD)
            assert "\ufffd" in trace
    assert store.count() == 5 and store.count_decided() >= 1
    return bad


@pytest.mark.parametrize(
    ("table", "column"), [("audit_records", c) for c in RECORD_COLUMNS] + [("review_items", c) for c in REVIEW_COLUMNS]
)
def test_garbage_in_any_column_is_reported_never_raised(
    table: str, column: str, fx: Fixture, store: AuditStore, page: TestClient, tmp_path: Path
) -> None:
    unreadable = []
    for name, literal in GARBAGE.items():
        undo = fx.corrupt(table, column, literal)
        if undo is None:
            continue
        try:
            bad = check_store(store, fx, tmp_path, before_window=(name, table, column) == YEAR_0)
            listing = page.get("/?view=all")
            assert listing.status_code == 200, (name, listing.text[:500])
            assert ("could not be read" in listing.text) == ("queue" in bad), (name, bad)
            item = page.get("/items/2")
            assert item.status_code == (422 if "item" in bad else 200), (name, bad, item.text[:500])
            if item.status_code == 422:
                rows = (f"audit_records row {fx.target_record}", "review_items row 2")
                assert "Unreadable item" in item.text and any(r in item.text for r in rows)
            if bad:
                unreadable.append(name)
        finally:
            fx.raw.execute(undo)
    assert check_store(store, fx, tmp_path, csv=True) == set()  # undone: every row reads again
    if column in ("created_at", "decided_at", "stats", "reliability", "attempts", "model", "trace_id"):
        assert unreadable, f"no garbage in {table}.{column} was found unreadable"


def test_each_known_bad_value_names_its_row_and_column(fx: Fixture, store: AuditStore) -> None:
    cases = [
        ("audit_records", "created_at", "'garbage'", "not a date and time"),
        ("audit_records", "created_at", "12345", "not a date and time"),
        ("audit_records", "created_at", "'2026-13-45'", "not a date and time"),
        ("audit_records", "reliability", "'high'", "not a finite number"),
        ("audit_records", "stats", '\'{"max_eu": "x"}\'', "not a number"),
        ("audit_records", "prompt", "CAST(x'ff61' AS TEXT)", "not text"),
        ("review_items", "created_at", "'garbage'", "not a date and time"),
        ("review_items", "decided_at", "x'00'", "not a date and time"),
        ("review_items", "trace_id", "'nobody'", "no audit record"),
    ]
    for table, column, literal, problem in cases:
        undo = fx.corrupt(table, column, literal)
        assert undo is not None, (table, column)
        try:
            with pytest.raises(UnreadableRowError) as info:
                store.review_item(2)
            row = info.value.row
            assert (row.table, row.row_id) == (table, fx.target[table]) and row.column.startswith(column.split("[")[0])
            assert problem in str(info.value) and f"row {fx.target[table]}" in str(info.value)
        finally:
            fx.raw.execute(undo)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(_common, "out", Console(width=1000, color_system=None))
    monkeypatch.setattr(_common, "err", Console(width=1000, color_system=None, stderr=True))


def first_unreadable(fx: Fixture, store: AuditStore, table: str, column: str, tmp: Path) -> str | None:
    for name, literal in GARBAGE.items():
        undo = fx.corrupt(table, column, literal)
        if undo is None:
            continue
        if check_store(store, fx, tmp, before_window=(name, table, column) == YEAR_0) - {
            "verdicts",
            "decided",
        }:
            return undo
        fx.raw.execute(undo)
    return None


@pytest.mark.usefixtures("wide")
@pytest.mark.parametrize(
    ("table", "column"), [("audit_records", c) for c in RECORD_COLUMNS] + [("review_items", c) for c in REVIEW_COLUMNS]
)
def test_every_command_answers_with_a_clear_message(
    table: str, column: str, fx: Fixture, store: AuditStore, tmp_path: Path
) -> None:
    undo = first_unreadable(fx, store, table, column, tmp_path)
    if undo is None:
        pytest.skip(f"every garbage value in {table}.{column} is either refused by the database or readable")
    db = str(fx.path)
    try:
        outputs = []
        for args in (
            ("audit", "tail", "--store", db),
            ("audit", "tail", "--store", db, "--json"),
            ("audit", "stats", "--store", db),
            ("audit", "stats", "--store", db, "--json", "--by", "day"),
            ("audit", "export", str(tmp_path / "x.jsonl"), "--store", db, "--force"),
            ("review", "list", "--store", db),
            ("review", "list", "--store", db, "--json"),
            ("review", "show", "2", "--store", db),
        ):
            res = invoke(*args)
            assert res.exit_code in (0, 2), (args, res.exit_code, res.output, res.exception)
            assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
            outputs.append(res.output)
        text = "\n".join(outputs)
        assert "unreadable row" in text or "cannot be read" in text, text
        assert f"row {fx.target[table]}" in text or f"row {fx.target['review_items']}" in text
    finally:
        fx.raw.execute(undo)


@pytest.mark.usefixtures("wide")
def test_json_output_lists_the_skipped_rows(fx: Fixture, tmp_path: Path) -> None:
    undo = fx.corrupt("audit_records", "created_at", "'garbage'")
    assert undo is not None
    try:
        res = invoke("audit", "tail", "--store", str(fx.path), "--json")
        assert res.exit_code == 0
        data = json.loads(res.stdout)
        assert len(data["records"]) == 4
        (skipped,) = data["skipped"]
        assert skipped == {
            "table": "audit_records",
            "id": fx.target_record,
            "trace_id": skipped["trace_id"],
            "column": "created_at",
            "value": "'garbage'",
            "problem": "not a date and time",
        }
        assert f"warning: skipped an unreadable row: audit_records row {fx.target_record}" in res.stderr
        res = invoke("audit", "export", str(tmp_path / "e.jsonl"), "--store", str(fx.path))
        assert res.exit_code == 0 and "4 record(s) written" in res.stdout and "1 unreadable row(s) left out" in res.stdout
    finally:
        fx.raw.execute(undo)


@pytest.mark.usefixtures("wide")
@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00"])
def test_since_crossing_year_1_or_9999_is_a_clear_error(fx: Fixture, store: AuditStore, since: str) -> None:
    when = datetime.fromisoformat(since)
    for call in (lambda: store.decisions(since=when), lambda: store.decided(since=when), lambda: store.count_decided(since=when)):
        with pytest.raises(ConfigurationError, match="out of range: in UTC it falls before 0001-01-01 or after 9999-12-31"):
            call()
    with pytest.raises(ConfigurationError, match="out of range"):
        store.verdicts(since=when)  # refused when called, not when first iterated
    for args in (
        ("audit", "stats", "--store", str(fx.path), "--since", since),
        ("calibrate", "--model", "fake", "--labels-from-store", str(fx.path), "--since", since),
    ):
        res = invoke(*args)
        assert res.exit_code == 2 and "out of range" in res.output and "Traceback" not in res.output, res.output
    res = invoke("audit", "stats", "--store", str(fx.path), "--since", "0001-01-01T00:00:00+00:00")
    assert res.exit_code == 0, res.output  # the earliest time there is still works
