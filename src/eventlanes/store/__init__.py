"""Event stores: SQLite (embedded default) and PostgreSQL (production)."""

from __future__ import annotations

from ..db import Database, DatabaseURL, open_database
from .base import EventStore


def open_store(url: str | DatabaseURL | Database) -> EventStore:
    """Open (and create the schema of) the event store at ``url``.

    ``sqlite:///events.db`` (relative path), ``sqlite:////abs/events.db``, or
    ``postgresql://user:password@host:5432/dbname``. Options in the query string:
    ``prefix`` (table prefix, default ``el_``), SQLite ``synchronous`` (default ``normal``),
    PostgreSQL ``pool_min``/``pool_max``; other PostgreSQL parameters go to libpq.
    """
    db = url if isinstance(url, Database) else open_database(url)
    if db.backend == "sqlite":
        from .sqlite import SQLiteEventStore

        return SQLiteEventStore(db)  # type: ignore[arg-type]
    from .postgres import PostgresEventStore

    return PostgresEventStore(db)  # type: ignore[arg-type]


__all__ = ["EventStore", "open_store"]
