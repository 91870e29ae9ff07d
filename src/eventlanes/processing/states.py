"""Aggregation states: one row per (aggregation, key) with the value, the source offsets folded
in, and how many inputs were dropped as duplicates.

Table ``{prefix}aggregates``: (aggregation, key) primary key, ``value`` (JSON), ``offsets``
(JSON: source -> [partition, path]), ``dropped``, ``updated_at`` (epoch ms).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ..db import Database
from ..schema import require

try:  # several times faster than the stdlib on both ways; exact, or it raises (see below)
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the spark extra
    orjson = None  # type: ignore[assignment]


def encode(value: Any) -> str:
    """Compact JSON, the stdlib's text. orjson writes it faster, but is taken only where its
    text is the same: it refuses integers beyond 64 bits (rather than rounding them), and it
    writes NaN and infinities as null, silently; text with a null in it (rare in states) is
    therefore written by the stdlib, which keeps them (``NaN``, ``Infinity``)."""
    if orjson is not None:
        try:
            text = orjson.dumps(value)
        except TypeError:
            pass
        else:
            if b"null" not in text:
                return text.decode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def encode_all(values: list[Any]) -> list[str]:
    """:func:`encode` of each value, in one pass when orjson takes them all."""
    if orjson is not None:
        try:
            texts = list(map(orjson.dumps, values))
        except TypeError:
            pass
        else:
            if not any(b"null" in t for t in texts):
                return list(map(bytes.decode, texts))
    return [encode(v) for v in values]


def decode(text: str) -> Any:
    """orjson reads integers beyond 64 bits as floats, silently: text with a run of 19 digits
    or more (which may be such an integer) is read by the stdlib, exactly; so is text orjson
    refuses (the stdlib's NaN and infinities)."""
    if orjson is not None and not _LONG_DIGITS.search(text):
        try:
            return orjson.loads(text)
        except ValueError:
            pass
    return json.loads(text)


_LONG_DIGITS = re.compile(r"\d{19}")


@dataclass(slots=True)
class Entry:
    value: Any
    offsets: dict[str, list[Any]] = field(default_factory=dict)
    dropped: int = 0


class StateTable:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = t = db.table("aggregates")
        require(db, "aggregates")  # the table: eventlanes.schema.v1_initial
        q = db.sql
        self._create = q(
            f"""INSERT INTO {t} (aggregation, key, value, offsets, dropped, updated_at)
                VALUES (?, ?, ?, ?, ?, {db.now_ms}) ON CONFLICT (aggregation, key) DO NOTHING"""
        )
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
                found[key] = Entry(decode(value), decode(offsets), dropped)
        return found

    def lock(
        self, conn: Any, name: str, keys: list[str], initial: Callable[[], Any]
    ) -> dict[str, Entry]:
        """The states of ``keys`` under a row lock, creating missing rows first: a row that does
        not exist cannot be locked, and two writers would each start from ``initial()`` and
        the second would overwrite the first (a lost update)."""
        rows = [(name, k, encode(initial()), "{}", 0) for k in keys]
        cur = conn.cursor()
        try:
            cur.executemany(self._create, rows)
        finally:
            cur.close()
        return self.load(conn, name, keys, lock=True)

    def save(
        self,
        conn: Any,
        name: str,
        entries: dict[str, Entry],
        keys: Any = None,
        encode_offsets: Callable[[list[str], list[Entry]], list[str]] | None = None,
    ) -> None:
        """Upsert ``entries`` (only those of ``keys`` if given), each encoded once, in key
        order (neighbouring rows of the primary key's B-tree are written together).
        ``encode_offsets``: the offsets' JSON of (keys, entries), when kept partly elsewhere."""
        chosen = sorted(entries) if keys is None else sorted(keys)
        picked = [entries[k] for k in chosen]
        values = encode_all([e.value for e in picked])
        if encode_offsets is not None:
            offsets = encode_offsets(chosen, picked)
        else:
            offsets = encode_all([e.offsets for e in picked])
        dropped = [e.dropped for e in picked]
        self._upsert_all(conn, zip(repeat(name), chosen, values, offsets, dropped, strict=False))

    def save_encoded(self, conn: Any, name: str, rows: list[tuple[str, str, str, int]]) -> None:
        """Upsert (key, value JSON, offsets JSON, dropped) rows encoded elsewhere (Spark)."""
        self._upsert_all(conn, [(name, *row) for row in rows])

    def _upsert_all(self, conn: Any, params: Iterable[tuple[Any, ...]]) -> None:
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
