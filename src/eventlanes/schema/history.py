"""The table of applied migrations, ``{prefix}schema_migrations``: one row per migration
applied to this store (``version`` primary key, ``name``, ``applied_at`` in epoch ms on the
database's clock). Its versions, compared with the code's list, say whether the store is
current."""

from __future__ import annotations

from typing import Any

from ..db import Database
from .migrations import Migration

NAME = "schema_migrations"


def create(db: Database, conn: Any) -> None:
    conn.execute(
        f"""CREATE TABLE IF NOT EXISTS {db.table(NAME)} (
            version INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            applied_at BIGINT NOT NULL)"""
    )


def applied(db: Database, conn: Any) -> dict[int, str]:
    """Applied versions and their names (the table must exist)."""
    rows = conn.execute(f"SELECT version, name FROM {db.table(NAME)} ORDER BY version")
    return {int(version): name for version, name in rows.fetchall()}


def record(db: Database, conn: Any, migration: Migration) -> None:
    sql = f"INSERT INTO {db.table(NAME)} (version, name, applied_at) VALUES (?, ?, {db.now_ms})"
    conn.execute(db.sql(sql), (migration.version, migration.name))
