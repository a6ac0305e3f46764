"""``audit stats`` streams the store (issue 43): memory stays flat however many decisions it holds.

The decisions pass once through :meth:`AuditStore.iter_decisions` (fetched a page at a time, none
kept) and each quantile is the k-th value of :meth:`AuditStore.ranked_decisions`, a stream the
database sorts. The report must equal the one computed from every row held in memory
(:meth:`AuditStore.decisions`, :func:`drift_report` without ``ranked``), on SQLite and PostgreSQL,
with ties, integers, undefined values, rows edited by hand and unreadable rows among them. How many
decision rows are alive at once is counted through a spy on the row reader (no timing).
"""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.postgres import PostgresServer, postgres_server
from typer.testing import CliRunner

from logtoku_guard.audit import AuditRecord, AuditStore
from logtoku_guard.audit import decisions as decisions_module
from logtoku_guard.calibration.drift import drift_report
from logtoku_guard.cli import app

__all__ = ["postgres_server"]  # the session fixture, used by the PostgreSQL half

N = 1500
T0 = datetime(2026, 10, 1, tzinfo=timezone.utc)


def decisions(n: int, seed: int = 7) -> Iterator[AuditRecord]:
    rng = random.Random(seed)
    for i in range(n):
        stats: dict[str, Any] = {
            # ties (one decimal), integers, undefined values and missing keys
            "guard_score": rng.choice([None, 1, 0, round(rng.random(), 1), rng.random()]),
            "max_eu": rng.random() if i % 7 else 2,
            "other": 0.5,
        }
        if i % 13 == 0:
            del stats["guard_score"]
        action = rng.choice(["pass", "pass", "retrieve", "abstain"])
        yield AuditRecord(
            model=rng.choice(["m1", "m2 [x]"]),
            policy_name="p",
            policy_version="1",
            prompt="q",
            answer="a",
            action=action,
            reason="r",
            rule=None if action == "pass" else rng.choice(["r1", "r2", None]),
            reliability=0.0,
            tokens=[],
            stats=stats,
            created_at=T0 + timedelta(hours=rng.random() * 24 * 30),
        )


def fill(store: AuditStore, n: int) -> None:
    with store._transaction("write a record to", write=True) as conn:  # one transaction: seconds, not minutes
        for rec in decisions(n):
            store._insert_record(conn, rec)


def edit_rows(store: AuditStore) -> None:
    """Rows changed by hand: values the database orders otherwise than Python reads them, and unreadable rows."""
    sqlite = store.engine.dialect.name == "sqlite"
    value = ":s" if sqlite else "CAST(:s AS jsonb)"
    edits = {
        3: '{"guard_score": "x", "max_eu": 0.1}',  # unreadable: a text where a number belongs
        4: '{"guard_score": true, "max_eu": 0.1}',  # unreadable: a boolean
        5: '{"guard_score": 1e400, "max_eu": 0.3}',  # read as infinity: counted, left out of the quantiles
        6: '{"guard_score": 0.99, "guard_score": 0.01, "max_eu": 0.3}',  # a repeated key: read as its last value
    }
    with store.engine.begin() as conn:
        for row_id, stats in edits.items():
            conn.execute(sa.text(f"UPDATE audit_records SET stats = {value} WHERE id = :i"), {"s": stats, "i": row_id})
        if sqlite:  # text that is not JSON, bytes and a time that is not a time: SQLite keeps whatever is written
            conn.execute(sa.text("UPDATE audit_records SET stats = 'not json' WHERE id = 7"))
            conn.execute(sa.text("UPDATE audit_records SET stats = x'00ff' WHERE id = 8"))
            conn.execute(sa.text("UPDATE audit_records SET created_at = 'garbage' WHERE id = 9"))


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of :data:`N` decisions, some edited by hand (:func:`edit_rows`): a SQLite file or a PostgreSQL database."""
    if request.param == "sqlite":
        where = str(tmp_path / "audit.db")
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        where = server.new_database()
    with AuditStore(where) as s:
        fill(s, N)
        edit_rows(s)
    return where


@pytest.fixture
def store(url: str) -> Iterator[AuditStore]:
    with AuditStore(url, create=False) as s:
        yield s


class AliveRows:
    """A spy on the store's decision-row reader: how many rows it made, and the most alive at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = self.alive = self.peak = 0
        real = decisions_module._decision_row

        def spy(m: Any) -> Any:
            row = real(m)
            self.made += 1
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            weakref.finalize(row, self._gone)
            return row

        monkeypatch.setattr(decisions_module, "_decision_row", spy)

    def _gone(self) -> None:
        self.alive -= 1


def streamed(store: AuditStore, by: str) -> list[dict[str, object]]:
    def ranked(stat: str, model: str, first: datetime, last: datetime) -> Iterator[Any]:
        return store.ranked_decisions(stat, model=model, first=first, last=last)

    periods = drift_report(store.iter_decisions(skipped=[]), by, None, ranked)  # type: ignore[arg-type]
    return [p.as_json() for p in periods]


@pytest.mark.parametrize("by", ["day", "week"])
def test_the_streamed_report_equals_the_one_from_every_row_in_memory(
    store: AuditStore, by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [p.as_json() for p in drift_report(list(store.decisions()), by)]  # type: ignore[arg-type]
    spy = AliveRows(monkeypatch)
    got = streamed(store, by)
    assert got == held
    assert len(got) > (25 if by == "day" else 8) and sum(p["answers"] for p in got) > N - 10  # type: ignore[misc]
    quantiles = [v for p in got for v in p["guard_score_quantiles"].values()]  # type: ignore[attr-defined]
    assert 0 in quantiles and 1 in quantiles and any(type(v) is int for v in quantiles)  # ties of integers
    assert spy.made > N and spy.peak <= 5  # the rows pass one at a time (two streams at once at most): none is kept


def test_the_quantiles_stream_sorted_by_the_database(store: AuditStore) -> None:
    rows = list(store.ranked_decisions("max_eu", model="m1", first=T0, last=T0 + timedelta(days=40)))
    values = [r.stats["max_eu"] for r in rows]
    assert len(values) > N / 3 and values == sorted(values)
    assert all(r.model == "m1" for r in rows)
    with pytest.raises(Exception, match="aware datetime"):
        store.ranked_decisions("max_eu", model="m1", first=datetime(2026, 1, 1), last=T0)


def test_audit_stats_never_holds_the_store_and_prints_what_it_printed(
    store: AuditStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = [p.as_json() for p in drift_report(list(store.decisions()), "week")]  # type: ignore[arg-type]
    skipped = [s.as_json() for s in store.decisions().skipped]
    spy = AliveRows(monkeypatch)

    def no_list(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("audit stats read every row into memory (AuditStore.decisions)")

    monkeypatch.setattr(AuditStore, "decisions", no_list)
    res = CliRunner().invoke(app, ["audit", "stats", "--store", url, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["periods"] == held and data["skipped"] == skipped
    assert len(skipped) == (5 if store.engine.dialect.name == "sqlite" else 2)
    assert spy.made > N and spy.peak <= 5
