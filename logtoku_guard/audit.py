"""The audit store of guard decisions and the human-review queue.

Data flow: prompt -> generation -> token AU/EU -> response score -> policy decision -> action
-> **audit** (this module). Every guarded answer becomes one :class:`AuditRecord` (what was
asked, what was answered, what the policy saw and decided); answers the policy sends to a human
also get a :class:`ReviewItem` in the review queue, whose life cycle is::

    pending --claim--> claimed --approve/reject--> approved | rejected
       └──────────────approve/reject (implicit claim)──────┘

A verdict is final. Every transition is one conditional ``UPDATE ... WHERE status IN (...)``
whose row count is checked, so two reviewers racing on the same item cannot both decide it.

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
import dataclasses
import json
import math
import numbers
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine

from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    MissingDependencyError,
    ReviewStateError,
    UnknownReviewItemError,
    UnknownTraceError,
)

__all__ = [
    "SCHEMA_VERSION",
    "AuditRecord",
    "AuditStore",
    "ExportFormat",
    "ReviewItem",
    "ReviewStatus",
]

ReviewStatus = Literal["pending", "claimed", "approved", "rejected"]
"""``pending``: waiting for a reviewer; ``claimed``: a reviewer took it; ``approved`` /
``rejected``: decided (final)."""

ExportFormat = Literal["jsonl", "csv"]

SCHEMA_VERSION = 1
"""Version of the tables below; a store written by another version is refused, not altered."""

_OPEN: tuple[ReviewStatus, ...] = ("pending", "claimed")
_DECIDED: tuple[ReviewStatus, ...] = ("approved", "rejected")
_WRITE_OPTION = "logtoku_write"  # execution option: this transaction writes (SQLite: BEGIN IMMEDIATE)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _NotJSONError(Exception):
    """Internal: a value JSON cannot hold; ``path`` is filled in while unwinding."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.path: list[str] = []


_PLAIN = (str, int, bool, type(None))


def _json_copy(value: Any) -> Any:
    # Hot path (every token dict of every record): exact-type checks first, ABCs only as fallback.
    t = type(value)
    if t is float:
        return value if math.isfinite(value) else None
    if t in _PLAIN:
        return value
    if t is dict or isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            try:
                out[str(k)] = _json_copy(v)
            except _NotJSONError as e:
                e.path.append(f"[{k!r}]")
                raise
        return out
    if t is list or t is tuple:
        items = []
        for i, v in enumerate(value):
            try:
                items.append(_json_copy(v))
            except _NotJSONError as e:
                e.path.append(f"[{i}]")
                raise
        return items
    if isinstance(value, numbers.Integral):  # numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # numpy floats
        x = float(value)
        return x if math.isfinite(x) else None
    raise _NotJSONError(value)


def _json_safe(value: Any, name: str) -> Any:
    """A JSON-ready copy of ``value``: non-finite floats become None, numpy scalars Python numbers."""
    try:
        return _json_copy(value)
    except _NotJSONError as e:
        where = name + "".join(reversed(e.path))
        msg = (
            f"{where} is {e.value!r} of type {type(e.value).__name__}, which the audit store cannot save as JSON; "
            "pass strings, numbers, None, lists and dicts (e.g. TokenScore.to_dict())"
        )
        raise ConfigurationError(msg) from None


def _check_text(value: Any, name: str, *, empty_ok: bool = True) -> str:
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        kind = "a string" if empty_ok else "a non-empty string"
        msg = f"{name} must be {kind}, got {value!r}"
        raise ConfigurationError(msg)
    return value


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One guarded answer and the decision taken on it (keyword-only construction).

    ``reliability``: the response score the policy used, higher = more reliable (``None`` when
    undefined, e.g. an empty answer). ``attempts``: generations made for this answer (retries
    included). ``tokens``: one dict per generated token, as ``TokenScore.to_dict()`` makes them.
    ``stats``: the statistics the policy saw, by name. ``timings``: durations in seconds, by
    name (e.g. ``{"generate_s": 0.8, "score_s": 0.01}``). ``review_id``: the review item of this
    record, set by the store (:meth:`AuditStore.record_for_review`, :meth:`AuditStore.enqueue`).

    JSON has no NaN or infinity: non-finite floats in ``reliability``, ``tokens``, ``stats`` and
    ``timings`` become ``None`` here, so a record read back from the store equals the one built.
    The lists and dicts are copied, never the caller's objects.
    """

    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: datetime = field(default_factory=_utcnow)
    model: str
    policy_name: str
    policy_version: str
    prompt: str
    answer: str
    action: str
    reason: str
    rule: str | None = None
    reliability: float | None
    attempts: int = 1
    tokens: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, float | None] = field(default_factory=dict)
    timings: dict[str, float | None] = field(default_factory=dict)
    review_id: int | None = None

    def __post_init__(self) -> None:
        trace_id = _check_text(self.trace_id, "trace_id", empty_ok=False)
        if len(trace_id) > 64:
            msg = f"trace_id must be at most 64 characters, got {len(trace_id)}: {trace_id!r}; leave it to its default"
            raise ConfigurationError(msg)
        if not isinstance(self.created_at, datetime) or self.created_at.tzinfo is None:
            msg = f"created_at must be a timezone-aware datetime, got {self.created_at!r}; use datetime.now(timezone.utc)"
            raise ConfigurationError(msg)
        for name in ("model", "policy_name", "policy_version", "prompt", "answer", "reason"):
            _check_text(getattr(self, name), name)
        _check_text(self.action, "action", empty_ok=False)
        if self.rule is not None:
            _check_text(self.rule, "rule")
        reliability = self.reliability
        if reliability is not None and (isinstance(reliability, bool) or not isinstance(reliability, numbers.Real)):
            msg = f"reliability must be a float or None, got {self.reliability!r}"
            raise ConfigurationError(msg)
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 0:
            msg = f"attempts must be a non-negative integer, got {self.attempts!r}"
            raise ConfigurationError(msg)
        if not isinstance(self.tokens, (list, tuple)) or not all(isinstance(t, Mapping) for t in self.tokens):
            msg = f"tokens must be a list of dicts (TokenScore.to_dict()), got {self.tokens!r:.200}"
            raise ConfigurationError(msg)
        for name in ("stats", "timings"):
            if not isinstance(getattr(self, name), Mapping):
                msg = f"{name} must be a dict of name -> number, got {getattr(self, name)!r:.200}"
                raise ConfigurationError(msg)
        if self.review_id is not None and (isinstance(self.review_id, bool) or not isinstance(self.review_id, int)):
            msg = f"review_id must be an integer or None, got {self.review_id!r}"
            raise ConfigurationError(msg)
        set_ = partial(object.__setattr__, self)
        set_("created_at", self.created_at.astimezone(timezone.utc))
        set_("reliability", _json_safe(self.reliability, "reliability"))
        set_("tokens", _json_safe(self.tokens, "tokens"))
        set_("stats", _json_safe(self.stats, "stats"))
        set_("timings", _json_safe(self.timings, "timings"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``created_at`` as an ISO 8601 string with ``+00:00``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["created_at"] = self.created_at.isoformat()
        return out


@dataclass(frozen=True, kw_only=True)
class ReviewItem:
    """One answer waiting for (or given) a human verdict.

    ``claimed_by``/``claimed_at``: who took the item and when (also set by an approval or a
    rejection of a pending item). ``reviewer``/``decided_at``: who gave the verdict and when.
    ``edited_answer``: the reviewer's corrected answer (approvals only), ``note``: the
    reviewer's comment (required for a rejection). All times are UTC. ``record``: the decision
    under review.
    """

    id: int
    trace_id: str
    status: ReviewStatus
    created_at: datetime
    claimed_by: str | None
    claimed_at: datetime | None
    reviewer: str | None
    decided_at: datetime | None
    edited_answer: str | None
    note: str | None
    record: AuditRecord

    @property
    def decided(self) -> bool:
        """True once approved or rejected (final)."""
        return self.status in _DECIDED

    @property
    def final_answer(self) -> str | None:
        """The answer to deliver: the edited (else original) answer once approved, otherwise None."""
        if self.status != "approved":
            return None
        return self.edited_answer if self.edited_answer is not None else self.record.answer


# ----------------------------------------------------------------------------- schema


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
    return rec


def _row_to_item(m: sa.RowMapping) -> ReviewItem:
    return ReviewItem(**{name: m[f"r_{name}"] for name in _REVIEW_FIELDS}, record=_row_to_record(m, "a_"))


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
