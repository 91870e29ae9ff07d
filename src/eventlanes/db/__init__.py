"""Database access shared by the event store, the token store and projections."""

from __future__ import annotations

from .base import Database
from .url import DatabaseURL, parse_url, validate_prefix


def open_database(url: str | DatabaseURL) -> Database:
    """Open the database behind a store URL (``sqlite:///file.db`` or ``postgresql://...``)."""
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.backend == "sqlite":
        from .sqlite import SQLiteDatabase

        return SQLiteDatabase(parsed)
    from .postgres import PostgresDatabase

    return PostgresDatabase(parsed)


__all__ = ["Database", "DatabaseURL", "open_database", "parse_url", "validate_prefix"]
