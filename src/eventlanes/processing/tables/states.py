"""Aggregation states: one row per (aggregation, key) with the value, the source offsets folded
in, and how many inputs were dropped as duplicates, in all and by root source.

Table ``{prefix}aggregates``: (aggregation, key) primary key, ``value`` (JSON), ``offsets``
(JSON: source -> [partition, path]), ``dropped``, ``dropped_by`` (JSON: source -> count, NULL
while none; schema version 4), ``updated_at`` (epoch ms).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
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
    """:func:`encode` of each value, in one pass when orjson takes them all. Each text is
    decoded as it is made: orjson's bytes of a small value hold about 4 KB until freed (100,000
    of them held 410 MB), its text only its characters."""
    if orjson is not None:
        dumps = orjson.dumps
        try:
            texts = [dumps(v).decode() for v in values]
        except TypeError:
            pass
        else:
            if "null" not in "\n".join(texts):  # one search, not one per text
                return texts
    return [encode(v) for v in values]


def encode_states(name: str, keys: list[str], values: list[Any]) -> list[str]:
    """:func:`encode_all` of the states of ``keys``, each checked to read back equal (a state
    with a key that is not a string, a tuple, a datetime... would be silently changed by JSON):
    InvalidInputError naming the aggregation, the key and where in the state. NaN and
    infinities are kept (the stdlib's ``NaN``, ``Infinity``)."""
    try:
        texts = encode_all(values)
    except (TypeError, ValueError):  # a value JSON cannot hold (a set, a cycle): named below
        texts = [_encode_named(name, key, value) for key, value in zip(keys, values, strict=True)]
    try:  # one array read at C speed, the usual case: each text is one JSON value (ours)
        same = _read_back("[" + ",".join(texts) + "]") == values
    except ValueError:  # orjson refuses NaN and nesting past its limit: one by one below
        same = False
    if not same:
        for key, value, text in zip(keys, values, texts, strict=True):
            _check_state(name, key, value, text)
    return texts


def encode_state(name: str, key: str, value: Any) -> str:
    return encode_states(name, [key], [value])[0]


def _encode_named(name: str, key: str, value: Any) -> str:
    try:
        return encode(value)
    except (TypeError, ValueError):
        _check_state(name, key, value, "")
        raise  # pragma: no cover - the walk above finds what JSON refused


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


def decode_all(texts: Sequence[str]) -> list[Any]:
    """:func:`decode` of each text, in one pass at C speed when no text has a run of 19
    ASCII digits (the only digits of a JSON number; found ten times faster than by the
    pattern, as a run of zeros once every digit is one) and orjson reads every one."""
    if orjson is not None and _NINETEEN not in "\n".join(texts).translate(_ZEROS):
        try:
            return list(map(orjson.loads, texts))
        except ValueError:  # the stdlib's NaN and infinities: text by text below
            pass
    return [decode(text) for text in texts]


_LONG_DIGITS = re.compile(r"\d{19}")
_ZEROS, _NINETEEN = str.maketrans("123456789", "0" * 9), "0" * 19
_read_back = orjson.loads if orjson is not None else json.loads

#: states encoded and sent per statement batch, in one transaction: encoding every changed
#: state at once held about 4 KB per state (orjson's output buffers) until the write ended, so
#: peak memory grew with the number of keys changed between writes
CHUNK = 1000
#: keys read per statement (one JSON array of keys on SQLite, one array on PostgreSQL): the
#: rows of a chunk are held at once; 500 marks per statement cost a statement parsed per 500
#: keys (PostgreSQL: a plan too), several times the reads themselves at a million keys
LOAD_CHUNK = 20_000
#: from this many rows on, a write on PostgreSQL is staged (COPY, then one INSERT ... SELECT):
#: 330,000 upserts took 13 to 23 s as one statement per row (5.5 s of it psycopg's, in this
#: process), 4.4 to 6 s staged (0.3 s); a small write keeps executemany's one round trip
STAGED_FROM = 100


@dataclass(slots=True)
class Entry:
    value: Any
    offsets: dict[str, list[Any]] = field(default_factory=dict)
    dropped: int = 0
    #: of ``dropped``, how many by root source (None while none; drops counted before schema
    #: version 4 have no source)
    dropped_by: dict[str, int] | None = None

    def drop(self, source: str) -> None:
        """Count an input of root ``source`` dropped as already folded in."""
        self.dropped += 1
        by = self.dropped_by
        if by is None:
            self.dropped_by = {source: 1}
        else:
            by[source] = by.get(source, 0) + 1


def encode_dropped_by(by: dict[str, int] | None) -> str | None:
    """``{source: count}`` in source order (the Spark engine writes the same text); None:
    nothing dropped."""
    return None if not by else encode(dict(sorted(by.items())))


def decode_dropped_by(text: str | None) -> dict[str, int] | None:
    return None if text is None else decode(text)


_VALUE, _OFFSETS, _DROPPED = attrgetter("value"), attrgetter("offsets"), attrgetter("dropped")
_DROPPED_BY = attrgetter("dropped_by")
#: (key, value JSON, offsets JSON, dropped, dropped_by JSON) of up to CHUNK states, by column
Columns = tuple[list[str], list[str], list[str], list[int], list[str | None]]


class StateTable:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = t = db.table("aggregates")
        require(db, "aggregates")  # the table: eventlanes.schema.v1_initial
        q = db.sql
        columns = "aggregation, key, value, offsets, dropped, dropped_by, updated_at"
        update = """DO UPDATE SET value = excluded.value, offsets = excluded.offsets,
                    dropped = excluded.dropped, dropped_by = excluded.dropped_by,
                    updated_at = excluded.updated_at"""
        self._create = q(
            f"""INSERT INTO {t} ({columns}) VALUES (?, ?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, key) DO NOTHING"""
        )
        self._upsert = q(
            f"""INSERT INTO {t} ({columns}) VALUES (?, ?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, key) {update}"""
        )
        row = "key, value, offsets, dropped, dropped_by"
        select = f"SELECT {row} FROM {t} WHERE aggregation = ? AND key"
        if db.backend == "postgresql":
            self._select = q(f"{select} = ANY(?::text[])")
        else:  # SQLite binds no arrays: the keys as one JSON array, the rows as one too
            self._select = (
                f"SELECT json_group_array(json_array({row})) FROM {t} "
                "WHERE aggregation = ? AND key IN (SELECT value FROM json_each(?))"
            )
        self._select_listed = select + " IN ({})"
        #: SQLite has json_each (built in since 3.38, an option before); None: not asked yet
        self._json_each: bool | None = None
        # PostgreSQL: rows are staged in a temporary table of the session (emptied at every
        # commit), then upserted by one statement; the name is the validated prefix's.
        stage = f"pg_temp.{db.table('aggregates_staged')}"
        self._stage = (
            f"""CREATE TEMPORARY TABLE IF NOT EXISTS {stage} (key TEXT NOT NULL, value TEXT
                NOT NULL, offsets TEXT NOT NULL, dropped BIGINT NOT NULL, dropped_by TEXT)
                ON COMMIT DELETE ROWS""",
            f"DELETE FROM {stage}",  # an earlier write of this transaction
            f"COPY {stage} (key, value, offsets, dropped, dropped_by) FROM STDIN",
        )
        self._temporary: bool | None = None  # the role may create temporary tables
        from_stage = f"""INSERT INTO {t} ({columns})
            SELECT %s, key, value, offsets, dropped, dropped_by, {db.now_ms} FROM {stage}
            ON CONFLICT (aggregation, key)"""
        self._from_stage = {True: f"{from_stage} {update}", False: f"{from_stage} DO NOTHING"}

    def load(
        self,
        conn: Any,
        name: str,
        keys: list[str],
        lock: bool = False,
        chars: list[int] | None = None,
    ) -> dict[str, Entry]:
        """The stored states of ``keys`` (those that have one), read :data:`LOAD_CHUNK` keys
        per statement; ``lock``: under a row lock (PostgreSQL) until the transaction ends.
        ``chars``: given, the characters of each state's value and offsets texts are appended
        to it, in the order of the result (what a cache sizes them by, without encoding them
        again)."""
        found: dict[str, Entry] = {}
        for start in range(0, len(keys), LOAD_CHUNK):
            rows = self._rows(conn, name, keys[start : start + LOAD_CHUNK], lock)
            if rows:
                stored, values, offsets, dropped, by = zip(*rows, strict=True)
                states = map(Entry, decode_all(values), decode_all(offsets), dropped,
                             map(decode_dropped_by, by))  # fmt: skip
                found.update(zip(stored, states, strict=True))
                if chars is not None:
                    chars += map(int.__add__, map(len, values), map(len, offsets))
        return found

    def _rows(self, conn: Any, name: str, keys: list[str], lock: bool) -> list[Any]:
        if self.db.backend == "postgresql":
            suffix = self.db.for_update if lock else ""
            return conn.execute(self._select + suffix, (name, keys)).fetchall()
        text = _json(keys) if self._has_json_each(conn) else None
        if text is None:
            return self._rows_listed(conn, name, keys)
        # One row: SQLite hands the GIL over at every row it steps to, and a row at a time
        # waited behind a busy thread (the reader's): 330,000 rows took 5 to 23 s so, 3.5 s
        # as one row, measured beside a thread spinning in Python.
        (rows,) = conn.execute(self._select, (name, text)).fetchone()
        return _read_back(rows)

    def _has_json_each(self, conn: Any) -> bool:
        if self._json_each is None:
            try:
                conn.execute("SELECT count(*) FROM json_each('[]')").fetchone()
            except sqlite3.OperationalError:
                self._json_each = False
            else:
                self._json_each = True
        return self._json_each

    def _rows_listed(self, conn: Any, name: str, keys: list[str]) -> list[Any]:
        """The rows of ``keys`` with a mark per key (SQLite, keys json_each cannot carry)."""
        rows: list[Any] = []
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            sql = self._select_listed.format(", ".join("?" * len(chunk)))
            rows += conn.execute(sql, (name, *chunk)).fetchall()
        return rows

    def lock(
        self, conn: Any, name: str, keys: list[str], initial: Callable[[], Any]
    ) -> dict[str, Entry]:
        """The states of ``keys`` under a row lock, creating missing rows first: a row that does
        not exist cannot be locked, and two writers would each start from ``initial()`` and
        the second would overwrite the first (a lost update)."""
        keys = sorted(set(keys))
        columns: Columns = (keys, [encode(initial()) for _ in keys], ["{}"] * len(keys),
                            [0] * len(keys), [None] * len(keys))  # fmt: skip
        self._write(conn, name, iter([columns]), len(keys), update=False)
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
        rows encoded at a time within the caller's transaction: memory is bounded by the chunk,
        not by the number of states. ``encode_offsets``: the offsets' JSON of (keys, entries),
        when kept partly elsewhere. A state that would not read back equal fails the write
        (InvalidInputError naming the aggregation and key): the caller's transaction rolls
        back."""
        if keys is None:
            chosen = sorted(entries)
        else:  # each key once: a staged upsert may not update a row twice
            chosen = sorted(keys if isinstance(keys, set | frozenset) else set(keys))
        self._write(conn, name, _encoded(name, entries, chosen, encode_offsets), len(chosen))

    def save_encoded(
        self, conn: Any, name: str, rows: list[tuple[str, str, str, int, str | None]]
    ) -> None:
        """Upsert (key, value JSON, offsets JSON, dropped, dropped_by JSON) rows encoded
        elsewhere (Spark); of rows of one key, the last."""
        last = list({row[0]: row for row in rows}.values())
        parts = (last[i : i + CHUNK] for i in range(0, len(last), CHUNK))
        chunks: Iterator[Columns] = (
            ([r[0] for r in p], [r[1] for r in p], [r[2] for r in p], [r[3] for r in p],
             [r[4] for r in p])
            for p in parts
        )  # fmt: skip
        self._write(conn, name, chunks, len(last))

    def _write(
        self, conn: Any, name: str, chunks: Iterator[Columns], count: int, update: bool = True
    ) -> None:
        """Upsert (``update``) or create the rows of ``chunks`` (``count`` in all): staged on
        PostgreSQL from :data:`STAGED_FROM` rows on, outside pipeline mode (COPY has none
        there); else one statement per row, sent together (executemany: on SQLite, as fast as
        one INSERT ... SELECT from json_each per chunk, measured; the B-tree's work is most of
        it)."""
        postgres = self.db.backend == "postgresql"
        if postgres and count >= STAGED_FROM and self._can_stage(conn):
            self._staged(conn, name, chunks, update)
            return
        statement = self._upsert if update else self._create
        for keys, values, offsets, dropped, by in chunks:
            rows = zip(repeat(name), keys, values, offsets, dropped, by, strict=False)
            self._upsert_all(conn, rows, statement)

    def _can_stage(self, conn: Any) -> bool:
        """Not in pipeline mode (COPY has none), and the role may create temporary tables
        (asked once: a refused CREATE would abort the caller's transaction)."""
        if conn.pgconn.pipeline_status:  # pq.PipelineStatus.OFF is 0
            return False
        if self._temporary is None:
            sql = "SELECT has_database_privilege(current_database(), 'TEMPORARY')"
            self._temporary = bool(conn.execute(sql).fetchone()[0])
        return self._temporary

    def _staged(self, conn: Any, name: str, chunks: Iterator[Columns], update: bool) -> None:
        """PostgreSQL: the rows copied into the session's staging table (each chunk as it is
        encoded), then upserted into the states by one statement."""
        create, empty, copy_in = self._stage
        cur = conn.cursor()
        try:
            cur.execute(create)
            cur.execute(empty)
            for keys, values, offsets, dropped, by in chunks:
                with cur.copy(copy_in) as copy:
                    for row in zip(keys, values, offsets, dropped, by, strict=True):
                        copy.write_row(row)
            cur.execute(self._from_stage[update], (name,))
        finally:
            cur.close()

    def _upsert_all(
        self, conn: Any, params: Iterable[tuple[Any, ...]], statement: str | None = None
    ) -> None:
        execute_many(conn, self._upsert if statement is None else statement, params)

    def delete_all(self, conn: Any, name: str) -> None:
        conn.execute(self.db.sql(f"DELETE FROM {self.table} WHERE aggregation = ?"), (name,))

    def any_of(self, name: str) -> bool:
        """Whether aggregation ``name`` has a stored state."""
        sql = self.db.sql(f"SELECT 1 FROM {self.table} WHERE aggregation = ? LIMIT 1")
        return bool(self.db.query(sql, (name,)))

    def get(self, name: str, key: str) -> Any:
        with self.db.connection() as conn:
            entry = self.load(conn, name, [key]).get(key)
        return None if entry is None else entry.value

    def dropped(self, name: str) -> int:
        sql = self.db.sql(
            f"SELECT coalesce(sum(dropped), 0) FROM {self.table} WHERE aggregation = ?"
        )
        return int(self.db.query(sql, (name,))[0][0])

    def dropped_by(self, name: str) -> dict[str, int]:
        """Inputs aggregation ``name`` dropped as duplicates, by root source (those counted
        before schema version 4 have none: the total may be more than the sum)."""
        return dropped_by_source(self.db, self.table, name)


def execute_many(conn: Any, statement: str, params: Iterable[tuple[Any, ...]]) -> None:
    """``statement`` once per row of ``params``, on a cursor closed after."""
    cur = conn.cursor()
    try:
        cur.executemany(statement, params)
    finally:
        cur.close()


def dropped_by_source(db: Database, table: str, name: str) -> dict[str, int]:
    """The sum of the ``dropped_by`` of ``name``'s states in ``table``, by source: read from
    the rows that dropped any, as few as the keys that saw duplicates."""
    sql = db.sql(f"SELECT dropped_by FROM {table} WHERE aggregation = ? AND dropped_by IS NOT NULL")
    total: dict[str, int] = {}
    for (text,) in db.query(sql, (name,)):
        for source, n in decode(text).items():
            total[source] = total.get(source, 0) + n
    return dict(sorted(total.items()))


def _encoded(
    name: str,
    entries: dict[str, Entry],
    chosen: list[str],
    encode_offsets: Callable[[list[str], list[Entry]], list[str]] | None,
) -> Iterator[Columns]:
    """The states of ``chosen`` encoded (and checked), ``CHUNK`` at a time, as they are sent."""
    for start in range(0, len(chosen), CHUNK):
        part = chosen[start : start + CHUNK]
        picked = list(map(entries.__getitem__, part))
        values = encode_states(name, part, list(map(_VALUE, picked)))
        if encode_offsets is not None:
            offsets = encode_offsets(part, picked)
        else:
            offsets = encode_all(list(map(_OFFSETS, picked)))
        by = [encode_dropped_by(b) for b in map(_DROPPED_BY, picked)]
        yield part, values, offsets, list(map(_DROPPED, picked)), by


def _json(keys: list[str]) -> str | None:
    """``keys`` as a JSON array for SQLite's json_each, or None where it would not read them
    back: a NUL (json_each ends the text there; an escaped backslash before ``u0000`` is taken
    for one too, harmlessly) or a lone surrogate (no UTF-8: the statement with marks says so)."""
    try:
        text = orjson.dumps(keys).decode() if orjson is not None else _stdlib_json(keys)
    except (TypeError, UnicodeEncodeError):
        return None
    return None if "\\u0000" in text else text


def _stdlib_json(keys: list[str]) -> str:
    text = json.dumps(keys, ensure_ascii=False)
    text.encode()  # a lone surrogate: UnicodeEncodeError
    return text
