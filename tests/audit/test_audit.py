"""The audit store and the human-review queue, on real SQLite files (tmp_path), no model.

Most tests take the store's location from the ``store_url`` fixture (here: SQLite files in
``tmp_path``); ``tests/audit/test_audit_postgres.py`` imports the same tests and overrides
``store_url`` with databases on a throwaway PostgreSQL server. Tests of SQLite's own files
(modes, pragmas, foreign files) stay here only.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from logtoku_guard.audit import SCHEMA_VERSION, AuditRecord, AuditStore, ReviewItem
from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    ReviewError,
    ReviewStateError,
    UnknownReviewItemError,
    UnknownTraceError,
)
from logtoku_guard.types import TokenScore
from logtoku_guard.wire.payloads import result_payload, token_payload

NOW = datetime.now(timezone.utc)

# A child process that writes records in a loop and prints the count after each commit.
WRITER = """
import itertools, sys
from logtoku_guard.audit import AuditRecord, AuditStore
path, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with AuditStore(path) as store:
    for i in (itertools.count() if n < 0 else range(n)):
        store.record(AuditRecord(model="m", policy_name="p", policy_version="1", prompt=f"{tag}-{i}",
                                 answer="a", action="answer", reason="ok", reliability=-0.1,
                                 tokens=[{"token": "a", "au": 0.1, "eu": 0.2}] * 20))
        print(i + 1, flush=True)
"""


def rec(**changes: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "model": "tiny",
        "policy_name": "default",
        "policy_version": "1.0",
        "prompt": "What is the capital of France?",
        "answer": "Paris",
        "action": "answer",
        "reason": "reliability -0.05 >= threshold -0.2",
        "reliability": -0.05,
    }
    fields.update(changes)
    return AuditRecord(**fields)


StoreUrl = Callable[..., str]
"""``store_url(name="audit")``: where this test's store called ``name`` lives (the same name, the same store)."""


@pytest.fixture
def store_url(tmp_path: Path) -> StoreUrl:
    """SQLite files in tmp_path (overridden by tests/audit/test_audit_postgres.py)."""

    def url(name: str = "audit") -> str:
        return str(tmp_path / f"{name}.db")

    return url


@pytest.fixture
def store(store_url: StoreUrl) -> Iterator[AuditStore]:
    with AuditStore(store_url()) as s:
        yield s


def is_sqlite(url: str) -> bool:
    return "://" not in url or url.startswith("sqlite")


def integrity(path: Path | str) -> str:
    """SQLite's integrity check of the file; "ok" for a server database (the server keeps it whole)."""
    if not is_sqlite(str(path)):
        return "ok"
    con = sqlite3.connect(path)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def stored_bytes(store: AuditStore) -> bytes:
    """Everything the database holds of the store: SQLite's files (db, -wal, -shm), or a server's rows as text."""
    if store.engine.dialect.name == "sqlite":
        base = str(store.engine.url.database)
        return b"".join(Path(base + s).read_bytes() for s in ("", "-wal", "-shm") if Path(base + s).exists())
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT t::text FROM audit_records t UNION ALL SELECT t::text FROM review_items t")
        return "".join(r[0] for r in rows).encode()


# ----------------------------------------------------------------------------- records


def test_round_trip_keeps_every_field_and_stores_nan_as_null(store: AuditStore) -> None:
    token = TokenScore(
        index=0, id=7, text="Par", top_logits=(3.5, 1.25), top_ids=(7, 9), au=0.25, eu=math.nan, logprob=-0.5, entropy=0.75
    )
    stats_in = {"reliability": -0.05, "mean_au": math.nan, "max_eu": math.inf, "n_tokens": 2}
    original = rec(
        created_at=datetime(2024, 5, 17, 8, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2))),
        rule="low_reliability",
        reliability=math.nan,
        attempts=3,
        tokens=[dict(token_payload(token)), {"token": "is", "au": -math.inf, "top_logits": [1.0, math.nan]}],
        stats=stats_in,
        timings={"generate_s": 0.8125, "score_s": None},
    )
    # NaN/inf become None on construction; the caller's dict is left alone.
    assert original.reliability is None
    assert original.stats == {"reliability": -0.05, "mean_au": None, "max_eu": None, "n_tokens": 2}
    assert math.isnan(stats_in["mean_au"])
    assert original.tokens[0]["eu"] is None and original.tokens[1] == {"token": "is", "au": None, "top_logits": [1.0, None]}
    assert original.created_at == datetime(2024, 5, 17, 6, 30, 15, 123456, tzinfo=timezone.utc)

    assert store.record(original) == original.trace_id
    back = store.get(original.trace_id)
    assert back == original
    assert back.created_at.tzinfo == timezone.utc
    assert len(original.trace_id) == 32 and int(original.trace_id, 16) >= 0  # uuid4 hex

    with store.engine.connect() as conn:
        raw = conn.exec_driver_sql("SELECT stats, tokens, reliability FROM audit_records").one()
    stats, tokens = (v if isinstance(v, str) else json.dumps(v) for v in raw[:2])  # PostgreSQL's JSONB: parsed
    assert "NaN" not in stats and "NaN" not in tokens and "Infinity" not in tokens
    assert json.loads(stats)["mean_au"] is None and raw[2] is None


def test_records_import_without_sqlalchemy() -> None:
    code = (
        "import sys, logtoku_guard.audit.records; from logtoku_guard.audit import AuditRecord, ReviewItem; "
        "print('sqlalchemy' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


def test_from_result_builds_the_record_and_round_trips(store: AuditStore) -> None:
    from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend

    answer = ScriptedAnswer(["Zorg", " Q"], [[0.6, 0.5], [0.5, 0.4]])
    policy = Policy.from_dict(
        {
            "name": "p",
            "version": "3",
            "rules": [{"name": "lost", "when": {"stat": "max_eu", "op": ">", "value": 0.5}, "action": "warn"}],
        }
    )
    guard = Guard(ScriptedBackend([answer], model_name="scripted"), policy)
    result = guard.run("Who founded Zarnovia?")
    record = AuditRecord.from_result(result, question="Who founded Zarnovia?", thresholds=guard.quadrants)
    payload = result_payload(result, guard.quadrants)
    assert record.trace_id == result.trace_id and record.model == "scripted"
    assert (record.policy_name, record.policy_version) == ("p", "3")
    assert record.prompt == "Who founded Zarnovia?"
    assert record.answer == "Zorg Q" != result.answer  # the draft, before the warn disclaimer
    assert (record.action, record.rule, record.reason) == ("warn", "lost", result.decision.reason)
    assert record.reliability == payload["reliability"] and record.attempts == 1
    assert record.tokens == payload["tokens"] and [t["index"] for t in record.tokens] == [0, 1]
    assert record.stats == payload["stats"] and record.timings == payload["timings"]
    assert record.review_id is None
    assert AuditRecord.from_result(result, question="q", draft="edited").answer == "edited"
    from_payload = AuditRecord.from_payload(payload, question="Who founded Zarnovia?")
    assert dataclasses.replace(from_payload, created_at=record.created_at) == record
    store.record(record)
    assert store.get(record.trace_id) == record


def test_tail_is_newest_first_and_count(store: AuditStore) -> None:
    assert store.count() == 0 and store.tail() == []
    ages = [5, 1, 30, 0, 2]  # days ago, recorded out of order
    for age in ages:
        store.record(rec(prompt=f"age {age}", created_at=NOW - timedelta(days=age)))
    assert store.count() == 5
    assert [r.prompt for r in store.tail(3)] == ["age 0", "age 1", "age 2"]
    assert [r.prompt for r in store.tail()] == ["age 0", "age 1", "age 2", "age 5", "age 30"]
    assert store.tail(0) == []
    with pytest.raises(ConfigurationError, match="-1"):
        store.tail(-1)


def test_export_jsonl_and_csv_parse_back(store: AuditStore, tmp_path: Path) -> None:
    records = [
        rec(prompt='one, "quoted"\nline two', created_at=NOW - timedelta(hours=2), tokens=[{"token": "a", "au": 0.5}]),
        rec(prompt="two", created_at=NOW - timedelta(hours=1), rule="r", stats={"x": math.nan, "y": 0.1}),
    ]
    for r in records:
        store.record(r)
    queued = store.record_for_review(rec(prompt="three", action="review", reliability=None, created_at=NOW))
    records.append(queued.record)
    expected = [r.to_dict() for r in records]  # oldest first

    assert store.export(tmp_path / "out.jsonl") == 3
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == expected

    assert store.export(tmp_path / "out.csv", fmt="csv") == 3
    with (tmp_path / "out.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(expected[0])
    for row, want in zip(rows, expected, strict=True):
        for name in ("tokens", "stats", "timings"):
            assert json.loads(row[name]) == want[name]
        assert row["reliability"] == ("" if want["reliability"] is None else repr(want["reliability"]))
        assert int(row["attempts"]) == want["attempts"]
        assert row["review_id"] == ("" if want["review_id"] is None else str(want["review_id"]))
        for name in ("trace_id", "created_at", "prompt", "answer", "action", "reason"):
            assert row[name] == want[name]
    assert rows[1]["rule"] == "r" and rows[0]["rule"] == ""

    with pytest.raises(ConfigurationError, match="'xml'"):
        store.export(tmp_path / "out.xml", fmt="xml")  # type: ignore[arg-type]


def test_purge_removes_old_records_and_their_decided_review_items(store: AuditStore) -> None:
    old = store.record_for_review(rec(prompt="old, decided", created_at=NOW - timedelta(days=100)))
    store.approve(old.id, "alice")
    store.record(rec(prompt="old", created_at=NOW - timedelta(days=31)))
    recent = store.record_for_review(rec(prompt="recent, queued", created_at=NOW - timedelta(days=29)))
    store.record(rec(prompt="now"))

    assert store.purge_older_than(30) == 2
    assert sorted(r.prompt for r in store.tail()) == ["now", "recent, queued"]
    with pytest.raises(UnknownReviewItemError, match=str(old.id)):
        store.review_item(old.id)
    with pytest.raises(UnknownTraceError):
        store.get(old.trace_id)
    assert [i.id for i in store.pending()] == [recent.id]
    assert store.purge_older_than(30) == 0
    # the pending item (and its record) survives a purge of everything unless asked for
    assert store.purge_older_than(0) == 1 and store.count() == 1
    assert [i.id for i in store.pending()] == [recent.id]
    with pytest.raises(ConfigurationError, match="days"):
        store.purge_older_than(-1)


def test_purge_keeps_undecided_items_unless_asked_and_dry_run_deletes_nothing(store: AuditStore) -> None:
    old = NOW - timedelta(days=10)
    pending = store.record_for_review(rec(prompt="pending", created_at=old))
    claimed = store.record_for_review(rec(prompt="claimed", created_at=old))
    store.claim(claimed.id, "alice")
    rejected = store.record_for_review(rec(prompt="rejected", created_at=old))
    store.reject(rejected.id, "bob", "wrong")
    store.record(rec(prompt="plain", created_at=old))

    plan = store.purge(1, dry_run=True)
    assert (plan.records, plan.reviews, plan.kept_undecided, plan.dry_run) == (2, {"rejected": 1}, 2, True)
    assert store.count() == 4  # nothing deleted
    everything = store.purge(1, include_undecided=True, dry_run=True)
    assert (everything.records, everything.reviews, everything.kept_undecided) == (
        4,
        {"pending": 1, "claimed": 1, "rejected": 1},
        0,
    )
    assert store.count() == 4

    done = store.purge(1)
    assert (done.records, done.reviews, done.kept_undecided, done.dry_run) == (2, {"rejected": 1}, 2, False)
    assert {i.id for i in store.pending(include_claimed=True)} == {pending.id, claimed.id}
    assert store.purge(1, include_undecided=True).reviews == {"pending": 1, "claimed": 1}
    assert store.count() == 0


@pytest.mark.parametrize("days", [1e9, 1e300, 800_000, math.nan, math.inf, -0.5, True, "3"])
def test_purge_days_must_be_finite_non_negative_and_in_range(store: AuditStore, days: Any) -> None:
    with pytest.raises(ConfigurationError, match="days") as info:
        store.purge(days)
    if days in (1e9, 1e300, 800_000):
        assert "at most" in str(info.value)


def test_unknown_and_duplicate_trace_ids(store: AuditStore) -> None:
    with pytest.raises(UnknownTraceError, match="nope") as info:
        store.get("nope")
    assert isinstance(info.value, AuditStoreError) and isinstance(info.value, KeyError)
    r = store.record(rec())
    with pytest.raises(AuditStoreError, match=f"{r}.*already"):
        store.record(rec(trace_id=r))
    assert store.count() == 1


def test_record_validation() -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        rec(created_at=datetime(2024, 1, 1))
    with pytest.raises(ConfigurationError, match=r"stats\['x'\].*object"):
        rec(stats={"x": object()})
    with pytest.raises(ConfigurationError, match="attempts"):
        rec(attempts=-1)
    with pytest.raises(ConfigurationError, match="action"):
        rec(action="")


def test_sqlite_connections_use_wal_busy_timeout_and_normal_sync(store: AuditStore) -> None:
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


# ----------------------------------------------------------------------------- opening


@pytest.mark.parametrize("where", ["missing/folder/audit.db", "a_file/audit.db", "."])
def test_unwritable_path_raises_naming_the_path(tmp_path: Path, where: str) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    path = tmp_path / where
    with pytest.raises(AuditStoreError) as info:
        AuditStore(path)
    message = str(info.value)
    assert str(path.absolute()) in message
    assert "folder exists" in message  # the fix


def test_read_only_database_fails_at_open(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    AuditStore(path).close()
    url = f"sqlite:///file:{path}?mode=ro&uri=true"
    with pytest.raises(AuditStoreError, match="readonly"):
        AuditStore(url)


def test_closed_store_refuses_and_bad_arguments(tmp_path: Path) -> None:
    with AuditStore(str(tmp_path / "a.db")) as s:
        s.record(rec())
    with pytest.raises(AuditStoreError, match="closed"):
        s.count()
    with pytest.raises(ConfigurationError):
        AuditStore("")
    with pytest.raises(ConfigurationError, match="in-memory"):
        AuditStore("sqlite://")
    with pytest.raises(ConfigurationError, match="busy_timeout_s"):
        AuditStore(tmp_path / "b.db", busy_timeout_s=-1)
    # a URL is used as is; the file is reopened with its records
    with AuditStore(f"sqlite:///{tmp_path / 'a.db'}") as again:
        assert again.count() == 1


# ----------------------------------------------------------------------------- review queue


def test_review_life_cycle(store: AuditStore) -> None:
    t1 = store.record(rec(prompt="q1", action="review"))
    item1 = store.enqueue(t1)
    item2 = store.record_for_review(rec(prompt="q2", action="review"))
    item3 = store.record_for_review(rec(prompt="q3", action="review"))
    assert isinstance(item1, ReviewItem) and item1.status == "pending" and item1.record.prompt == "q1"
    assert item1.record.review_id == item1.id and store.get(t1).review_id == item1.id
    assert item2.record.review_id == item2.id and store.get(item2.trace_id).review_id == item2.id
    assert [i.id for i in store.pending()] == [item1.id, item2.id, item3.id]

    claimed = store.claim(item1.id, "alice")
    assert claimed.status == "claimed" and claimed.claimed_by == "alice" and claimed.claimed_at is not None
    assert store.claim(item1.id, "alice") == claimed  # claiming again is a no-op
    assert [i.id for i in store.pending()] == [item2.id, item3.id]
    assert [i.id for i in store.pending(include_claimed=True)] == [item1.id, item2.id, item3.id]

    before = datetime.now(timezone.utc)
    approved = store.approve(item1.id, "alice", edited_answer="Paris, France.", note="added the country")
    assert approved.status == "approved" and approved.decided
    assert approved.reviewer == "alice" and approved.edited_answer == "Paris, France." and approved.note == "added the country"
    assert approved.decided_at is not None and approved.decided_at.tzinfo == timezone.utc and approved.decided_at >= before
    assert approved.final_answer == "Paris, France."
    assert approved.record.answer == "Paris"  # the audit record keeps what the model said

    rejected = store.reject(item2.id, "bob", note="wrong city")  # pending: implicit claim
    assert rejected.status == "rejected" and rejected.reviewer == "bob" and rejected.claimed_by == "bob"
    assert rejected.note == "wrong city" and rejected.final_answer is None and rejected.decided_at is not None

    plain = store.approve(item3.id, "carol")
    assert plain.final_answer == "Paris" and plain.edited_answer is None
    assert store.pending(include_claimed=True) == []
    assert store.review_item(item1.id) == approved


def test_review_errors(store: AuditStore) -> None:
    item = store.record_for_review(rec())
    store.claim(item.id, "alice")
    with pytest.raises(ReviewStateError, match=rf"item {item.id}.*'claimed' by 'alice'"):
        store.claim(item.id, "bob")
    with pytest.raises(ReviewStateError, match="'claimed' by 'alice'"):
        store.approve(item.id, "bob")
    with pytest.raises(ReviewStateError, match="'claimed' by 'alice'"):
        store.reject(item.id, "bob", note="no")
    with pytest.raises(ConfigurationError, match="rejection note"):
        store.reject(item.id, "alice", note="  ")
    assert store.review_item(item.id).status == "claimed"

    store.reject(item.id, "alice", note="made up")
    for decide_again in (
        lambda: store.approve(item.id, "alice"),
        lambda: store.reject(item.id, "alice", note="again"),
        lambda: store.claim(item.id, "carol"),
    ):
        with pytest.raises(ReviewStateError, match=rf"item {item.id}: its status is 'rejected' \(by 'alice'"):
            decide_again()
    assert store.review_item(item.id).note == "made up"

    with pytest.raises(UnknownReviewItemError, match="no review item with id 999") as info:
        store.approve(999, "alice")
    assert isinstance(info.value, ReviewError) and isinstance(info.value, KeyError)
    with pytest.raises(UnknownReviewItemError, match="999"):
        store.claim(999, "alice")
    with pytest.raises(ConfigurationError, match="reviewer"):
        store.claim(item.id, "")
    with pytest.raises(ReviewStateError, match=rf"already queued for review as item {item.id}"):
        store.enqueue(item.trace_id)
    with pytest.raises(UnknownTraceError, match="missing"):
        store.enqueue("missing")


def test_record_for_review_is_one_transaction(store: AuditStore) -> None:
    taken = store.record(rec())
    with pytest.raises(AuditStoreError, match="already"):
        store.record_for_review(rec(trace_id=taken))
    assert store.pending() == [] and store.count() == 1
    with pytest.raises(ConfigurationError, match="review_id"):
        store.record(rec(review_id=5))


def test_two_reviewers_racing_to_approve_exactly_one_wins(store: AuditStore, store_url: StoreUrl) -> None:
    # Two stores on one database, like two reviewer processes: the database itself arbitrates the race.
    other = AuditStore(store_url())
    stores = {"alice": store, "bob": other}
    items = [store.record_for_review(rec(prompt=f"q{i}")) for i in range(10)]
    for item in items:
        barrier = threading.Barrier(2)
        outcomes: dict[str, object] = {}

        def approve(
            reviewer: str, item_id: int = item.id, barrier: threading.Barrier = barrier, outcomes: dict[str, object] = outcomes
        ) -> None:
            barrier.wait()
            try:
                outcomes[reviewer] = stores[reviewer].approve(item_id, reviewer)
            except ReviewStateError as e:
                outcomes[reviewer] = e

        threads = [threading.Thread(target=approve, args=(name,)) for name in ("alice", "bob")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [name for name, out in outcomes.items() if isinstance(out, ReviewItem)]
        losers = [out for out in outcomes.values() if isinstance(out, ReviewStateError)]
        assert len(winners) == 1 and len(losers) == 1
        assert store.review_item(item.id).reviewer == winners[0]
        assert "'approved'" in str(losers[0])
    other.close()


# ----------------------------------------------------------------------------- concurrency and crashes


def in_threads(work: Callable[[int], object], n: int) -> list[BaseException | None]:
    """``work(k)`` for each k below ``n``, each in a thread of its own, all started then joined: what each
    raised (None: nothing), for the caller's assertion."""
    raised: list[BaseException | None] = [None] * n

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as e:  # reported by the caller's assertion
            raised[k] = e

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return raised


@pytest.mark.slow
def test_threads_and_processes_writing_one_file(store_url: StoreUrl) -> None:
    path = store_url("shared")
    with AuditStore(path) as store:
        children = [
            subprocess.Popen([sys.executable, "-c", WRITER, str(path), "200", f"proc{k}"], stdout=subprocess.DEVNULL)
            for k in range(2)
        ]

        def write(k: int) -> None:
            for i in range(200):
                store.record(rec(prompt=f"thread{k}-{i}"))

        raised = in_threads(write, 8)
        assert [c.wait(timeout=60) for c in children] == [0, 0]
        assert raised == [None] * 8
        assert store.count() == 2000
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT COUNT(DISTINCT trace_id), COUNT(DISTINCT prompt) FROM audit_records").one() == (
                2000,
                2000,
            )
    assert integrity(path) == "ok"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_writer_killed_mid_run_leaves_a_clean_store(store_url: StoreUrl) -> None:
    path = store_url("crash")
    AuditStore(path).close()
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), "-1", "crash"], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert child.stdout is not None
    committed = 0
    for line in child.stdout:
        committed = int(line)
        if committed >= 150:
            break
    os.kill(child.pid, signal.SIGKILL)
    for line in child.stdout:  # lines printed before the kill, still in the pipe
        committed = int(line)
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert committed >= 150

    with AuditStore(path) as store:
        n = store.count()
        assert committed <= n <= committed + 1
        store.record(rec(prompt="after the crash"))  # still usable
        assert store.count() == n + 1
    assert integrity(path) == "ok"


# ----------------------------------------------------------------------------- files, permissions, export safety


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")
def test_new_store_files_are_owner_only_and_existing_modes_are_kept(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        path = tmp_path / "audit.db"
        with AuditStore(path) as store:
            store.record(rec())
            for suffix in ("", "-wal", "-shm"):
                assert (Path(f"{path}{suffix}").stat().st_mode & 0o777) == 0o600, suffix
        assert [p.name for p in tmp_path.iterdir() if ".creating" in p.name] == []
        path.chmod(0o640)
        with AuditStore(path) as store:
            assert store.count() == 1
        assert (path.stat().st_mode & 0o777) == 0o640
    finally:
        os.umask(old_umask)


def test_empty_or_foreign_files_are_refused_never_recreated(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(AuditStoreError, match=r"empty\.db.*empty \(0 bytes\)"):
        AuditStore(empty)
    assert empty.stat().st_size == 0
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(AuditStoreError, match=r"notes\.txt is not an audit store \(not a SQLite database"):
        AuditStore(text)
    assert text.read_text() == "hello"
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(AuditStoreError, match=r"other\.db is a SQLite database but not an audit store"):
        AuditStore(other)
    con = sqlite3.connect(other)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["t"]
    con.close()


def test_a_store_without_the_os_user_columns_gets_them(store_url: StoreUrl) -> None:
    path = store_url("v1")
    with AuditStore(path) as store:
        item = store.record_for_review(rec())
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE review_items DROP COLUMN claimed_os_user")
            conn.exec_driver_sql("ALTER TABLE review_items DROP COLUMN reviewer_os_user")
    with AuditStore(path) as store:
        done = store.approve(item.id, "alice", os_user="alice_unix")
    assert (done.reviewer, done.reviewer_os_user, done.claimed_os_user) == ("alice", "alice_unix", "alice_unix")


def test_export_refuses_the_stores_own_files(store: AuditStore, tmp_path: Path) -> None:
    store.record(rec())
    db = tmp_path / "audit.db"
    (tmp_path / "link.jsonl").symlink_to(db)
    for target in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal"), tmp_path / "link.jsonl"):
        with pytest.raises(ConfigurationError, match="file of the audit store itself"):
            store.export(target, overwrite=True)
    assert store.count() == 1 and integrity(db) == "ok"


def test_export_refuses_an_existing_file_unless_overwrite(store: AuditStore, tmp_path: Path) -> None:
    store.record(rec())
    out = tmp_path / "out.jsonl"
    out.write_text("keep me")
    with pytest.raises(ConfigurationError, match=r"out\.jsonl: the file exists.*overwrite=True"):
        store.export(out)
    assert out.read_text() == "keep me"
    assert store.export(out, overwrite=True) == 1
    assert json.loads(out.read_text())["prompt"] == "What is the capital of France?"


@pytest.mark.parametrize("where", ["missing/out.jsonl", "folder"])
def test_export_io_errors_name_the_path_and_leave_nothing(store: AuditStore, tmp_path: Path, where: str) -> None:
    (tmp_path / "folder").mkdir()
    store.record(rec())
    with pytest.raises((AuditStoreError, ConfigurationError)) as info:
        store.export(tmp_path / where)
    assert str(tmp_path / where) in str(info.value)
    assert "does not exist" in str(info.value) or "is a folder" in str(info.value)


def test_export_on_a_full_disk_leaves_no_file(store: AuditStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from logtoku_guard.audit import _files

    store.record(rec())
    real_open = _files._open_text

    class Full:
        def __init__(self, fd: int) -> None:
            self.f = real_open(fd)

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *a: object) -> None:
            self.f.close()

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files, "_open_text", Full)
    out = tmp_path / "out.jsonl"
    with pytest.raises(AuditStoreError, match=r"out\.jsonl: No space left on device; check .* disk has space"):
        store.export(out)
    assert sorted(p.name for p in tmp_path.iterdir() if "out" in p.name) == []


# ----------------------------------------------------------------------------- redaction


@pytest.mark.parametrize("mode", ["hash", "drop", "callable"])
def test_redaction_keeps_the_raw_prompt_out_of_the_database(store_url: StoreUrl, mode: str) -> None:
    import hashlib

    secret = "my card is 4111-1111-1111-1111"
    redact: Any = (lambda s: s.replace("4111", "####")) if mode == "callable" else mode
    with AuditStore(store_url(), redact=redact) as store:
        store.record(rec(prompt=secret))
        item = store.record_for_review(rec(prompt=secret, answer="4111 noted"))
        prompts = {r.prompt for r in store.tail()}
        assert item.record.answer == "4111 noted"  # answers are kept unless redact_answer
        assert b"4111-1111" not in stored_bytes(store)  # the db, its -wal and -shm
    expected = {
        "hash": "sha256:" + hashlib.sha256(secret.encode()).hexdigest(),
        "drop": "",
        "callable": "my card is ####-1111-1111-1111",
    }[mode]
    assert prompts == {expected}
    with AuditStore(store_url()) as store:
        assert b"4111-1111" not in stored_bytes(store)


def test_redact_answer_is_opt_in_and_drops_token_texts(store_url: StoreUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = [{"token": "sec", "au": 0.1, "eu": 0.2}, {"token": "ret", "au": 0.1, "eu": 0.2}]
    with AuditStore(store_url("a"), redact="keep", redact_answer="drop") as store:
        store.record(rec(prompt="q", answer="secret", tokens=tokens))
        (r,) = store.tail()
        assert b"sec" not in stored_bytes(store)  # the db, its -wal and -shm
    assert (r.prompt, r.answer, [t["token"] for t in r.tokens], r.tokens[0]["eu"]) == ("q", "", ["", ""], 0.2)
    monkeypatch.setenv("LOGTOKU_GUARD_REDACT", "drop")
    with AuditStore(store_url("b")) as store:
        store.record(rec(prompt="q"))
        assert store.tail()[0].prompt == ""
    monkeypatch.setenv("LOGTOKU_GUARD_REDACT", "shred")
    with pytest.raises(ConfigurationError, match=r"\$LOGTOKU_GUARD_REDACT must be 'keep', 'hash', 'drop'"):
        AuditStore(store_url("c"))
    with pytest.raises(ConfigurationError, match="returned int"):
        AuditStore(store_url("d"), redact=lambda s: 3).record(rec())  # type: ignore[arg-type,return-value]


# ----------------------------------------------------------------------------- claims: release, expiry, OS user


def test_release_by_the_claimer_or_with_force(store: AuditStore) -> None:
    item = store.record_for_review(rec())
    with pytest.raises(ReviewStateError, match="not claimed"):
        store.release(item.id, "alice")
    store.claim(item.id, "alice", os_user="al")
    assert store.review_item(item.id).claimed_os_user == "al"
    with pytest.raises(ReviewStateError, match=r"claimed by 'alice'.*force=True"):
        store.release(item.id, "bob")
    back = store.release(item.id, "alice")
    assert (back.status, back.claimed_by, back.claimed_at, back.claimed_os_user) == ("pending", None, None, None)
    store.claim(item.id, "alice")
    assert store.release(item.id, "admin", force=True).status == "pending"
    assert store.claim(item.id, "bob").claimed_by == "bob"


def test_claims_expire_after_claim_ttl(store_url: StoreUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    from logtoku_guard.audit import queue

    clock = [NOW]
    monkeypatch.setattr(queue, "_utcnow", lambda: clock[0])
    with pytest.raises(ConfigurationError, match="claim_ttl"):
        AuditStore(store_url("x"), claim_ttl=timedelta(0))
    with AuditStore(store_url("a"), claim_ttl=timedelta(minutes=30)) as store:
        a = store.record_for_review(rec(prompt="a"))
        b = store.record_for_review(rec(prompt="b"))
        store.claim(a.id, "alice")
        store.claim(b.id, "alice")
        clock[0] = NOW + timedelta(minutes=29)
        with pytest.raises(ReviewStateError, match="until"):
            store.claim(a.id, "bob")
        with pytest.raises(ReviewStateError):
            store.approve(b.id, "bob")
        clock[0] = NOW + timedelta(minutes=31)
        taken = store.claim(a.id, "bob", os_user="bob_unix")
        assert (taken.claimed_by, taken.claimed_at, taken.claimed_os_user) == ("bob", clock[0], "bob_unix")
        with pytest.raises(ReviewStateError, match="'bob'"):
            store.approve(a.id, "alice")  # alice's claim is gone
        done = store.approve(b.id, "bob", os_user="bob_unix")
        assert (done.reviewer, done.claimed_by, done.claimed_at, done.reviewer_os_user) == ("bob", "bob", clock[0], "bob_unix")
    with AuditStore(store_url("a")) as store:  # no ttl: a claim holds
        c = store.record_for_review(rec(prompt="c"))
        store.claim(c.id, "alice")
        clock[0] = NOW + timedelta(days=365)
        with pytest.raises(ReviewStateError):
            store.claim(c.id, "bob")


@pytest.mark.slow
def test_processes_creating_one_new_store_at_once_all_succeed(store_url: StoreUrl, tmp_path: Path) -> None:
    path = store_url("new")
    children = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), "1", f"p{k}"], stdout=subprocess.DEVNULL) for k in range(4)
    ]
    assert [c.wait(timeout=60) for c in children] == [0, 0, 0, 0]
    with AuditStore(path) as store:
        assert store.count() == 4
    assert [p.name for p in tmp_path.iterdir() if ".creating" in p.name] == []
    assert integrity(path) == "ok"


def test_threads_opening_one_new_store_at_once_all_succeed(store_url: StoreUrl) -> None:
    # Schema creation is idempotent: stores opened at the same moment on an empty database all work.
    url = store_url("fresh")
    barrier = threading.Barrier(6)

    def open_and_write(k: int) -> None:
        barrier.wait()
        with AuditStore(url) as s:
            s.record(rec(prompt=f"opener {k}"))

    assert in_threads(open_and_write, 6) == [None] * 6
    with AuditStore(url) as s:
        assert s.count() == 6


@pytest.mark.parametrize("found", ["newer", "older", "garbage"])
def test_a_store_of_another_schema_version_is_refused_untouched(store_url: StoreUrl, found: str) -> None:
    value = {"newer": str(SCHEMA_VERSION + 1), "older": str(SCHEMA_VERSION - 1), "garbage": "v?"}[found]
    with AuditStore(store_url()) as store:
        store.record(rec())
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE audit_meta SET value = '{value}' WHERE key = 'schema_version'")
            conn.exec_driver_sql("ALTER TABLE review_items DROP COLUMN reviewer_os_user")  # must not come back
    expected = {
        "newer": rf"schema version {value}.*newer logtoku_guard.*reads version {SCHEMA_VERSION}.*upgrade logtoku_guard",
        "older": rf"schema version {value}.*older logtoku_guard.*version {SCHEMA_VERSION}",
        "garbage": r"schema version 'v\?'.*not a version",
    }[found]
    with pytest.raises(AuditStoreError, match=expected):
        AuditStore(store_url())
    url = store_url()
    engine = sa.create_engine(url if "://" in url else f"sqlite:///{url}")
    with engine.connect() as conn:
        columns = list(conn.exec_driver_sql("SELECT * FROM review_items").keys())
        version = conn.exec_driver_sql("SELECT value FROM audit_meta WHERE key = 'schema_version'").scalar()
    engine.dispose()
    assert "reviewer_os_user" not in columns and version == value


# -- names and files that must never become (or be read as) a store ------------------------------
@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_store_named_like_a_sqlite_side_file_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"p.db{suffix}"
    for given in (path, f"sqlite:///{path}"):
        with pytest.raises(ConfigurationError, match=rf"p\.db{suffix}.*{suffix[1:]} file of .*p\.db"):
            AuditStore(given)
    assert not path.exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_called_a_pipe_and_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "audit.db"
    os.mkfifo(fifo)
    with pytest.raises(AuditStoreError, match="named pipe") as info:
        AuditStore(fifo)  # reading it would block forever
    assert "empty" not in str(info.value)


def test_a_truncated_store_is_called_damaged(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    with AuditStore(path) as full:
        for i in range(50):
            full.record(
                AuditRecord(
                    model="m",
                    policy_name="p",
                    policy_version="1",
                    prompt=f"q{i}" * 200,
                    answer="a",
                    action="pass",
                    reason="r",
                    reliability=0.5,
                )
            )
    cut = tmp_path / "cut.db"
    cut.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(AuditStoreError, match="damaged") as info:
        AuditStore(cut)
    assert "permission" not in str(info.value) and "can write" not in str(info.value)


def test_create_false_opens_existing_stores_only(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    with pytest.raises(AuditStoreError, match=r"no audit store at .*typo\.db"):
        AuditStore(typo, create=False)
    assert not typo.exists()
    AuditStore(tmp_path / "real.db").close()
    with AuditStore(tmp_path / "real.db", create=False) as again:
        assert again.count() == 0


def _file_state(path: Path) -> list[tuple[str, int, bytes]]:
    """The files of the store at ``path`` (database and side files): name, mtime and content."""
    return sorted((p.name, p.stat().st_mtime_ns, p.read_bytes()) for p in path.parent.iterdir())


def test_create_false_writes_nothing_when_opening_a_current_store(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        audit.record(rec(prompt="kept"))
    before = _file_state(path)
    with AuditStore(path, create=False) as reader:
        assert [r.prompt for r in reader.tail(5)] == ["kept"]
    assert _file_state(path) == before
    # a read-only connection opens it too (the write probe of create=True would fail on one)
    with AuditStore(f"sqlite:///file:{path}?mode=ro&uri=true", create=False) as reader:
        assert reader.count() == 1


def test_create_false_still_adds_columns_a_store_of_this_version_lacks(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    AuditStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE review_items DROP COLUMN reviewer_os_user")
    conn.close()
    with AuditStore(path, create=False) as audit:
        assert audit.record_for_review(rec()).reviewer_os_user is None


def _read_only_copy(path: Path, folder: Path) -> Path:
    folder.mkdir()
    copy = folder / path.name
    copy.write_bytes(path.read_bytes())
    copy.chmod(0o444)
    folder.chmod(0o555)
    if os.access(copy, os.W_OK) or os.access(folder, os.W_OK):
        folder.chmod(0o755)
        pytest.skip("file permissions are not enforced for this user (root?)")
    return copy


def test_a_store_this_user_may_only_read_opens_with_create_false(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    with AuditStore(path) as audit:
        audit.record(rec(prompt="kept"))
        audit.record_for_review(rec(prompt="to review"))
    copy = _read_only_copy(path, tmp_path / "ro")
    try:
        with AuditStore(copy, create=False) as reader:
            assert [r.prompt for r in reader.tail(5)] == ["to review", "kept"]
            assert [i.record.prompt for i in reader.pending()] == ["to review"]
            with pytest.raises(AuditStoreError, match=r"readonly.*can write"):
                reader.record(rec())
        with pytest.raises(AuditStoreError, match="can write"):
            AuditStore(copy)  # opening for writing still fails at open, naming the fix
        assert sorted(p.name for p in copy.parent.iterdir()) == ["audit.db"]
    finally:
        copy.parent.chmod(0o755)


@pytest.mark.parametrize("n", [-1, 2**63, 10**30])
def test_tail_refuses_counts_outside_a_sql_integer(store: AuditStore, n: int) -> None:
    with pytest.raises(ConfigurationError, match="from 0 to 9223372036854775807"):
        store.tail(n)


def test_a_guarded_tool_call_is_recorded_with_its_argument_scores(store: AuditStore, tmp_path: Path) -> None:
    from logtoku_guard import Guard, Policy, ScriptedAnswer, ScriptedBackend

    pieces = ['<tool_call>{"name": "transfer", "arguments": {"amount": ', "12", "0", ', "to": "', "Bob", '"}}</tool_call>']
    logits = [[2.0, 1.0], [0.3, 0.2], [0.9, 0.1], [2.0, 1.0], [0.5, 0.4], [2.0, 1.0]]
    policy = Policy.from_dict({"name": "p", "version": "1", "rules": []})
    guard = Guard(ScriptedBackend([ScriptedAnswer(pieces, logits)], model_name="scripted"), policy)
    result = guard.run("Send 120 to Bob")
    record = AuditRecord.from_result(result, question="Send 120 to Bob")
    ((call),) = record.tool_calls
    assert call["name"] == "transfer" and set(call["arguments"]) == {"amount", "to"}
    amount, to = call["arguments"]["amount"], call["arguments"]["to"]
    by_index = {t["index"]: t for t in record.tokens}
    assert amount["tokens"] == 2 and amount["max_eu"] == max(by_index[1]["eu"], by_index[2]["eu"])
    assert to["tokens"] == 1 and to["logprob"] == pytest.approx(by_index[4]["logprob"])
    store.record(record)
    assert store.get(record.trace_id).tool_calls == record.tool_calls
    store.export(tmp_path / "out.csv", "csv")
    with (tmp_path / "out.csv").open() as f:
        assert json.loads(next(csv.DictReader(f))["tool_calls"]) == record.tool_calls


def test_a_store_without_the_tool_calls_column_gets_it(store_url: StoreUrl) -> None:
    path = store_url("v1")
    with AuditStore(path) as store:
        old = store.record(rec())
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE audit_records DROP COLUMN tool_calls")
    call = {"name": "ping", "arguments": {}}
    with AuditStore(path) as store:
        assert store.get(old).tool_calls == []  # written before the column existed
        new = store.record(rec(tool_calls=[call]))
        assert store.get(new).tool_calls == [call]


def test_tool_calls_must_be_a_list_of_dicts() -> None:
    with pytest.raises(ConfigurationError, match="tool_calls must be a list of dicts"):
        rec(tool_calls={"name": "ping"})
