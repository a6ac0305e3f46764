"""PostgreSQL's JSONB for the audit store's JSON columns, without importing SQLAlchemy's PostgreSQL
dialect until a PostgreSQL store compiles it (a SQLite store, the default, never loads it)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

__all__ = ["LazyJSONB"]


class LazyJSONB(sa.types.TypeDecorator[Any]):
    """JSONB, the ``postgresql`` variant of the JSON columns (``sa.JSON().with_variant(LazyJSONB(),
    "postgresql")``): the same DDL, bind casts and processing as ``JSONB()`` itself, with
    ``sqlalchemy.dialects.postgresql`` imported when first compiled instead of at import."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        from sqlalchemy.dialects.postgresql import JSONB

        return dialect.type_descriptor(JSONB())

    @property
    def render_bind_cast(self) -> bool:  # type: ignore[override]
        """The driver's JSONB's own (psycopg: ``%(x)s::JSONB``), so the SQL is the plain JSONB variant's."""
        return bool(self.impl_instance.render_bind_cast)
