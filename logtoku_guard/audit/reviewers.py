"""Reviewer accounts: who may decide review items, known by a personal token.

``logtoku-guard review add-reviewer NAME`` creates an account and prints its token once; the
review web page (``logtoku-guard review serve``) then knows who acts from the token, so nobody
approves as somebody else. Only the SHA-256 of a token is stored (a token is 256 random bits,
so a plain hash is as strong as a slow one); a presented token is hashed and compared in
constant time.

The accounts live in their own table, ``logtoku_reviewers``, in the same database as the
:class:`~logtoku_guard.audit.store.AuditStore` (created on first use, on the store's engine and
with its write transactions), so the review queue and its reviewers move together.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import exc

from logtoku_guard.audit.records import _utcnow
from logtoku_guard.audit.schema import _UTCDateTime
from logtoku_guard.errors import ConfigurationError

if TYPE_CHECKING:
    from logtoku_guard.audit.store import AuditStore

__all__ = ["ADMIN_NAME", "Reviewer", "ReviewerRegistry", "hash_token"]

ADMIN_NAME = "admin"
"""Who acts with the access token of ``review serve``; no account may take this name."""

_reviewer_metadata = sa.MetaData()
_reviewers = sa.Table(
    "logtoku_reviewers",
    _reviewer_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", _UTCDateTime(), nullable=False),
    sa.Column("disabled", sa.Boolean, nullable=False, default=False),
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def hash_token(token: str) -> str:
    """The stored form of a token: its SHA-256, as 64 hex digits."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Reviewer:
    """One reviewer account (never its token)."""

    name: str
    created_at: datetime
    disabled: bool


class ReviewerRegistry:
    """The reviewer accounts of one audit store.

    Creating the registry creates the ``logtoku_reviewers`` table if missing (one write).
    """

    def __init__(self, store: AuditStore) -> None:
        self.store = store
        with store._transaction("create the reviewers table of", write=True) as conn:
            store._lock_schema(conn)  # registries opened at once on a new database: one creates the table
            _reviewer_metadata.create_all(conn)

    @staticmethod
    def check_name(name: object) -> str:
        """``name`` if it is a valid reviewer name (1-64 letters, digits, ``_.@-``), else ConfigurationError."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            msg = (
                f"a reviewer name is 1 to 64 letters, digits, '_', '.', '@' or '-' starting with a letter "
                f"or digit, got {name!r}; e.g. add-reviewer alice"
            )
            raise ConfigurationError(msg)
        if name.lower() == ADMIN_NAME:
            msg = f"the reviewer name {name!r} is reserved for the access token printed by `review serve`; pick another name"
            raise ConfigurationError(msg)
        return name

    def add(self, name: str) -> tuple[Reviewer, str]:
        """Create the account ``name``; return it and its token (shown once, stored hashed)."""
        name = self.check_name(name)
        token = secrets.token_urlsafe(32)
        now = _utcnow()
        try:
            with self.store._transaction("add a reviewer to", write=True) as conn:
                row = {"name": name, "token_sha256": hash_token(token), "created_at": now, "disabled": False}
                conn.execute(sa.insert(_reviewers).values(**row))
        except exc.IntegrityError as e:
            msg = f"a reviewer named {name!r} already exists in {self.store.url}; pick another name"
            raise ConfigurationError(msg) from e
        return Reviewer(name=name, created_at=now, disabled=False), token

    def list(self) -> list[Reviewer]:
        """Every account, by name."""
        stmt = sa.select(_reviewers.c.name, _reviewers.c.created_at, _reviewers.c.disabled).order_by(_reviewers.c.name)
        with self.store._transaction("read", write=False) as conn:
            return [Reviewer(name=r.name, created_at=r.created_at, disabled=bool(r.disabled)) for r in conn.execute(stmt)]

    def set_disabled(self, name: str, disabled: bool = True) -> Reviewer:
        """Disable (or re-enable) an account: a disabled reviewer's token no longer logs in."""
        with self.store._transaction("update a reviewer in", write=True) as conn:
            changed = conn.execute(sa.update(_reviewers).where(_reviewers.c.name == name).values(disabled=disabled)).rowcount
            row = conn.execute(sa.select(_reviewers.c.created_at).where(_reviewers.c.name == name)).one_or_none()
        if changed != 1 or row is None:
            msg = f"no reviewer named {name!r} in {self.store.url}; see the list of reviewers"
            raise ConfigurationError(msg)
        return Reviewer(name=name, created_at=row.created_at, disabled=disabled)

    def authenticate(self, token: str) -> Reviewer | None:
        """The enabled reviewer whose token this is, else None (compared in constant time)."""
        if not isinstance(token, str) or not token:
            return None
        digest = hash_token(token)
        stmt = sa.select(_reviewers).where(_reviewers.c.token_sha256 == digest)
        with self.store._transaction("read", write=False) as conn:
            row = conn.execute(stmt).one_or_none()
        if row is None or not hmac.compare_digest(row.token_sha256, digest) or row.disabled:
            return None
        return Reviewer(name=row.name, created_at=row.created_at, disabled=False)

    def is_active(self, name: str) -> bool:
        """True when ``name`` is an enabled account."""
        stmt = sa.select(_reviewers.c.disabled).where(_reviewers.c.name == name)
        with self.store._transaction("read", write=False) as conn:
            row = conn.execute(stmt).one_or_none()
        return row is not None and not row.disabled
