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

import dataclasses
import json
from datetime import datetime, timezone
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine

from logtoku_guard.audit.records import AuditRecord, ReviewItem

SCHEMA_VERSION = 1
"""Version of the tables below; a store written by another version is refused, not altered.
Nullable columns added later (``claimed_os_user``, ``reviewer_os_user``) keep the version: a
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


_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
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
    # Added after version 1 shipped (see _add_missing_columns): NULL reads back as [].
    sa.Column("tool_calls", _JSON),
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
_item_select = sa.select(
    *(_reviews.c[name].label(f"r_{name}") for name in _REVIEW_FIELDS),
    *(_records.c[name].label(f"a_{name}") for name in _RECORD_FIELDS),
).select_from(_reviews.join(_records, _reviews.c.trace_id == _records.c.trace_id))
_record_select = sa.select(*(_records.c[name] for name in _RECORD_FIELDS))
_record_insert = sa.insert(_records)

_json_dumps = partial(json.dumps, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _row_to_record(m: sa.RowMapping, prefix: str = "") -> AuditRecord:
    # Rows were validated and made JSON-safe when written: rebuild without __post_init__'s copies
    # (the dominant cost of pending() and export otherwise).
    rec = object.__new__(AuditRecord)
    for name in _RECORD_FIELDS:
        object.__setattr__(rec, name, m[prefix + name])
    if rec.tool_calls is None:  # a record written before the column existed
        object.__setattr__(rec, "tool_calls", [])
    return rec


def _row_to_item(m: sa.RowMapping) -> ReviewItem:
    return ReviewItem(**{name: m[f"r_{name}"] for name in _REVIEW_FIELDS}, record=_row_to_record(m, "a_"))


def _add_missing_columns(conn: Connection) -> None:
    """Add the nullable columns introduced after version 1 to a store that lacks them."""
    inspector = sa.inspect(conn)
    for table, names in _ADDED_COLUMNS.items():
        present = {c["name"] for c in inspector.get_columns(table)}
        for name in names:
            if name not in present:
                kind = _metadata.tables[table].c[name].type.compile(dialect=conn.dialect)
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

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock first (waiting up to busy_timeout), so a write
        # transaction never fails half-way on a stale read snapshot.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE_OPTION) else "BEGIN")
