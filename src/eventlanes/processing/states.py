"""Aggregation states: one row per (aggregation, key) with the value, the source offsets folded
in, and how many inputs were dropped as duplicates.

Table ``{prefix}aggregates``: (aggregation, key) primary key, ``value`` (JSON), ``offsets``
(JSON: source -> [partition, path]), ``dropped``, ``updated_at`` (epoch ms).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..db import Database


@dataclass
class Entry:
    value: Any
    offsets: dict[str, list[Any]] = field(default_factory=dict)
    dropped: int = 0


class StateTable:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = t = db.table("aggregates")
        db.run_ddl(
            [
                f"""CREATE TABLE IF NOT EXISTS {t} (
                    aggregation TEXT NOT NULL,
                    key TEXT NOT NULL,
                    value TEXT NOT NULL,
                    offsets TEXT NOT NULL,
                    dropped BIGINT NOT NULL DEFAULT 0,
                    updated_at BIGINT NOT NULL,
                    PRIMARY KEY (aggregation, key))"""
            ]
        )
        q = db.sql
        self._upsert = q(
            f"""INSERT INTO {t} (aggregation, key, value, offsets, dropped, updated_at)
                VALUES (?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, key) DO UPDATE SET value = excluded.value,
                    offsets = excluded.offsets, dropped = excluded.dropped,
                    updated_at = excluded.updated_at"""
        )

    def load(self, conn: Any, name: str, keys: list[str], lock: bool = False) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        suffix = self.db.for_update if lock else ""
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ", ".join(self.db.param for _ in chunk)
            rows = conn.execute(
                self.db.sql(
                    f"SELECT key, value, offsets, dropped FROM {self.table} "
                    f"WHERE aggregation = ? AND key IN ({marks}){suffix}"
                ),
                (name, *chunk),
            ).fetchall()
            for key, value, offsets, dropped in rows:
                found[key] = Entry(json.loads(value), json.loads(offsets), dropped)
        return found

    def save(self, conn: Any, name: str, entries: dict[str, Entry]) -> None:
        dumps = json.dumps
        rows = [(k, dumps(e.value), dumps(e.offsets), e.dropped) for k, e in entries.items()]
        self.save_encoded(conn, name, rows)

    def save_encoded(self, conn: Any, name: str, rows: list[tuple[str, str, str, int]]) -> None:
        """Upsert (key, value JSON, offsets JSON, dropped) rows encoded elsewhere (Spark)."""
        params = [(name, *row) for row in rows]
        cur = conn.cursor()
        try:
            cur.executemany(self._upsert, params)
        finally:
            cur.close()

    def delete_all(self, conn: Any, name: str) -> None:
        conn.execute(self.db.sql(f"DELETE FROM {self.table} WHERE aggregation = ?"), (name,))

    def get(self, name: str, key: str) -> Any:
        with self.db.connection() as conn:
            entry = self.load(conn, name, [key]).get(key)
        return None if entry is None else entry.value

    def dropped(self, name: str) -> int:
        sql = self.db.sql(
            f"SELECT coalesce(sum(dropped), 0) FROM {self.table} WHERE aggregation = ?"
        )
        return int(self.db.query(sql, (name,))[0][0])
