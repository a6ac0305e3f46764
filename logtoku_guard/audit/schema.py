"""The audit store's tables (SQLAlchemy Core), row conversions and SQLite settings.

Tables: ``audit_records`` (one row an :class:`~logtoku_guard.audit.records.AuditRecord`),
``review_items`` (one row a review item, keyed by trace id) and ``audit_meta`` (the schema
version). Columns added after version 1 are nullable and added on open
(:func:`_add_missing_columns`). Times are stored as naive UTC and read back as aware UTC; JSON
columns are JSONB on PostgreSQL. SQLite connections get WAL, ``busy_timeout``,
``synchronous=NORMAL`` and foreign keys, and write transactions start with ``BEGIN IMMEDIATE``
(see :mod:`logtoku_guard.audit.store`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from typing import IO, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from logtoku_guard.audit._jsonb import LazyJSONB
from logtoku_guard.audit.records import (
    _REVIEW_STATUSES,
    AuditRecord,
    ReviewItem,
    SkippedRow,
    unreadable_row_error,
)
from logtoku_guard.errors import AuditStoreError, ConfigurationError, short_repr

logger = logging.getLogger("logtoku_guard.audit")
logger.addHandler(logging.NullHandler())  # reported by the callers (the CLI prints them); shown when logging is configured

SCHEMA_VERSION = 1
"""Version of the tables below; a store written by another version is refused, not altered.
Nullable columns added later (``claimed_os_user``, ``reviewer_os_user``, ``tool_calls``) keep the version: a
store of this version that lacks them gets them when opened."""

_ADDED_COLUMNS = {"review_items": ("claimed_os_user", "reviewer_os_user"), "audit_records": ("tool_calls",)}

_WRITE_OPTION = "logtoku_write"  # execution option: this transaction writes (SQLite: BEGIN IMMEDIATE)


class _UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Aware UTC datetimes in Python, naive UTC in the database (the same on every backend)."""

    impl = sa.DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None or value.tzinfo is None:
            return value
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)

    def result_processor(self, dialect: sa.Dialect, coltype: object) -> Callable[[Any], Any]:
        """Never raises while rows are fetched: a stored value that is not a date and time (text
        such as ``'garbage'`` or ``'2026-13-45'``, a number: SQLite keeps whatever was written)
        comes back as :class:`Unreadable`, which the row's reader reports and skips."""
        inner = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if value is None or isinstance(value, Unreadable):
                return value
            try:
                out = inner(value) if inner is not None else value
            except (ValueError, TypeError, OverflowError, AttributeError):
                return Unreadable(value)
            return out if isinstance(out, datetime) else Unreadable(value)

        return process


class Unreadable:
    """A stored value its column's type cannot read (kept raw, for the report); see :func:`read_rows`."""

    __slots__ = ("raw",)

    def __init__(self, raw: object) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return short_repr(self.raw, 60)


def _json_loads(text: str | bytes) -> Any:
    """The JSON columns' reader (``create_engine(json_deserializer=...)``): text that is not JSON
    comes back as :class:`Unreadable` instead of failing the whole fetch."""
    if isinstance(text, Unreadable):
        return text
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return Unreadable(text)


def _sqlite_text(raw: bytes) -> str | Unreadable:
    """SQLite's ``text_factory``: a TEXT value that is not UTF-8 comes back as :class:`Unreadable`
    (the default would fail the whole query with "Could not decode to UTF-8 column")."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return Unreadable(raw)


_JSON = sa.JSON().with_variant(LazyJSONB(), "postgresql")
_metadata = sa.MetaData()

_records = sa.Table(
    "audit_records",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("trace_id", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", _UTCDateTime(), nullable=False, index=True),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("policy_name", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("answer", sa.Text, nullable=False),
    sa.Column("action", sa.String(64), nullable=False, index=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("rule", sa.Text),
    sa.Column("reliability", sa.Double),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("tokens", _JSON, nullable=False),
    sa.Column("stats", _JSON, nullable=False),
    sa.Column("timings", _JSON, nullable=False),
    sa.Column("review_id", sa.Integer),
    sa.Column("tool_calls", _JSON),  # added after version 1: nullable (read back as [])
)

_reviews = sa.Table(
    "review_items",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("trace_id", sa.String(64), sa.ForeignKey("audit_records.trace_id"), nullable=False, unique=True),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("created_at", _UTCDateTime(), nullable=False),
    sa.Column("claimed_by", sa.Text),
    sa.Column("claimed_at", _UTCDateTime()),
    sa.Column("reviewer", sa.Text),
    sa.Column("decided_at", _UTCDateTime()),
    sa.Column("edited_answer", sa.Text),
    sa.Column("note", sa.Text),
    # Added after version 1 shipped: nullable, so older code reading the table is unaffected
    # (see _add_missing_columns).
    sa.Column("claimed_os_user", sa.Text),
    sa.Column("reviewer_os_user", sa.Text),
    sa.CheckConstraint("status IN ('pending', 'claimed', 'approved', 'rejected')", name="review_items_status"),
)

_meta = sa.Table(
    "audit_meta",
    _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(AuditRecord))
_REVIEW_FIELDS = tuple(f.name for f in dataclasses.fields(ReviewItem) if f.name != "record")


def item_select(review: Iterable[str], record: Iterable[str], *extra: sa.ColumnElement[Any] | sa.Label[Any]) -> sa.Select[Any]:
    """Review items, with these columns of theirs (labelled ``r_<name>``), of their records (``a_<name>``),
    ``extra`` and the record's row id (``a_row_id``: :func:`record_columns` reads it). An outer join, so an
    item whose record is missing is reported, not lost."""
    return sa.select(
        *(_reviews.c[name].label(f"r_{name}") for name in review),
        *(_records.c[name].label(f"a_{name}") for name in record),
        *extra,
        _records.c.id.label("a_row_id"),
    ).select_from(_reviews.outerjoin(_records, _reviews.c.trace_id == _records.c.trace_id))


_item_select = item_select(_REVIEW_FIELDS, _RECORD_FIELDS)
"""Review items with their whole records."""
_record_select = sa.select(*(_records.c[name] for name in _RECORD_FIELDS), _records.c.id.label("row_id"))
_record_insert = sa.insert(_records)

_json_dumps = partial(json.dumps, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def at_or_after(column: sa.ColumnElement[Any], when: datetime, sqlite: bool) -> sa.ColumnElement[bool]:
    """``column >= when``, and on SQLite also a value not stored as text (a number or bytes written over a
    time): SQLite sorts those before or after every text, so the window would silently drop or keep them;
    read, they are reported as unreadable instead (PostgreSQL's timestamp columns hold only times)."""
    if not sqlite:
        return column >= when
    return sa.or_(column >= when, sa.func.typeof(column).not_in(("text", "null")))


class _BadColumn(Exception):
    """Internal: one column of a row holds what its field cannot be."""

    def __init__(self, column: str, value: Any, problem: str) -> None:
        super().__init__(column)
        self.column, self.value, self.problem = column, value, problem


_TEXT = "not text"
_TIME = "not a date and time"
_NUMBER = "not a number"


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, Unreadable) else short_repr(value, 60)


def _text(m: sa.RowMapping, key: str, column: str, *, optional: bool = False) -> str | None:
    v = m[key]
    if type(v) is str or (v is None and optional):
        return v
    raise _BadColumn(column, v, "missing (NULL)" if v is None else _TEXT)


def _time(m: sa.RowMapping, key: str, column: str, *, optional: bool = False) -> datetime | None:
    v = m[key]
    if isinstance(v, datetime) or (v is None and optional):
        return v
    raise _BadColumn(column, v, "missing (NULL)" if v is None else _TIME)


def _int(m: sa.RowMapping, key: str, column: str, *, optional: bool = False) -> int | None:
    v = m[key]
    if (type(v) is int) or (v is None and optional):
        return v
    raise _BadColumn(column, v, "missing (NULL)" if v is None else "not a whole number")


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _numbers(m: sa.RowMapping, key: str, column: str) -> dict[str, float | None]:
    v = m[key]
    if type(v) is not dict:
        raise _BadColumn(column, v, "not a JSON object of numbers")
    for name, x in v.items():
        if not _number(x):
            raise _BadColumn(f"{column}[{name!r}]", x, _NUMBER)
    return v


def _dicts(m: sa.RowMapping, key: str, column: str, *, optional: bool = False) -> list[dict[str, Any]]:
    v = m[key]
    if v is None and optional:
        return []
    if type(v) is not list:
        raise _BadColumn(column, v, "not a JSON list of objects")
    for i, x in enumerate(v):
        if type(x) is not dict:
            raise _BadColumn(f"{column}[{i}]", x, "not a JSON object")
    return v


def _reliability(m: sa.RowMapping, key: str) -> float | None:
    v = m[key]
    if not _number(v) or (isinstance(v, float) and not math.isfinite(v)):
        raise _BadColumn("reliability", v, "not a finite number")
    return v


def _status(m: sa.RowMapping, allowed: tuple[str, ...] = _REVIEW_STATUSES, problem: str = "") -> Any:
    """A review item's ``status`` (``r_status``), one of ``allowed`` (``problem`` says what else it must be)."""
    v = m["r_status"]
    if v not in allowed:
        raise _BadColumn("status", v, problem or f"not one of {', '.join(allowed)}")
    return v


def _row_to_record(m: sa.RowMapping, prefix: str = "") -> AuditRecord:
    """The record of one ``audit_records`` row, every column checked (:class:`_BadColumn` names the first
    that cannot be read: a row written by this code always reads, one edited by hand may not)."""
    # Rows were validated and made JSON-safe when written: rebuild without __post_init__'s copies
    # (the dominant cost of pending() and export otherwise); only the types are checked here.
    p = prefix
    reliability = _reliability(m, p + "reliability")
    attempts = _int(m, p + "attempts", "attempts")
    if attempts is not None and attempts < 0:
        raise _BadColumn("attempts", attempts, "negative")
    values: dict[str, Any] = {
        "trace_id": _text(m, p + "trace_id", "trace_id"),
        "created_at": _time(m, p + "created_at", "created_at"),
        "model": _text(m, p + "model", "model"),
        "policy_name": _text(m, p + "policy_name", "policy_name"),
        "policy_version": _text(m, p + "policy_version", "policy_version"),
        "prompt": _text(m, p + "prompt", "prompt"),
        "answer": _text(m, p + "answer", "answer"),
        "action": _text(m, p + "action", "action"),
        "reason": _text(m, p + "reason", "reason"),
        "rule": _text(m, p + "rule", "rule", optional=True),
        "reliability": reliability,
        "attempts": attempts,
        "tokens": _dicts(m, p + "tokens", "tokens"),
        "stats": _numbers(m, p + "stats", "stats"),
        "timings": _numbers(m, p + "timings", "timings"),
        "tool_calls": _dicts(m, p + "tool_calls", "tool_calls", optional=True),  # None: written before the column
        "review_id": _int(m, p + "review_id", "review_id", optional=True),
    }
    rec = object.__new__(AuditRecord)
    for name in _RECORD_FIELDS:
        object.__setattr__(rec, name, values[name])
    return rec


def _row_to_item(m: sa.RowMapping) -> ReviewItem:
    """The review item of one joined row (see :func:`_row_to_record`; its own columns checked too)."""
    status = _status(m)
    return ReviewItem(
        id=_int(m, "r_id", "id"),  # type: ignore[arg-type]
        trace_id=_text(m, "r_trace_id", "trace_id"),  # type: ignore[arg-type]
        status=status,
        created_at=_time(m, "r_created_at", "created_at"),  # type: ignore[arg-type]
        claimed_by=_text(m, "r_claimed_by", "claimed_by", optional=True),
        claimed_at=_time(m, "r_claimed_at", "claimed_at", optional=True),
        reviewer=_text(m, "r_reviewer", "reviewer", optional=True),
        decided_at=_time(m, "r_decided_at", "decided_at", optional=True),
        edited_answer=_text(m, "r_edited_answer", "edited_answer", optional=True),
        note=_text(m, "r_note", "note", optional=True),
        claimed_os_user=_text(m, "r_claimed_os_user", "claimed_os_user", optional=True),
        reviewer_os_user=_text(m, "r_reviewer_os_user", "reviewer_os_user", optional=True),
        record=_record_of_item(m),
    )


_NO_RECORD = "a trace id with no audit record (the record was deleted or its trace_id edited)"


@contextmanager
def record_columns(m: sa.RowMapping) -> Iterator[None]:
    """Read the joined record's columns of a review item's row (:func:`item_select`) inside: a missing
    record, or a column of it that cannot be read, names the record's row, not the item's."""
    if m["a_row_id"] is None:  # the outer join found no record: the item's trace_id names none
        raise _BadColumn("trace_id", m["r_trace_id"], _NO_RECORD)
    try:
        yield
    except _BadColumn as e:  # the item's own row is fine, its record's is not: name the record's table
        raise _BadRecordOfItem(e) from None


def _record_of_item(m: sa.RowMapping) -> AuditRecord:
    with record_columns(m):
        return _row_to_record(m, "a_")


class _BadRecordOfItem(Exception):
    def __init__(self, bad: _BadColumn) -> None:
        super().__init__(bad.column)
        self.bad = bad


_R = TypeVar("_R")


def _skipped(m: sa.RowMapping, table: str, id_key: str, trace_key: str, exc: Exception) -> SkippedRow:
    if isinstance(exc, _BadRecordOfItem):  # a review item whose record is the unreadable row
        table, id_key, trace_key, exc = "audit_records", "a_row_id", "a_trace_id", exc.bad
    assert isinstance(exc, _BadColumn)
    row_id = m.get(id_key)
    trace = m.get(trace_key, m.get("r_trace_id"))
    return SkippedRow(
        table=table,
        row_id=row_id if type(row_id) is int else None,
        column=exc.column,
        value=_shown(exc.value),
        problem=exc.problem,
        trace_id=trace if type(trace) is str else None,
    )


def _item_row(m: sa.RowMapping, exc: Exception) -> SkippedRow:
    return _skipped(m, "review_items", "r_id", "r_trace_id", exc)


def _record_row(m: sa.RowMapping, exc: Exception) -> SkippedRow:
    return _skipped(m, "audit_records", "row_id", "trace_id", exc)


def read_rows(
    rows: Iterable[sa.RowMapping],
    convert: Callable[[sa.RowMapping], _R],
    where: Callable[[sa.RowMapping, Exception], SkippedRow],
    skipped: list[SkippedRow] | None,
) -> Iterator[_R]:
    """``convert`` each row; a row that cannot be read is logged, appended to ``skipped`` and left out
    (``skipped`` None: left out only, for a second read of rows a first one reported)."""
    for m in rows:
        try:
            yield convert(m)
        except (_BadColumn, _BadRecordOfItem) as exc:
            if skipped is not None:
                row = where(m, exc)
                logger.warning("skipped an unreadable row of the audit store: %s", row.describe())
                skipped.append(row)


def read_one(
    m: sa.RowMapping, convert: Callable[[sa.RowMapping], _R], where: Callable[[sa.RowMapping, Exception], SkippedRow]
) -> _R:
    """``convert`` the one row asked for; an unreadable one raises :class:`UnreadableRowError`."""
    try:
        return convert(m)
    except (_BadColumn, _BadRecordOfItem) as exc:
        raise unreadable_row_error(where(m, exc)) from None


def _add_missing_columns(conn: Connection) -> None:
    """Add the nullable columns introduced after version 1 to a store that lacks them."""
    inspector = sa.inspect(conn)
    for table, names in _ADDED_COLUMNS.items():
        present = {c["name"] for c in inspector.get_columns(table)}
        for name in names:
            if name not in present:
                kind = _metadata.tables[table].c[name].type.compile(dialect=conn.dialect)  # JSONB on PostgreSQL
                conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    """Per-connection pragmas, and our own BEGIN (IMMEDIATE for writes) instead of pysqlite's."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite would emit BEGIN lazily (and never before a SELECT): take over transactions.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()
        dbapi_conn.text_factory = _sqlite_text

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock first (waiting up to busy_timeout), so a write
        # transaction never fails half-way on a stale read snapshot.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE_OPTION) else "BEGIN")


def _check_version(version: str | None, where: str) -> None:
    """Refuse a store whose schema version is not this code's (the message says which is newer)."""
    if version is None or version == str(SCHEMA_VERSION):
        return
    try:
        found = int(version)
    except ValueError:
        msg = (
            f"the audit store at {where} has schema version {version!r}, which is not a version number; "
            "it is damaged or not an audit store"
        )
        raise AuditStoreError(msg) from None
    if found > SCHEMA_VERSION:
        msg = (
            f"the audit store at {where} has schema version {found}, written by a newer logtoku_guard; this one reads "
            f"version {SCHEMA_VERSION} only: upgrade logtoku_guard (pip install -U logtoku-guard) to open it"
        )
    else:
        msg = (
            f"the audit store at {where} has schema version {found}, written by an older logtoku_guard; this one reads "
            f"version {SCHEMA_VERSION} only and does not migrate: export it with that version, then start a new store"
        )
    raise AuditStoreError(msg)


def _write_rows(conn: Connection, f: IO[str], fmt: str, skipped: list[SkippedRow]) -> int:
    """Every readable record, oldest first, to ``f`` as JSONL or CSV (unreadable ones into ``skipped``); how many."""
    stmt = _record_select.order_by(_records.c.created_at, _records.c.id).execution_options(yield_per=1000)
    rows = (rec.to_dict() for rec in read_rows(conn.execute(stmt).mappings(), _row_to_record, _record_row, skipped))
    n = 0
    if fmt == "jsonl":
        for d in rows:
            f.write(_json_dumps(d) + "\n")
            n += 1
    else:
        writer = csv.DictWriter(f, fieldnames=_RECORD_FIELDS)
        writer.writeheader()
        for d in rows:
            for name in ("tokens", "stats", "timings", "tool_calls"):
                d[name] = _json_dumps(d[name])
            writer.writerow(d)
            n += 1
    return n


def _check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be a positive integer, got {short_repr(batch_size)}"
        raise ConfigurationError(msg)
