"""The audit store: guard decisions and the human-review queue, in one database (SQLAlchemy).

Stores the :class:`~logtoku_guard.audit.records.AuditRecord` of every guarded answer and the
:class:`~logtoku_guard.audit.records.ReviewItem` of answers sent to a human. A verdict is final:
the review-queue methods (:class:`~logtoku_guard.audit.queue.ReviewQueue`, inherited) make every
transition one conditional ``UPDATE ... WHERE status IN (...)`` whose row count is checked, so
two reviewers racing on the same item cannot both decide it.

The schema is SQLAlchemy Core, so the same code runs on a local SQLite file (the default) or on
a server through a database URL (``postgresql+psycopg://user@host/db``; the driver is the
deployment's own dependency, e.g. the ``postgresql`` extra). Times are timezone-aware UTC in
Python and stored as naive UTC.

Schema: ``audit_meta`` holds ``SCHEMA_VERSION``; a store of another version is refused with a
message saying which side is newer, before anything is created or altered. On PostgreSQL,
opening holds a transaction-scoped advisory lock while it checks and creates the tables, so
processes opening a new database at once all succeed (on SQLite, ``BEGIN IMMEDIATE`` does it);
the reviewers table takes the same lock. Pooled PostgreSQL connections are pinged before use,
so a server restart costs no failed write.
Concurrent writers need nothing more there: each transition is one row-locked ``UPDATE``.

SQLite settings, on every connection: ``journal_mode=WAL`` (readers never block the writer),
``busy_timeout`` (a writer waits for the lock instead of failing, 30 s by default),
``synchronous=NORMAL`` (a committed record survives the death of the process; a power cut may
lose the last commits but never corrupts the file) and ``foreign_keys=ON``. Write transactions
start with ``BEGIN IMMEDIATE``, so concurrent writers (threads or processes) queue on the lock.

Data protection: a new SQLite file is created owner-only (0600, its ``-wal``/``-shm`` likewise);
an existing file that is empty or not a store is refused, never recreated (:mod:`._files`).
``redact`` (:mod:`.redact`) rewrites the prompt (and, opt-in, the answer) before anything is
written. Claims expire after ``claim_ttl``; reviewer names are free text, and callers may pass
the OS account (``os_user``) that is stored beside them.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Connection, Engine

from logtoku_guard.audit import _files
from logtoku_guard.audit.decisions import DecisionReads
from logtoku_guard.audit.queue import ReviewQueue
from logtoku_guard.audit.records import (
    _OPEN,
    AuditRecord,
    PurgeSummary,
    SkippedRow,
    StoredRows,
    _utcnow,
)
from logtoku_guard.audit.redact import RedactMode, Redactor, redact_record, redactor
from logtoku_guard.audit.schema import (
    _ADDED_COLUMNS,
    _RECORD_FIELDS,
    _WRITE_OPTION,
    SCHEMA_VERSION,
    _add_missing_columns,
    _check_version,
    _configure_sqlite,
    _json_dumps,
    _json_loads,
    _meta,
    _metadata,
    _record_insert,
    _record_row,
    _record_select,
    _records,
    _reviews,
    _row_to_record,
    _UTCDateTime,
    _write_rows,
    read_one,
    read_rows,
)
from logtoku_guard.errors import (
    AuditStoreError,
    ConfigurationError,
    MissingDependencyError,
    UnknownTraceError,
    short_repr,
)

__all__ = ["AuditStore", "ExportFormat", "ExportedRows"]

ExportFormat = Literal["jsonl", "csv"]

MAX_ROWS = 2**63 - 1
"""Largest row count a query can be asked for (a 64-bit SQL integer)."""


def _init_tables(path: Path) -> None:
    """The tables and schema version, in the new (empty) SQLite file ``path``."""
    engine = sa.create_engine(
        sa.URL.create("sqlite", database=str(path)), json_serializer=_json_dumps, json_deserializer=_json_loads
    )
    try:
        with engine.begin() as conn:
            _metadata.create_all(conn)
            conn.execute(sa.insert(_meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
    except exc.DBAPIError as e:
        raise OSError(str(e.orig if e.orig is not None else e)) from e
    finally:
        engine.dispose()


_SCHEMA_LOCK = 0x6C74_6B75_6175_6474  # "ltkuaudt": PostgreSQL advisory lock held while opening (tables, version)


class ExportedRows(int):
    """The number of records :meth:`AuditStore.export` wrote, with :attr:`skipped`: the rows it could
    not read and left out (see :class:`~logtoku_guard.audit.records.SkippedRow`)."""

    skipped: list[SkippedRow]


# ----------------------------------------------------------------------------- store


class AuditStore(ReviewQueue, DecisionReads):
    """The audit records of a guard and its human-review queue, in one database.

    ``url_or_path``: a file path (made absolute, used as SQLite; its folder must exist) or a
    SQLAlchemy database URL (any string containing ``"://"``). ``busy_timeout_s``: SQLite
    only, how long a writer waits for another writer's lock before failing, in seconds.

    ``redact``: what is stored of each prompt, applied before anything is written: ``"keep"``,
    ``"hash"`` (``"sha256:<hex>"``), ``"drop"`` (``""``) or a function ``str -> str``; default
    ``$LOGTOKU_GUARD_REDACT``, else ``"keep"``. ``redact_answer``: the same for the answer, opt-in
    (``True``: as ``redact``; or its own mode or function); a redacted answer also loses its
    token texts, and an approval releases the redacted text, so leave it off where answers
    go to human review. Reviewers' edited answers and notes are stored as given.

    ``claim_ttl``: how long a claim holds (``None``: until released or decided); an expired
    claim can be taken, approved or rejected by someone else.

    Opening a SQLite file that does not exist creates it owner-only (0600) with the tables; an
    existing file must be a store (an empty, damaged or foreign file raises
    :class:`AuditStoreError`). Other databases get the tables if missing. ``create=False``
    opens an existing store only (for readers: a mistyped path raises instead of starting an
    empty store) and writes nothing while opening a store of this version, so a store this
    process may only read (a read-only file or folder) opens, read-only, and its writes fail
    when tried. A path named like a SQLite side file (``-wal``, ``-shm``, ``-journal``) is
    refused: SQLite would delete or rewrite it when the database beside it opens. Otherwise
    opening makes one small write, so an unusable location fails here, not at the first
    record. Safe to share between threads; any number of processes may open the same file.
    """

    def __init__(
        self,
        url_or_path: str | os.PathLike[str] = "logtoku_audit.db",
        *,
        busy_timeout_s: float = 30.0,
        redact: RedactMode | Redactor | None = None,
        redact_answer: bool | RedactMode | Redactor = False,
        claim_ttl: timedelta | None = None,
        create: bool = True,
    ) -> None:
        if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, (int, float)) or not 0 <= busy_timeout_s < math.inf:
            msg = f"busy_timeout_s must be a non-negative number of seconds, got {busy_timeout_s!r}"
            raise ConfigurationError(msg)
        if claim_ttl is not None and (not isinstance(claim_ttl, timedelta) or claim_ttl <= timedelta(0)):
            msg = f"claim_ttl must be a positive timedelta or None, got {claim_ttl!r}; e.g. timedelta(minutes=30)"
            raise ConfigurationError(msg)
        self.claim_ttl = claim_ttl
        """How long a claim holds before others may take the item (None: no expiry)."""
        self._redact_prompt = redactor(redact)
        if redact_answer is True:
            self._redact_answer = self._redact_prompt
        elif redact_answer is False:
            self._redact_answer = None
        else:
            self._redact_answer = redactor(redact_answer, "redact_answer")
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
            _files.check_store_name(path)
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
        self._file = _files.sqlite_file(url)
        if self._file is not None:
            _files.check_store_name(self._file)
            if not create:  # a store this process may only read is opened read-only by SQLite too
                url = _files.read_only_url(self._file) or url
        self._closed = False
        # SQLite has one writer at a time: this process's threads queue here, in order and without
        # the sleep-and-retry of busy_timeout (which still arbitrates between processes).
        self._write_lock = threading.Lock()
        try:
            # pre-ping: a pooled connection that a server restart or an idle timeout closed is
            # replaced before use instead of failing the next write (SQLite has no server)
            self._engine: Engine = sa.create_engine(
                url, json_serializer=_json_dumps, json_deserializer=_json_loads, pool_pre_ping=not self._sqlite
            )
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
            if self._file is not None and not _files.check_existing(self._file, self._fix(OSError())):
                if not create:
                    msg = (
                        f"there is no audit store at {self._file}; check the path (a store is made by the first "
                        "guarded answer that is recorded, e.g. by `logtoku-guard ask` or `serve` with this store)"
                    )
                    raise AuditStoreError(msg)
                _files.create_store_file(self._file, _init_tables, self._fix(OSError()))
            if create or not self._schema_is_current():
                with self._transaction("open", write=True) as conn:
                    self._lock_schema(conn)
                    version = self._stored_version(conn, create)
                    _metadata.create_all(conn)
                    _add_missing_columns(conn)
                    if version is None:
                        conn.execute(sa.insert(_meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
                    else:  # the write probe: a read-only store fails now rather than at the first record
                        conn.execute(sa.update(_meta).where(_meta.c.key == "schema_version").values(value=version))
        except BaseException:
            self._engine.dispose()
            raise

    # -- plumbing

    def _stored_version(self, conn: Connection, create: bool) -> str | None:
        """The store's schema version (None: a database without our tables, which ``create`` may
        fill); a SQLite file without them, or another version, raises before anything is written."""
        has_meta = sa.inspect(conn).has_table(_meta.name)
        if self._file is not None and not has_meta:
            msg = (
                f"{self._where} is a SQLite database but not an audit store (it has no {_meta.name} table); "
                "pass the path of an audit store, or a new path to start one"
            )
            raise AuditStoreError(msg)
        if not create and not has_meta:
            msg = f"{self._where} holds no audit store (no {_meta.name} table); check the URL"
            raise AuditStoreError(msg)
        if not has_meta:
            return None
        version = conn.execute(sa.select(_meta.c.value).where(_meta.c.key == "schema_version")).scalar_one_or_none()
        _check_version(version, self._where)
        return version

    def _schema_is_current(self) -> bool:
        """Whether the store has this version's tables and columns, checked in a read transaction
        (nothing written; errors as :meth:`_stored_version`). False: opening must add some."""
        with self._transaction("open", write=False) as conn:
            if self._stored_version(conn, create=False) is None:
                return False
            inspector = sa.inspect(conn)
            if not set(_metadata.tables) <= set(inspector.get_table_names()):
                return False
            return all(set(names) <= {c["name"] for c in inspector.get_columns(table)} for table, names in _ADDED_COLUMNS.items())

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
        if self._sqlite and ("malformed" in text or "not a database" in text):
            return (
                "the file is damaged (truncated or partly overwritten): restore it from a backup, or move it "
                "away and pass a new path to start a new store"
            )
        if "locked" in text or "busy" in text:
            return "another writer held the lock longer than busy_timeout_s; raise busy_timeout_s or shorten other transactions"
        if not self._sqlite and ("0x00" in text or "\\u0000" in text):
            return "PostgreSQL cannot store NUL characters in text; remove them first (e.g. with a redact function)"
        if self._sqlite:
            return (
                "check that the folder exists and this user can write to it (and to the file), and that the disk has "
                "space; or pass another store path in a writable folder, or a database URL"
            )
        return "check that the database server is reachable, the URL and credentials are right and the user may create tables"

    def _lock_schema(self, conn: Connection) -> None:
        """Let one opener at a time create or alter tables, until ``conn``'s transaction ends
        (PostgreSQL: a transaction-scoped advisory lock; SQLite: its write transaction does it)."""
        if not self._sqlite:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})

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

    def _redacted(self, rec: AuditRecord) -> AuditRecord:
        if not isinstance(rec, AuditRecord):
            msg = f"expected an AuditRecord, got {type(rec).__name__}: {rec!r:.200}"
            raise ConfigurationError(msg)
        return redact_record(rec, self._redact_prompt, self._redact_answer)

    # -- records

    def record(self, rec: AuditRecord) -> str:
        """Save one record (one transaction) and return its trace id."""
        rec = self._redacted(rec)
        with self._transaction("write a record to", write=True) as conn:
            self._insert_record(conn, rec)
        return rec.trace_id

    def get(self, trace_id: str) -> AuditRecord:
        """The record with this trace id; :class:`UnknownTraceError` (an AuditStoreError) if none,
        :class:`~logtoku_guard.errors.UnreadableRowError` if its row cannot be read."""
        with self._transaction("read", write=False) as conn:
            row = conn.execute(_record_select.where(_records.c.trace_id == trace_id)).mappings().one_or_none()
        if row is None:
            msg = f"no audit record with trace id {trace_id!r} in {self._where}; list recent ones with tail()"
            raise UnknownTraceError(msg)
        return read_one(row, _row_to_record, _record_row)

    def tail(self, n: int = 20) -> StoredRows[AuditRecord]:
        """The ``n`` newest records (by ``created_at``), newest first. A row that cannot be read is
        left out and listed in the result's ``skipped`` (fewer than ``n`` records then)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_ROWS:
            msg = f"n must be an integer from 0 to {MAX_ROWS}, got {short_repr(n)}"
            raise ConfigurationError(msg)
        stmt = _record_select.order_by(_records.c.created_at.desc(), _records.c.id.desc()).limit(n)
        skipped: list[SkippedRow] = []
        with self._transaction("read", write=False) as conn:
            rows = list(read_rows(conn.execute(stmt).mappings(), _row_to_record, _record_row, skipped))
        return StoredRows(rows, skipped)

    def count(self) -> int:
        """Number of records in the store."""
        with self._transaction("read", write=False) as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_records)).scalar_one())

    def purge_older_than(self, days: float) -> int:
        """:meth:`purge` of records older than ``days`` days; returns the number of records deleted.

        Records whose review item is still pending or claimed are kept (see :meth:`purge`).
        """
        return self.purge(days).records

    def purge(self, days: float, *, include_undecided: bool = False, dry_run: bool = False) -> PurgeSummary:
        """Delete the records created more than ``days`` days ago, and their review items (retention).

        A record whose review item is undecided (``pending`` or ``claimed``) is kept unless
        ``include_undecided``: nobody's open work disappears by accident. ``dry_run``: count what
        would go and delete nothing. One transaction: the counts are what was deleted.
        """
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not (0 <= days < math.inf):
            msg = f"days (CLI: --days) must be a finite non-negative number of days, got {days!r}; e.g. 90"
            raise ConfigurationError(msg)
        now = _utcnow()
        try:
            cutoff = now - timedelta(days=days)
        except OverflowError:
            limit = (now - datetime.min.replace(tzinfo=timezone.utc)).days
            msg = f"days (CLI: --days) {days!r} reaches back before the year 1; give at most {limit} days (0 purges every record)"
            raise ConfigurationError(msg) from None
        old = _records.c.created_at < sa.literal(cutoff, _UTCDateTime())
        undecided = _records.c.trace_id.in_(sa.select(_reviews.c.trace_id).where(_reviews.c.status.in_(_OPEN)))
        target = old if include_undecided else sa.and_(old, sa.not_(undecided))
        their_reviews = _reviews.c.trace_id.in_(sa.select(_records.c.trace_id).where(target))
        count = sa.select(sa.func.count()).select_from(_records)
        with self._transaction("purge", write=not dry_run) as conn:
            n = int(conn.execute(count.where(target)).scalar_one())
            by_status = conn.execute(
                sa.select(_reviews.c.status, sa.func.count()).where(their_reviews).group_by(_reviews.c.status)
            ).all()
            kept = 0 if include_undecided else int(conn.execute(count.where(old, undecided)).scalar_one())
            if not dry_run:
                conn.execute(sa.delete(_reviews).where(their_reviews))
                conn.execute(sa.delete(_records).where(target))
        reviews = {str(status): int(k) for status, k in by_status}
        return PurgeSummary(records=n, reviews=reviews, kept_undecided=kept, cutoff=cutoff, dry_run=dry_run)

    def export(self, path: str | os.PathLike[str], fmt: ExportFormat = "jsonl", *, overwrite: bool = False) -> ExportedRows:
        """Write every record, oldest first, to ``path``; returns the number of rows written (an
        :class:`ExportedRows`, whose ``skipped`` lists the rows that could not be read and were left out).

        ``jsonl``: one :meth:`AuditRecord.to_dict` object a line. ``csv``: a header row, then one
        row a record; ``tokens``, ``stats``, ``timings`` and ``tool_calls`` as JSON strings, None as an empty cell.
        The file is written under a temporary name (owner-only) and renamed into place, so a
        failed export leaves nothing; an existing ``path`` is replaced only with ``overwrite``,
        and the store's own files are refused (:class:`ConfigurationError`).
        """
        if fmt not in ("jsonl", "csv"):
            msg = f"export format must be 'jsonl' or 'csv', got {fmt!r}"
            raise ConfigurationError(msg)
        skipped: list[SkippedRow] = []
        with self._transaction("export", write=False) as conn:
            n = _files.export_to(path, self._file, overwrite, lambda f: _write_rows(conn, f, fmt, skipped))
        out = ExportedRows(n)
        out.skipped = skipped
        return out
