"""What ``audit stats`` reads of the store: each decision's time, model, policy, rule, action and
statistics (no texts, no tokens), streamed a page at a time, and ranked by one statistic in SQL.

:class:`DecisionReads` is the part of :class:`~logtoku_guard.audit.store.AuditStore` that reads
:class:`~logtoku_guard.audit.records.DecisionRow` values (not used alone):
:meth:`~DecisionReads.iter_decisions` passes every row once and keeps none;
:meth:`~DecisionReads.ranked_decisions` gives one model's rows of a time span in the order of one
statistic as the database sorts it, so a quantile is the k-th row of a stream
(:mod:`logtoku_guard.calibration.drift`), never a list of the whole store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from logtoku_guard.audit.records import DecisionRow, SkippedRow, StoredRows, utc_since
from logtoku_guard.audit.schema import (
    _BadColumn,
    _check_batch_size,
    _numbers,
    _record_row,
    _records,
    _text,
    _time,
    at_or_after,
    read_rows,
)
from logtoku_guard.errors import ConfigurationError, short_repr

__all__ = ["DecisionReads"]

_DECISION_SELECT = sa.select(
    *(_records.c[c] for c in ("created_at", "model", "policy_name", "rule", "action", "stats", "trace_id")),
    _records.c.id.label("row_id"),
)
"""What :func:`_decision_row` reads of a record (no texts, no tokens)."""


def _decision_row(m: sa.RowMapping) -> DecisionRow:
    """What drift statistics read of one row, checked like a whole record (:func:`_row_to_record`)."""
    created = _time(m, "created_at", "created_at")
    assert created is not None
    if type(m["action"]) is not str:
        raise _BadColumn("action", m["action"], "not text")
    return DecisionRow(
        created,
        str(_text(m, "model", "model")),
        str(_text(m, "policy_name", "policy_name")),
        _text(m, "rule", "rule", optional=True),
        m["action"],
        dict(_numbers(m, "stats", "stats")),
    )


class DecisionReads:
    """The decision-reading methods of :class:`~logtoku_guard.audit.store.AuditStore` (not used alone)."""

    _sqlite: bool

    if TYPE_CHECKING:

        def _transaction(self, action: str, *, write: bool) -> AbstractContextManager[Connection]: ...

    def decisions(self, since: datetime | None = None) -> StoredRows[DecisionRow]:
        """Each record's time, model, policy, rule, action and statistics (no tokens), oldest first;
        ``since``: at or after it (aware, UTC). Unreadable rows are left out and listed in ``skipped``.
        Every row is held in memory: :meth:`iter_decisions` streams them."""
        skipped: list[SkippedRow] = []
        return StoredRows(list(self.iter_decisions(since, skipped=skipped)), skipped)

    def iter_decisions(
        self, since: datetime | None = None, *, skipped: list[SkippedRow], batch_size: int = 1000
    ) -> Iterator[DecisionRow]:
        """:meth:`decisions`, streamed: fetched ``batch_size`` rows at a time and none kept, so memory stays
        flat however large the store. An unreadable row is logged, appended to ``skipped`` and left out.
        The read transaction stays open until the iterator is exhausted or closed."""
        since = utc_since(since)
        _check_batch_size(batch_size)
        stmt = _DECISION_SELECT.order_by(_records.c.created_at, _records.c.id).execution_options(yield_per=batch_size)
        if since is not None:
            stmt = stmt.where(at_or_after(_records.c.created_at, since, self._sqlite))
        return self._decision_stream(stmt, skipped)

    def ranked_decisions(
        self, stat: str, *, model: str, first: datetime, last: datetime, batch_size: int = 1000
    ) -> Iterator[DecisionRow]:
        """The readable decisions of ``model`` created from ``first`` to ``last`` (inclusive, aware UTC),
        ascending by the statistic ``stat`` as the database orders the stored JSON value (then by time and
        row id), streamed ``batch_size`` rows at a time: the ``k``-th of a group's values without holding
        the group (``audit stats``' quantiles). The numbers come first, in numeric order; where the key is
        missing or holds something else, those rows come before or after all of them (as the database
        sorts it): check each row's value. Unreadable rows are left out unlogged: this is a second read of
        rows :meth:`iter_decisions` reports."""
        if not isinstance(stat, str) or not stat:
            msg = f"stat must be a statistic's name, got {short_repr(stat)}"
            raise ConfigurationError(msg)
        _check_batch_size(batch_size)
        for name, when in (("first", first), ("last", last)):
            if not isinstance(when, datetime) or when.tzinfo is None:
                msg = f"{name} must be an aware datetime (UTC), got {short_repr(when)}"
                raise ConfigurationError(msg)
        stats = _records.c.stats
        value: sa.ColumnElement[Any]
        if self._sqlite:  # json_extract fails the whole query on a value that is not JSON text: only valid text is read
            valid = sa.and_(sa.func.typeof(stats) == "text", sa.func.json_valid(stats) == 1)
            value = sa.case((valid, sa.func.json_extract(stats, sa.literal('$."' + stat.replace('"', '""') + '"'))))
        else:  # JSONB orders its values: numbers among themselves numerically, apart from every other kind
            value = stats[stat]
        stmt = (
            _DECISION_SELECT.where(_records.c.model == model, _records.c.created_at >= first, _records.c.created_at <= last)
            .order_by(value, _records.c.created_at, _records.c.id)
            .execution_options(yield_per=batch_size)
        )
        return self._decision_stream(stmt, None)

    def _decision_stream(self, stmt: sa.Select[Any], skipped: list[SkippedRow] | None) -> Iterator[DecisionRow]:
        with self._transaction("read", write=False) as conn:
            yield from read_rows(conn.execute(stmt).mappings(), _decision_row, _record_row, skipped)
