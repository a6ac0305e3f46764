"""The queue page's query: one page of review items, filtered, with counts (no token payloads).

A page reads only the light columns (ids, times, people, question, model, rule, reliability),
never the records' token lists, and pages with ``LIMIT``/``OFFSET`` over the indexed status, so
a queue of 10 000 items lists in milliseconds (``benchmarks/bench_review_page.py``).

A row that cannot be read (a time that is not a time, a number stored as text: see
:class:`~logtoku_guard.audit.records.SkippedRow`) is left off the page and listed in
:attr:`QueuePage.skipped`, which the page shows: one bad row never takes down the queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

import sqlalchemy as sa

from logtoku_guard.audit.records import SkippedRow, _utcnow
from logtoku_guard.audit.schema import (
    _BadColumn,
    _item_row,
    _records,
    _reliability,
    _reviews,
    _status,
    _text,
    _time,
    at_or_after,
    item_select,
    read_rows,
    record_columns,
)
from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    from logtoku_guard.audit.store import AuditStore

__all__ = ["QueueFilter", "QueuePage", "QueueRow", "QueueView", "list_queue"]

QueueView = Literal["pending", "claimed", "decided", "all"]
_VIEW_STATUSES: dict[str, tuple[str, ...]] = {
    "pending": ("pending",),
    "claimed": ("claimed",),
    "decided": ("approved", "rejected"),
    "all": ("pending", "claimed", "approved", "rejected"),
}
MAX_AGE_H = 1_000_000.0
"""The largest age filter, in hours (about 114 years): older than any review item."""
_MAX_OFFSET = 2**63 - 1  # OFFSET is a signed 64-bit integer in SQLite and PostgreSQL
NO_RULE = "(none)"
"""The rule filter value that selects records decided by no rule (``rule`` is None)."""


@dataclass(frozen=True)
class QueueFilter:
    """What the queue page shows. ``min_age_h``/``max_age_h``: age of the review item in hours."""

    view: QueueView = "pending"
    rule: str | None = None
    model: str | None = None
    min_age_h: float | None = None
    max_age_h: float | None = None
    page: int = 1
    per_page: int = 50

    def __post_init__(self) -> None:
        if self.view not in _VIEW_STATUSES:
            msg = f"view must be one of {sorted(_VIEW_STATUSES)}, got {self.view!r}"
            raise ConfigurationError(msg)
        for name in ("min_age_h", "max_age_h"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_AGE_H):
                msg = f"{name} must be a number of hours from 0 to {MAX_AGE_H:.0f} (about 114 years), got {v!r}"
                raise ConfigurationError(msg)
        if not isinstance(self.per_page, int) or not 1 <= self.per_page <= 500:
            msg = f"per_page must be an integer from 1 to 500, got {self.per_page!r}"
            raise ConfigurationError(msg)
        last = _MAX_OFFSET // self.per_page + 1
        if not isinstance(self.page, int) or not 1 <= self.page <= last:
            msg = f"page must be an integer from 1 to {last}, got {self.page!r}; the queue starts at page=1"
            raise ConfigurationError(msg)


@dataclass(frozen=True)
class QueueRow:
    """One line of the queue: a review item and the summary of its record."""

    id: int
    status: str
    created_at: datetime
    claimed_by: str | None
    reviewer: str | None
    decided_at: datetime | None
    question: str
    model: str
    rule: str | None
    action: str
    reliability: float | None


@dataclass(frozen=True)
class QueuePage:
    """One page of the queue, the totals by status (under the same filters) and the filter choices."""

    rows: list[QueueRow]
    total: int
    counts: dict[str, int]
    rules: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    """Rows of this page that could not be read and are left off it."""

    def pages(self, per_page: int) -> int:
        """Number of pages (at least 1)."""
        return max(1, -(-self.total // per_page))


_QUESTION_CHARS = 200


def _queue_row(m: sa.RowMapping) -> QueueRow:
    """One queue line, every column checked (a row edited by hand may hold anything)."""
    status, item_id = _status(m), m["r_id"]
    if type(item_id) is not int:
        raise _BadColumn("id", item_id, "not a whole number")
    created_at = _time(m, "r_created_at", "created_at")
    claimed_by = _text(m, "r_claimed_by", "claimed_by", optional=True)
    reviewer = _text(m, "r_reviewer", "reviewer", optional=True)
    decided_at = _time(m, "r_decided_at", "decided_at", optional=True)
    with record_columns(m):
        reliability = _reliability(m, "a_reliability")
        question = _text(m, "a_question", "prompt")
        model = _text(m, "a_model", "model")
        rule = _text(m, "a_rule", "rule", optional=True)
        action = _text(m, "a_action", "action")
    return QueueRow(
        id=item_id,
        status=status,
        created_at=created_at,  # type: ignore[arg-type]
        claimed_by=claimed_by,
        reviewer=reviewer,
        decided_at=decided_at,
        question=question,  # type: ignore[arg-type]
        model=model,  # type: ignore[arg-type]
        rule=rule,
        action=action,  # type: ignore[arg-type]
        reliability=reliability,
    )


def list_queue(store: AuditStore, flt: QueueFilter) -> QueuePage:
    """One page of the review queue of ``store`` under ``flt`` (one read transaction)."""
    join = _reviews.outerjoin(_records, _reviews.c.trace_id == _records.c.trace_id)  # an item without its record is reported
    where: list[sa.ColumnElement[bool]] = []
    if flt.rule is not None:
        where.append(_records.c.rule.is_(None) if flt.rule == NO_RULE else _records.c.rule == flt.rule)
    if flt.model is not None:
        where.append(_records.c.model == flt.model)
    now = _utcnow()
    if flt.min_age_h is not None:
        where.append(_reviews.c.created_at <= now - timedelta(hours=flt.min_age_h))
    if flt.max_age_h is not None:
        where.append(at_or_after(_reviews.c.created_at, now - timedelta(hours=flt.max_age_h), store._sqlite))
    statuses = _VIEW_STATUSES[flt.view]
    order: tuple[sa.ColumnElement[object], ...] = (_reviews.c.created_at, _reviews.c.id)
    if flt.view == "decided":
        order = (_reviews.c.decided_at.desc(), _reviews.c.id.desc())
    rows_stmt = (
        item_select(
            ("id", "trace_id", "status", "created_at", "claimed_by", "reviewer", "decided_at"),
            ("model", "rule", "action", "reliability"),
            sa.func.substr(_records.c.prompt, 1, _QUESTION_CHARS + 1).label("a_question"),
        )
        .where(_reviews.c.status.in_(statuses), *where)
        .order_by(*order)
        .limit(flt.per_page)
        .offset((flt.page - 1) * flt.per_page)
    )
    counts_stmt = sa.select(_reviews.c.status, sa.func.count()).select_from(join).where(*where).group_by(_reviews.c.status)
    rules_stmt = sa.select(_records.c.rule).select_from(join).distinct().order_by(_records.c.rule)
    models_stmt = sa.select(_records.c.model).select_from(join).distinct().order_by(_records.c.model)
    skipped: list[SkippedRow] = []
    with store._transaction("read", write=False) as conn:
        rows = list(read_rows(conn.execute(rows_stmt).mappings(), _queue_row, _item_row, skipped))
        by_status = {status: int(n) for status, n in conn.execute(counts_stmt)}
        # the filter choices: only text (a value edited into the store by hand is not a choice)
        rules = [NO_RULE if r is None else r for (r,) in conn.execute(rules_stmt) if r is None or type(r) is str]
        models = [m for (m,) in conn.execute(models_stmt) if type(m) is str]
    counts = {
        "pending": by_status.get("pending", 0),
        "claimed": by_status.get("claimed", 0),
        "decided": by_status.get("approved", 0) + by_status.get("rejected", 0),
    }
    counts["all"] = sum(counts.values())
    return QueuePage(rows=rows, total=counts[flt.view], counts=counts, rules=rules, models=models, skipped=skipped)
