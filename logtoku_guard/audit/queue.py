"""The review queue of the audit store: enqueue, pending, claim, release, approve, reject.

:class:`ReviewQueue` is the half of :class:`~logtoku_guard.audit.store.AuditStore` that moves
:class:`~logtoku_guard.audit.records.ReviewItem` through its life cycle. Every transition is one
conditional ``UPDATE ... WHERE status IN (...)`` whose row count is checked, so two reviewers
racing on the same item cannot both decide it. A claim holds until released, decided, or (with
``claim_ttl``) expired; an expired claim behaves as pending for everyone else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection

from logtoku_guard.audit.records import (
    _DECIDED,
    _OPEN,
    MAX_REVIEW_ID,
    AuditRecord,
    ReviewItem,
    ReviewStatus,
    SkippedRow,
    StoredRows,
    _check_text,
    _check_verdict_text,
    _utcnow,
    utc_since,
)
from logtoku_guard.audit.schema import (
    _check_batch_size,
    _int,
    _item_row,
    _item_select,
    _numbers,
    _records,
    _reviews,
    _row_to_item,
    _status,
    _text,
    _time,
    _UTCDateTime,
    at_or_after,
    item_select,
    read_one,
    read_rows,
    record_columns,
)
from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    ReviewStateError,
    UnknownReviewItemError,
    UnknownTraceError,
)

__all__ = ["ReviewHints", "ReviewQueue", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """What a refit reads of one decided review item (:meth:`ReviewQueue.verdicts`): no texts, no tokens.

    ``correct``: approved as written (an approval with an edited answer, or a rejection, says the
    answer was wrong); ``stats``: the statistics the policy saw, as the record kept them."""

    review_id: int
    trace_id: str
    model: str
    correct: bool
    decided_at: datetime
    stats: dict[str, float | None]


def _verdict(m: Any) -> Verdict:
    status = _status(m, _DECIDED, "not a verdict (approved or rejected)")
    decided_at = _time(m, "r_decided_at", "decided_at")
    edited = _text(m, "r_edited_answer", "edited_answer", optional=True)
    with record_columns(m):
        model = _text(m, "a_model", "model")
        stats = _numbers(m, "a_stats", "stats")
    return Verdict(
        review_id=_int(m, "r_id", "id"),  # type: ignore[arg-type]
        trace_id=_text(m, "r_trace_id", "trace_id"),  # type: ignore[arg-type]
        model=model,  # type: ignore[arg-type]
        correct=status == "approved" and edited is None,
        decided_at=decided_at,  # type: ignore[arg-type]
        stats=stats,
    )


_VERDICT_SELECT = item_select(("id", "trace_id", "status", "decided_at", "edited_answer"), ("model", "stats"))


@dataclass(frozen=True)
class ReviewHints:
    """How the queue's error messages name the fix; ``{id}`` stands for the item id.

    The default speaks the Python API (``review_item(7)``); a front end that shows these
    errors to its own users (the ``logtoku-guard review`` commands) sets
    :attr:`ReviewQueue.review_hints` on the store it opened to its own wording.
    """

    show: str = "read it with review_item({id})"
    list_open: str = "list open items with pending()"
    take_another: str = "take another item from pending()"
    force: str = "pass force=True"


def _check_os_user(os_user: str | None) -> str | None:
    return None if os_user is None else _check_text(os_user, "os_user", empty_ok=False)


class ReviewQueue:
    """The review-queue methods of :class:`~logtoku_guard.audit.store.AuditStore` (not used alone)."""

    _where: str
    _sqlite: bool
    claim_ttl: timedelta | None
    review_hints: ReviewHints = ReviewHints()
    """How review errors name the fix (see :class:`ReviewHints`)."""

    if TYPE_CHECKING:

        def _transaction(self, action: str, *, write: bool) -> AbstractContextManager[Connection]: ...

        def _insert_record(self, conn: Connection, rec: AuditRecord) -> None: ...

        def _redacted(self, rec: AuditRecord) -> AuditRecord: ...

    def _check_id(self, item_id: Any) -> int:
        if isinstance(item_id, bool) or not isinstance(item_id, int):
            msg = f"a review item id must be an integer, got {item_id!r}; ids come from ReviewItem.id"
            raise ConfigurationError(msg)
        if not 1 <= item_id <= MAX_REVIEW_ID:
            # No item can have it (the id column is 32 bits): checked before any query, since PostgreSQL refuses an
            # integer out of its column's range with an error that is not a missing item, never "unreachable".
            msg = (
                f"no review item with id {item_id} in the audit store at {self._where}: ids are whole numbers from 1 "
                f"to {MAX_REVIEW_ID}; {self.review_hints.list_open}"
            )
            raise UnknownReviewItemError(msg)
        return item_id

    def _enqueue(self, conn: Connection, trace_id: str) -> int:
        review_id = conn.execute(sa.select(_records.c.review_id).where(_records.c.trace_id == trace_id)).one_or_none()
        if review_id is None:
            msg = f"no audit record with trace id {trace_id!r} in {self._where}; record it first (AuditStore.record)"
            raise UnknownTraceError(msg)
        if review_id[0] is not None:
            item = self._load_item(conn, review_id[0])
            msg = (
                f"trace {trace_id} is already queued for review as item {item.id} (status {item.status}); "
                f"{self.review_hints.show.format(id=item.id)}"
            )
            raise ReviewStateError(msg)
        try:
            result = conn.execute(sa.insert(_reviews).values(trace_id=trace_id, status="pending", created_at=_utcnow()))
        except exc.IntegrityError as e:
            msg = f"trace {trace_id} was queued for review by someone else at the same moment; {self.review_hints.list_open}"
            raise ReviewStateError(msg) from e
        (item_id,) = result.inserted_primary_key or (None,)
        if not isinstance(item_id, int):
            msg = f"the database returned no id for the new review item of trace {trace_id} (got {item_id!r})"
            raise AuditStoreError(msg)
        conn.execute(sa.update(_records).where(_records.c.trace_id == trace_id).values(review_id=item_id))
        return item_id

    def _load_item(self, conn: Connection, item_id: int) -> ReviewItem:
        row = conn.execute(_item_select.where(_reviews.c.id == item_id)).mappings().one_or_none()
        if row is None:
            msg = f"no review item with id {item_id} in the audit store at {self._where}; {self.review_hints.list_open}"
            raise UnknownReviewItemError(msg)
        return read_one(row, _row_to_item, _item_row)

    # -- review queue

    def enqueue(self, trace_id: str) -> ReviewItem:
        """Queue a recorded answer for human review (status ``pending``)."""
        with self._transaction("queue a review in", write=True) as conn:
            return self._load_item(conn, self._enqueue(conn, trace_id))

    def record_for_review(self, rec: AuditRecord) -> ReviewItem:
        """Save ``rec`` and queue it for review in one transaction.

        The stored record (``item.record``) carries the new ``review_id``; ``rec`` itself is
        frozen and left as it was (the stored one is redacted, see ``redact``).
        """
        rec = self._redacted(rec)
        with self._transaction("write a record to", write=True) as conn:
            self._insert_record(conn, rec)
            return self._load_item(conn, self._enqueue(conn, rec.trace_id))

    def pending(self, *, include_claimed: bool = False, limit: int | None = None) -> StoredRows[ReviewItem]:
        """Undecided items, oldest first: ``pending`` ones, plus ``claimed`` ones if ``include_claimed``.
        An item whose row cannot be read is left out and listed in the result's ``skipped``."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            msg = f"limit must be a non-negative integer or None, got {limit!r}"
            raise ConfigurationError(msg)
        statuses = _OPEN if include_claimed else ("pending",)
        stmt = _item_select.where(_reviews.c.status.in_(statuses)).order_by(_reviews.c.created_at, _reviews.c.id).limit(limit)
        return self._items(stmt)

    def _items(self, stmt: sa.Select[Any]) -> StoredRows[ReviewItem]:
        skipped: list[SkippedRow] = []
        with self._transaction("read", write=False) as conn:
            items = list(read_rows(conn.execute(stmt).mappings(), _row_to_item, _item_row, skipped))
        return StoredRows(items, skipped)

    def decided(self, *, since: datetime | None = None) -> StoredRows[ReviewItem]:
        """Decided items (approved or rejected), oldest decision first; ``since``: decided at or after it (UTC).
        Every item is read whole (tokens included): a refit streams :meth:`verdicts` instead."""
        since = utc_since(since)
        stmt = _item_select.where(_reviews.c.status.in_(_DECIDED))
        if since is not None:
            stmt = stmt.where(at_or_after(_reviews.c.decided_at, since, self._sqlite))
        return self._items(stmt.order_by(_reviews.c.decided_at, _reviews.c.id))

    def count_decided(self, *, since: datetime | None = None) -> int:
        """How many items are decided (at or after ``since``), counted in SQL."""
        since = utc_since(since)
        stmt = sa.select(sa.func.count()).select_from(_reviews).where(_reviews.c.status.in_(_DECIDED))
        if since is not None:
            stmt = stmt.where(at_or_after(_reviews.c.decided_at, since, self._sqlite))
        with self._transaction("read", write=False) as conn:
            return int(conn.execute(stmt).scalar_one())

    def verdicts(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        skipped: list[SkippedRow] | None = None,
        batch_size: int = 1000,
    ) -> Iterator[Verdict]:
        """The verdicts of decided items (of answers by ``model``, decided at or after ``since``),
        oldest first, streamed: rows are fetched ``batch_size`` at a time and only the columns a
        refit reads (status, edit, time, model, statistics), so memory stays flat however large the
        store. A row that cannot be read is logged, appended to ``skipped`` and left out. The read
        transaction stays open until the iterator is exhausted or closed."""
        since = utc_since(since)
        _check_batch_size(batch_size)
        stmt = _VERDICT_SELECT.where(_reviews.c.status.in_(_DECIDED))
        if model is not None:
            stmt = stmt.where(_records.c.model == model)
        if since is not None:
            stmt = stmt.where(at_or_after(_reviews.c.decided_at, since, self._sqlite))
        stmt = stmt.order_by(_reviews.c.decided_at, _reviews.c.id).execution_options(yield_per=batch_size)
        return self._stream(stmt, skipped if skipped is not None else [])

    def _stream(self, stmt: sa.Select[Any], skipped: list[SkippedRow]) -> Iterator[Verdict]:
        with self._transaction("read", write=False) as conn:
            yield from read_rows(conn.execute(stmt).mappings(), _verdict, _item_row, skipped)

    def review_item(self, item_id: int) -> ReviewItem:
        """The review item with this id; :class:`UnknownReviewItemError` if none."""
        with self._transaction("read", write=False) as conn:
            return self._load_item(conn, self._check_id(item_id))

    def _takeable(self, reviewer: str | None, now: datetime) -> sa.ColumnElement[bool]:
        """SQL: an open item ``reviewer`` may take: unclaimed, claimed by them, or an expired claim."""
        free: list[sa.ColumnElement[bool]] = [_reviews.c.claimed_by.is_(None)]
        if reviewer is not None:
            free.append(_reviews.c.claimed_by == reviewer)
        if self.claim_ttl is not None:
            free.append(_reviews.c.claimed_at < sa.literal(now - self.claim_ttl, _UTCDateTime()))
        return sa.and_(_reviews.c.status.in_(_OPEN), sa.or_(*free))

    def claim(self, item_id: int, reviewer: str, *, os_user: str | None = None) -> ReviewItem:
        """Take a pending item (or one whose claim expired) so that only ``reviewer`` decides it.

        Claiming an item one already holds returns it unchanged; an item claimed by someone else
        (and not expired, see ``claim_ttl``) or already decided raises :class:`ReviewStateError`.
        ``os_user``: the operating-system account making the claim, stored beside the name.
        """
        item_id = self._check_id(item_id)
        reviewer = _check_verdict_text(reviewer, "reviewer", empty_ok=False)
        os_user = _check_os_user(os_user)
        now = _utcnow()
        with self._transaction("claim a review in", write=True) as conn:
            changed = conn.execute(
                sa.update(_reviews)
                .where(_reviews.c.id == item_id, self._takeable(None, now))
                .values(status="claimed", claimed_by=reviewer, claimed_at=now, claimed_os_user=os_user)
            ).rowcount
            item = self._load_item(conn, item_id)
        if changed == 1 or (item.status == "claimed" and item.claimed_by == reviewer):
            return item
        raise ReviewStateError(self._refusal(item, "claim", reviewer))

    def release(self, item_id: int, reviewer: str, *, force: bool = False) -> ReviewItem:
        """Give a claimed item back to the queue (status ``pending``, no claimer).

        Only its claimer may release it, or anyone with ``force`` (e.g. for a reviewer who left).
        An item that is not claimed raises :class:`ReviewStateError`.
        """
        item_id = self._check_id(item_id)
        reviewer = _check_verdict_text(reviewer, "reviewer", empty_ok=False)
        mine = sa.true() if force else _reviews.c.claimed_by == reviewer
        with self._transaction("release a review in", write=True) as conn:
            changed = conn.execute(
                sa.update(_reviews)
                .where(_reviews.c.id == item_id, _reviews.c.status == "claimed", mine)
                .values(status="pending", claimed_by=None, claimed_at=None, claimed_os_user=None)
            ).rowcount
            item = self._load_item(conn, item_id)
        if changed == 1:
            return item
        if item.status != "claimed":
            msg = f"cannot release review item {item.id}: it is not claimed (status {item.status!r})"
            raise ReviewStateError(msg)
        msg = (
            f"cannot release review item {item.id} as {reviewer!r}: it is claimed by {item.claimed_by!r}; "
            f"only they may release it, or {self.review_hints.force}"
        )
        raise ReviewStateError(msg)

    def approve(
        self,
        item_id: int,
        reviewer: str,
        edited_answer: str | None = None,
        note: str | None = None,
        *,
        os_user: str | None = None,
    ) -> ReviewItem:
        """Approve an item, optionally replacing its answer by ``edited_answer``.

        Allowed on a pending item (an implicit claim), on one claimed by ``reviewer``, or on one
        whose claim expired. ``os_user``: the operating-system account, stored beside the name.
        """
        if edited_answer is not None:
            _check_verdict_text(edited_answer, "edited_answer", empty_ok=False)
        if note is not None:
            _check_verdict_text(note, "note")
        return self._decide(item_id, reviewer, "approved", edited_answer, note, os_user)

    def reject(self, item_id: int, reviewer: str, note: str, *, os_user: str | None = None) -> ReviewItem:
        """Reject an item; ``note`` (why) is required. Same claim rules as :meth:`approve`."""
        note = _check_verdict_text(note, "a rejection note (say why the answer is rejected)", empty_ok=False)
        return self._decide(item_id, reviewer, "rejected", None, note, os_user)

    def _decide(
        self,
        item_id: int,
        reviewer: str,
        status: ReviewStatus,
        edited_answer: str | None,
        note: str | None,
        os_user: str | None,
    ) -> ReviewItem:
        item_id = self._check_id(item_id)
        reviewer = _check_verdict_text(reviewer, "reviewer", empty_ok=False)
        os_user = _check_os_user(os_user)
        now = _utcnow()
        verb = "approve" if status == "approved" else "reject"
        own_claim = _reviews.c.claimed_by == reviewer
        with self._transaction(f"{verb} a review in", write=True) as conn:
            changed = conn.execute(
                sa.update(_reviews)
                .where(_reviews.c.id == item_id, self._takeable(reviewer, now))
                .values(
                    status=status,
                    reviewer=reviewer,
                    decided_at=now,
                    edited_answer=edited_answer,
                    note=note,
                    reviewer_os_user=os_user,
                    # the decider holds the claim: kept if it was theirs, else taken now
                    claimed_by=reviewer,
                    claimed_at=sa.case((own_claim, _reviews.c.claimed_at), else_=sa.literal(now, _UTCDateTime())),
                    claimed_os_user=sa.case((own_claim, _reviews.c.claimed_os_user), else_=sa.literal(os_user, sa.Text)),
                )
            ).rowcount
            item = self._load_item(conn, item_id)
        if changed != 1:
            raise ReviewStateError(self._refusal(item, verb, reviewer))
        return item

    def wait_for_decision(self, review_id: int, *, timeout: float | None, poll_interval: float = 0.5) -> ReviewItem:
        """Block until the item is approved or rejected; see :func:`logtoku_guard.audit.waiting.wait_for_decision`."""
        from logtoku_guard.audit.waiting import wait_for_decision

        return wait_for_decision(self, review_id, timeout=timeout, poll_interval=poll_interval)

    def _refusal(self, item: ReviewItem, verb: str, reviewer: str) -> str:
        if item.decided:
            when = item.decided_at.isoformat() if item.decided_at else "?"
            return (
                f"cannot {verb} review item {item.id}: its status is {item.status!r} (by {item.reviewer!r} at {when}) "
                f"and a verdict is final; {self.review_hints.show.format(id=item.id)}"
            )
        when = item.claimed_at.isoformat() if item.claimed_at else "?"
        until = ""
        if self.claim_ttl is not None and item.claimed_at is not None:
            try:
                until = f" until {(item.claimed_at + self.claim_ttl).isoformat()}"
            except OverflowError:  # a claim time edited to the last years Python can hold
                until = " until after 9999-12-31"
        return (
            f"cannot {verb} review item {item.id} as {reviewer!r}: its status is {item.status!r} by {item.claimed_by!r} "
            f"(since {when}) and only they may decide it{until}; {self.review_hints.take_another}, "
            "or ask them to release it"
        )
