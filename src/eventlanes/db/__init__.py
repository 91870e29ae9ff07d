"""Database access shared by the event store, the token store and projections."""

from __future__ import annotations

from .base import Database
from .url import DatabaseURL, parse_url, validate_prefix


def open_database(url: str | DatabaseURL, create: bool = True) -> Database:
    """Open the database behind a store URL (``sqlite:///file.db`` or ``postgresql://...``).

    ``create=False`` opens it read-only: a missing SQLite file is an error (never created),
    SQLite opens the file in read-only mode, PostgreSQL sessions are read-only, and schema
    statements only check that their tables exist.
    """
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.backend == "sqlite":
        from .sqlite import SQLiteDatabase

        return SQLiteDatabase(parsed, create=create)
    from .postgres import PostgresDatabase

    return PostgresDatabase(parsed, create=create)


__all__ = ["Database", "DatabaseURL", "open_database", "parse_url", "validate_prefix"]
