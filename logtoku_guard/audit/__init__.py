"""The audit trail of guard decisions and the human-review queue.

:mod:`~logtoku_guard.audit.records`: :class:`AuditRecord` (built by
:meth:`AuditRecord.from_result`) and :class:`ReviewItem`, plain dataclasses, no SQLAlchemy, and
:class:`RecordSink`, what a guard needs from a store.
:mod:`~logtoku_guard.audit.store`: :class:`AuditStore`, the database of records and the review
queue, over the tables and SQLite settings of :mod:`~logtoku_guard.audit.schema` (SQLAlchemy).
The store's names are imported on first use, so ``from logtoku_guard.audit import AuditRecord``
does not import SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from logtoku_guard.audit.records import AuditRecord, RecordSink, ReviewItem, ReviewStatus

if TYPE_CHECKING:
    from logtoku_guard.audit.schema import SCHEMA_VERSION
    from logtoku_guard.audit.store import AuditStore, ExportFormat

__all__ = ["SCHEMA_VERSION", "AuditRecord", "AuditStore", "ExportFormat", "RecordSink", "ReviewItem", "ReviewStatus"]

_STORE_NAMES = frozenset({"AuditStore", "ExportFormat"})


def __getattr__(name: str) -> Any:
    if name in _STORE_NAMES:
        from logtoku_guard.audit import store

        return getattr(store, name)
    if name == "SCHEMA_VERSION":
        from logtoku_guard.audit import schema

        return schema.SCHEMA_VERSION
    msg = f"module 'logtoku_guard.audit' has no attribute {name!r}"
    raise AttributeError(msg)
