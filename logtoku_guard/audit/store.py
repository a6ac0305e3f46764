"""The audit store: guard decisions and the human-review queue, in one database (SQLAlchemy).

Stores the :class:`~logtoku_guard.audit.records.AuditRecord` of every guarded answer and the
:class:`~logtoku_guard.audit.records.ReviewItem` of answers sent to a human. A verdict is final:
every review transition is one conditional ``UPDATE ... WHERE status IN (...)`` whose row count
is checked, so two reviewers racing on the same item cannot both decide it.

The schema is SQLAlchemy Core, so the same code runs on a local SQLite file (the default) or on
a server through a database URL (``postgresql+psycopg://user@host/db``; the driver is the
deployment's own dependency). Times are timezone-aware UTC in Python and stored as naive UTC.

SQLite settings, on every connection: ``journal_mode=WAL`` (readers never block the writer),
``busy_timeout`` (a writer waits for the lock instead of failing, 30 s by default),
``synchronous=NORMAL`` (a committed record survives the death of the process; a power cut may
lose the last commits but never corrupts the file) and ``foreign_keys=ON``. Write transactions
start with ``BEGIN IMMEDIATE``, so concurrent writers (threads or processes) queue on the lock.
"""

from __future__ import annotations

import csv
import math
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection, Engine

from logtoku_guard.audit.records import _OPEN, AuditRecord, ReviewItem, ReviewStatus, _check_text, _utcnow
from logtoku_guard.audit.schema import (
    _RECORD_FIELDS,
    _WRITE_OPTION,
    SCHEMA_VERSION,
    _configure_sqlite,
    _item_select,
    _json_dumps,
    _meta,
    _metadata,
    _record_insert,
    _record_select,
    _records,
    _reviews,
    _row_to_item,
    _row_to_record,
    _UTCDateTime,
)
from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    MissingDependencyError,
    ReviewStateError,
    UnknownReviewItemError,
    UnknownTraceError,
)

__all__ = ["SCHEMA_VERSION", "AuditStore", "ExportFormat"]

ExportFormat = Literal["jsonl", "csv"]


def _check_id(item_id: Any) -> int:
    if isinstance(item_id, bool) or not isinstance(item_id, int):
        msg = f"a review item id must be an integer, got {item_id!r}; ids come from ReviewItem.id"
        raise ConfigurationError(msg)
    return item_id


# ----------------------------------------------------------------------------- store


class AuditStore:
    """The audit records of a guard and its human-review queue, in one database.

    ``url_or_path``: a file path (made absolute, used as SQLite; its folder must exist) or a
    SQLAlchemy database URL (any string containing ``"://"``). ``busy_timeout_s``: SQLite
    only, how long a writer waits for another writer's lock before failing, in seconds.

    Opening the store connects, creates the tables if missing and makes one small write, so an
    unusable location fails here with :class:`AuditStoreError`, not at the first record.
    Safe to share between threads; any number of processes may open the same file.
    """

    def __init__(self, url_or_path: str | os.PathLike[str] = "logtoku_audit.db", *, busy_timeout_s: float = 30.0) -> None:
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, (int, float)) or not 0 <= busy_timeout_s < math.inf:
            msg = f"busy_timeout_s must be a non-negative number of seconds, got {busy_timeout_s!r}"
            raise ConfigurationError(msg)
        raw = os.fspath(url_or_path) if isinstance(url_or_path, (str, os.PathLike)) else None
        if not isinstance(raw, str) or not raw.strip():
            msg = f"the audit store needs a file path or a database URL, got {url_or_path!r}; e.g. AuditStore('audit.db')"
            raise ConfigurationError(msg)
        url: sa.URL
        if "://" in raw:
            try:
                url = sa.make_url(raw)
            except exc.ArgumentError as e:
                msg = f"{raw!r} is not a database URL ({e}); pass e.g. 'sqlite:////var/lib/app/audit.db' or a plain file path"
                raise ConfigurationError(msg) from e
            self._where = url.render_as_string(hide_password=True)
        else:
            path = Path(raw).expanduser().absolute()
            url = sa.URL.create("sqlite", database=str(path))
            self._where = str(path)
        self.url: str = url.render_as_string(hide_password=True)
        """The database URL, password hidden."""
        self._sqlite = url.get_backend_name() == "sqlite"
        if self._sqlite and url.database in (None, "", ":memory:"):
            msg = (
                f"an in-memory SQLite database ({self.url}) is private to one connection and lost on exit; "
                "pass a file path (a temporary file in tests)"
            )
            raise ConfigurationError(msg)
        self._closed = False
        # SQLite has one writer at a time: this process's threads queue here, in order and without
        # the sleep-and-retry of busy_timeout (which still arbitrates between processes).
        self._write_lock = threading.Lock()
        try:
            self._engine: Engine = sa.create_engine(url, json_serializer=_json_dumps)
        except ImportError as e:
            msg = (
                f"the database driver for {self.url} is not installed ({e}); install it, "
                "e.g. pip install 'psycopg[binary]' for postgresql+psycopg:// URLs"
            )
            raise MissingDependencyError(msg) from e
        except exc.ArgumentError as e:
            msg = f"cannot use the database URL {self.url}: {e}"
            raise ConfigurationError(msg) from e
        if self._sqlite:
            _configure_sqlite(self._engine, busy_timeout_ms=round(busy_timeout_s * 1000))
        try:
            with self._transaction("create the tables of", write=True) as conn:
                _metadata.create_all(conn)
                version = conn.execute(sa.select(_meta.c.value).where(_meta.c.key == "schema_version")).scalar_one_or_none()
                if version is None:
                    conn.execute(sa.insert(_meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
                elif version != str(SCHEMA_VERSION):
                    msg = (
                        f"the audit store at {self._where} has schema version {version}, this logtoku_guard "
                        f"writes version {SCHEMA_VERSION}; use a new path, or the logtoku_guard version that made it"
                    )
                    raise AuditStoreError(msg)
                else:  # the write probe: a read-only store fails now rather than at the first record
                    conn.execute(sa.update(_meta).where(_meta.c.key == "schema_version").values(value=version))
        except BaseException:
            self._engine.dispose()
            raise

    # -- plumbing

    def __repr__(self) -> str:
        return f"AuditStore({self._where!r})"

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for ad-hoc queries and dashboards (tables ``audit_records``, ``review_items``)."""
        return self._engine

    def close(self) -> None:
        """Close every pooled connection; the store cannot be used afterwards."""
        self._closed = True
        self._engine.dispose()

    def _fix(self, error: BaseException) -> str:
        text = str(error).lower()
        if "locked" in text or "busy" in text:
            return "another writer held the lock longer than busy_timeout_s; raise busy_timeout_s or shorten other transactions"
        if self._sqlite:
            return (
                "check that the folder exists and this user can write to it (and to the file), and that the disk has "
                "space; or pass another path, e.g. AuditStore('/writable/folder/audit.db'), or a database URL"
            )
        return "check that the database server is reachable, the URL and credentials are right and the user may create tables"

    @contextmanager
    def _transaction(self, action: str, *, write: bool) -> Iterator[Connection]:
        """One transaction, committed on success; database failures become AuditStoreError."""
        if self._closed:
            msg = f"the audit store at {self._where} is closed; open a new AuditStore"
            raise AuditStoreError(msg)
        lock: AbstractContextManager[Any] = self._write_lock if write and self._sqlite else nullcontext()
        try:
            with lock, self._engine.connect() as conn:
                if write:
                    conn.execution_options(**{_WRITE_OPTION: True})
                with conn.begin():
                    yield conn
        except exc.IntegrityError:
            raise  # a constraint: the callers turn it into the error that explains it
        except exc.DBAPIError as e:
            cause = e.orig if e.orig is not None else e
            msg = f"could not {action} the audit store at {self._where}: {cause}; {self._fix(cause)}"
            raise AuditStoreError(msg) from e

    def _insert_record(self, conn: Connection, rec: AuditRecord) -> None:
        if not isinstance(rec, AuditRecord):
            msg = f"expected an AuditRecord, got {type(rec).__name__}: {rec!r:.200}"
            raise ConfigurationError(msg)
        if rec.review_id is not None:
            msg = (
                f"record {rec.trace_id} already has review_id={rec.review_id}; the store sets it, "
                "so build the record with review_id=None and use record_for_review() to queue it"
            )
            raise ConfigurationError(msg)
        try:
            conn.execute(_record_insert, {name: getattr(rec, name) for name in _RECORD_FIELDS})
        except exc.IntegrityError as e:
            msg = (
                f"trace id {rec.trace_id!r} is already in the audit store at {self._where}; "
                "every AuditRecord needs its own trace_id (leave it to its default, a fresh uuid4)"
            )
            raise AuditStoreError(msg) from e

    def _enqueue(self, conn: Connection, trace_id: str) -> int:
        review_id = conn.execute(sa.select(_records.c.review_id).where(_records.c.trace_id == trace_id)).one_or_none()
        if review_id is None:
            msg = f"no audit record with trace id {trace_id!r} in {self._where}; record it first (AuditStore.record)"
            raise UnknownTraceError(msg)
        if review_id[0] is not None:
            item = self._load_item(conn, review_id[0])
            msg = (
                f"trace {trace_id} is already queued for review as item {item.id} (status {item.status}); "
                f"read it with review_item({item.id})"
            )
            raise ReviewStateError(msg)
        try:
            result = conn.execute(sa.insert(_reviews).values(trace_id=trace_id, status="pending", created_at=_utcnow()))
        except exc.IntegrityError as e:
            msg = f"trace {trace_id} was queued for review by someone else at the same moment; see pending()"
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
            msg = f"no review item with id {item_id} in the audit store at {self._where}; list open items with pending()"
            raise UnknownReviewItemError(msg)
        return _row_to_item(row)

    # -- records

    def record(self, rec: AuditRecord) -> str:
        """Save one record (one transaction) and return its trace id."""
        with self._transaction("write a record to", write=True) as conn:
            self._insert_record(conn, rec)
        return rec.trace_id

    def get(self, trace_id: str) -> AuditRecord:
        """The record with this trace id; :class:`UnknownTraceError` (an AuditStoreError) if none."""
        with self._transaction("read", write=False) as conn:
            row = conn.execute(_record_select.where(_records.c.trace_id == trace_id)).mappings().one_or_none()
        if row is None:
            msg = f"no audit record with trace id {trace_id!r} in {self._where}; list recent ones with tail()"
            raise UnknownTraceError(msg)
        return _row_to_record(row)

    def tail(self, n: int = 20) -> list[AuditRecord]:
        """The ``n`` newest records (by ``created_at``), newest first."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            msg = f"n must be a non-negative integer, got {n!r}"
            raise ConfigurationError(msg)
        stmt = _record_select.order_by(_records.c.created_at.desc(), _records.c.id.desc()).limit(n)
        with self._transaction("read", write=False) as conn:
            return [_row_to_record(m) for m in conn.execute(stmt).mappings()]

    def count(self) -> int:
        """Number of records in the store."""
        with self._transaction("read", write=False) as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_records)).scalar_one())

    def purge_older_than(self, days: float) -> int:
        """Delete the records created more than ``days`` days ago, and their review items (retention).

        Returns the number of records deleted.
        """
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not (0 <= days < math.inf):
            msg = f"days must be a non-negative number, got {days!r}; e.g. purge_older_than(90)"
            raise ConfigurationError(msg)
        old = _records.c.created_at < _utcnow() - timedelta(days=days)
        with self._transaction("purge", write=True) as conn:
            conn.execute(sa.delete(_reviews).where(_reviews.c.trace_id.in_(sa.select(_records.c.trace_id).where(old))))
            return int(conn.execute(sa.delete(_records).where(old)).rowcount)

    def export(self, path: str | os.PathLike[str], fmt: ExportFormat = "jsonl") -> int:
        """Write every record, oldest first, to ``path``; returns the number of rows written.

        ``jsonl``: one :meth:`AuditRecord.to_dict` object a line. ``csv``: a header row, then one
        row a record; ``tokens``, ``stats`` and ``timings`` as JSON strings, None as an empty cell.
        """
        if fmt not in ("jsonl", "csv"):
            msg = f"export format must be 'jsonl' or 'csv', got {fmt!r}"
            raise ConfigurationError(msg)
        stmt = _record_select.order_by(_records.c.created_at, _records.c.id).execution_options(yield_per=1000)
        n = 0
        with self._transaction("export", write=False) as conn, Path(path).open("w", encoding="utf-8", newline="") as f:
            rows = (_row_to_record(m).to_dict() for m in conn.execute(stmt).mappings())
            if fmt == "jsonl":
                for d in rows:
                    f.write(_json_dumps(d) + "\n")
                    n += 1
            else:
                writer = csv.DictWriter(f, fieldnames=_RECORD_FIELDS)
                writer.writeheader()
                for d in rows:
                    for name in ("tokens", "stats", "timings"):
                        d[name] = _json_dumps(d[name])
                    writer.writerow(d)
                    n += 1
        return n

    # -- review queue

    def enqueue(self, trace_id: str) -> ReviewItem:
        """Queue a recorded answer for human review (status ``pending``)."""
        with self._transaction("queue a review in", write=True) as conn:
            return self._load_item(conn, self._enqueue(conn, trace_id))

    def record_for_review(self, rec: AuditRecord) -> ReviewItem:
        """Save ``rec`` and queue it for review in one transaction.

        The stored record (``item.record``) carries the new ``review_id``; ``rec`` itself is
        frozen and left as it was.
        """
        with self._transaction("write a record to", write=True) as conn:
            self._insert_record(conn, rec)
            return self._load_item(conn, self._enqueue(conn, rec.trace_id))

    def pending(self, *, include_claimed: bool = False, limit: int | None = None) -> list[ReviewItem]:
        """Undecided items, oldest first: ``pending`` ones, plus ``claimed`` ones if ``include_claimed``."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            msg = f"limit must be a non-negative integer or None, got {limit!r}"
            raise ConfigurationError(msg)
        statuses = _OPEN if include_claimed else ("pending",)
        stmt = _item_select.where(_reviews.c.status.in_(statuses)).order_by(_reviews.c.created_at, _reviews.c.id).limit(limit)
        with self._transaction("read", write=False) as conn:
            return [_row_to_item(m) for m in conn.execute(stmt).mappings()]

    def review_item(self, item_id: int) -> ReviewItem:
        """The review item with this id; :class:`UnknownReviewItemError` if none."""
        with self._transaction("read", write=False) as conn:
            return self._load_item(conn, _check_id(item_id))

    def claim(self, item_id: int, reviewer: str) -> ReviewItem:
        """Take a pending item so that only ``reviewer`` decides it.

        Claiming an item one already holds returns it unchanged; an item claimed by someone else
        or already decided raises :class:`ReviewStateError`.
        """
        item_id = _check_id(item_id)
        reviewer = _check_text(reviewer, "reviewer", empty_ok=False)
        with self._transaction("claim a review in", write=True) as conn:
            changed = conn.execute(
                sa.update(_reviews)
                .where(_reviews.c.id == item_id, _reviews.c.status.in_(("pending",)))
                .values(status="claimed", claimed_by=reviewer, claimed_at=_utcnow())
            ).rowcount
            item = self._load_item(conn, item_id)
        if changed == 1 or (item.status == "claimed" and item.claimed_by == reviewer):
            return item
        raise ReviewStateError(_refusal(item, "claim", reviewer))

    def approve(self, item_id: int, reviewer: str, edited_answer: str | None = None, note: str | None = None) -> ReviewItem:
        """Approve an item, optionally replacing its answer by ``edited_answer``.

        Allowed on a pending item (an implicit claim) or on one claimed by ``reviewer``.
        """
        if edited_answer is not None:
            _check_text(edited_answer, "edited_answer", empty_ok=False)
        if note is not None:
            _check_text(note, "note")
        return self._decide(item_id, reviewer, "approved", edited_answer, note)

    def reject(self, item_id: int, reviewer: str, note: str) -> ReviewItem:
        """Reject an item; ``note`` (why) is required. Same claim rules as :meth:`approve`."""
        note = _check_text(note, "a rejection note (say why the answer is rejected)", empty_ok=False)
        return self._decide(item_id, reviewer, "rejected", None, note)

    def _decide(
        self, item_id: int, reviewer: str, status: ReviewStatus, edited_answer: str | None, note: str | None
    ) -> ReviewItem:
        item_id = _check_id(item_id)
        reviewer = _check_text(reviewer, "reviewer", empty_ok=False)
        now = _utcnow()
        verb = "approve" if status == "approved" else "reject"
        with self._transaction(f"{verb} a review in", write=True) as conn:
            changed = conn.execute(
                sa.update(_reviews)
                .where(
                    _reviews.c.id == item_id,
                    _reviews.c.status.in_(_OPEN),
                    sa.or_(_reviews.c.claimed_by.is_(None), _reviews.c.claimed_by == reviewer),
                )
                .values(
                    status=status,
                    reviewer=reviewer,
                    decided_at=now,
                    edited_answer=edited_answer,
                    note=note,
                    claimed_by=sa.func.coalesce(_reviews.c.claimed_by, reviewer),
                    claimed_at=sa.func.coalesce(_reviews.c.claimed_at, sa.literal(now, _UTCDateTime())),
                )
            ).rowcount
            item = self._load_item(conn, item_id)
        if changed != 1:
            raise ReviewStateError(_refusal(item, verb, reviewer))
        return item

    def wait_for_decision(self, review_id: int, *, timeout: float | None, poll_interval: float = 0.5) -> ReviewItem:
        """Block until the item is approved or rejected; see :func:`logtoku_guard.audit.waiting.wait_for_decision`."""
        from logtoku_guard.audit.waiting import wait_for_decision

        return wait_for_decision(self, review_id, timeout=timeout, poll_interval=poll_interval)


def _refusal(item: ReviewItem, verb: str, reviewer: str) -> str:
    if item.decided:
        when = item.decided_at.isoformat() if item.decided_at else "?"
        return (
            f"cannot {verb} review item {item.id}: its status is {item.status!r} (by {item.reviewer!r} at {when}) "
            f"and a verdict is final; read it with review_item({item.id})"
        )
    when = item.claimed_at.isoformat() if item.claimed_at else "?"
    return (
        f"cannot {verb} review item {item.id} as {reviewer!r}: its status is {item.status!r} by {item.claimed_by!r} "
        f"(since {when}) and only they may decide it; take another item from pending()"
    )
