"""Event stores: SQLite (embedded default) and PostgreSQL (production)."""

from __future__ import annotations

from ..db import Database, DatabaseURL, open_database
from .base import EventStore


def open_store(url: str | DatabaseURL | Database, create: bool = True) -> EventStore:
    """Open (and create the schema of) the event store at ``url``.

    ``create=False`` opens an existing store read-only: it never creates a file, a schema or a
    table and never writes; a missing file, database or table raises StoreConnectionError
    naming the URL and what is missing (appends then fail with StoreConnectionError too).

    ``sqlite:///events.db`` (relative path), ``sqlite:////abs/events.db``, or
    ``postgresql://user:password@host:5432/dbname``. Options in the query string:
    ``prefix`` (table prefix, default ``el_``), SQLite ``synchronous`` (default ``normal``),
    PostgreSQL ``pool_min``/``pool_max``; other PostgreSQL parameters go to libpq.
    """
    db = url if isinstance(url, Database) else open_database(url, create=create)
    if db.backend == "sqlite":
        from .sqlite import SQLiteEventStore

        return SQLiteEventStore(db)  # type: ignore[arg-type]
    from .postgres import PostgresEventStore

    return PostgresEventStore(db)  # type: ignore[arg-type]


__all__ = ["EventStore", "open_store"]
