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

from ...db import Database
from ...errors import InvalidInputError
from ...events import NotExact, exact_json
from ...schema import require

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


def encode_states(name: str, keys: list[str], values: list[Any]) -> list[str]:
    """:func:`encode_all` of the states of ``keys``, each checked to read back equal (a state
    with a key that is not a string, a tuple, a datetime... would be silently changed by JSON):
    InvalidInputError naming the aggregation, the key and where in the state. NaN and
    infinities are kept (the stdlib's ``NaN``, ``Infinity``)."""
    texts = encode_all(values)
    try:
        same = list(map(_read_back, texts)) == values  # one C-speed pass, the usual case
    except ValueError:  # orjson refuses NaN and nesting past its limit: one by one below
        same = False
    if not same:
        for key, value, text in zip(keys, values, texts, strict=True):
            _check_state(name, key, value, text)
    return texts


def encode_state(name: str, key: str, value: Any) -> str:
    return encode_states(name, [key], [value])[0]


def _check_state(name: str, key: str, value: Any, text: str) -> None:
    try:
        if decode(text) == value:
            return
    except ValueError:
        pass
    try:  # NaN is not equal to itself, an integer beyond 64 bits may read as a float: the walk
        exact_json(value, allow_nan=True)  # decides
    except NotExact as exc:
        raise InvalidInputError(
            f"aggregation {name!r}, key {key!r}: state{exc.path}: {exc.reason}"
        ) from None
    except RecursionError:
        raise InvalidInputError(
            f"aggregation {name!r}, key {key!r}: the state is nested too deeply to be stored"
        ) from None


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
_read_back = orjson.loads if orjson is not None else json.loads

#: states encoded and sent per statement batch, in one transaction: encoding every changed
#: state at once held about 4 KB per state (orjson's output buffers) until the write ended, so
#: peak memory grew with the number of keys changed between writes
CHUNK = 1000


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
        order (neighbouring rows of the primary key's B-tree are written together), ``CHUNK``
        rows at a time within the caller's transaction: memory is bounded by the chunk, not
        by the number of states. ``encode_offsets``: the offsets' JSON of (keys, entries),
        when kept partly elsewhere. A state that would not read back equal fails the write
        (InvalidInputError naming the aggregation and key): the caller's transaction rolls
        back."""
        chosen = sorted(entries) if keys is None else sorted(keys)
        for start in range(0, len(chosen), CHUNK):
            part = chosen[start : start + CHUNK]
            picked = [entries[k] for k in part]
            values = encode_states(name, part, [e.value for e in picked])
            if encode_offsets is not None:
                offsets = encode_offsets(part, picked)
            else:
                offsets = encode_all([e.offsets for e in picked])
            dropped = [e.dropped for e in picked]
            self._upsert_all(conn, zip(repeat(name), part, values, offsets, dropped, strict=False))

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
