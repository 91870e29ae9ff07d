"""Aggregation states read and written in bulk (``StateTable``): keys read by the chunk (one
JSON array on SQLite, one array parameter on PostgreSQL), rows staged and upserted by one
statement on PostgreSQL; the same rows and the same JSON texts as one statement per key."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import eventlanes as el
from eventlanes.errors import InvalidInputError
from eventlanes.processing.tables.states import (
    CHUNK,
    LOAD_CHUNK,
    STAGED_FROM,
    Entry,
    StateTable,
    decode,
    decode_all,
    encode,
)

#: keys SQL or JSON might read differently: quotes, marks of both drivers, escapes, unicode
ODD_KEYS = [
    "'; DROP TABLE el_aggregates; --",
    '" OR 1=1 --',
    "?",
    "%s",
    "$1",
    "a\\b",
    "\\u0000 as text",  # a backslash and 'u0000': not a NUL
    "tab\there",
    "new\nline",
    "\x01\x1f",
    "\u2028",
    "é",
    "日本語",
    "😀 emoji",
    "\U0010ffff",
    "",
    " ",
    "[1, 2]",
    '{"k": 1}',
    "null",
]


def _table(url: str) -> tuple[el.App, StateTable]:
    app = el.App(url)
    return app, app.aggregate_states


def _stored(app: el.App, name: str) -> dict[str, tuple[str, str, int]]:
    """Every row of ``name`` as its texts: (value, offsets, dropped)."""
    sql = app.db.sql(
        f"SELECT key, value, offsets, dropped FROM {app.db.table('aggregates')} "
        "WHERE aggregation = ?"
    )
    return {k: (v, o, d) for k, v, o, d in app.db.query(sql, (name,))}


def _entries(keys: list[str], salt: int = 0) -> dict[str, Entry]:
    return {
        k: Entry({"sum": i * 7 + salt, "n": i % 5, "k": k}, {"events": ["", [i + 1]]}, i % 3)
        for i, k in enumerate(keys)
    }


def test_more_keys_than_a_chunk_are_written_and_read_back_exactly(store_url: str) -> None:
    """A save of more states than CHUNK (and than STAGED_FROM: staged on PostgreSQL) and a load
    of more keys than LOAD_CHUNK, among them odd keys and keys that have no row."""
    app, table = _table(store_url)
    keys = [f"k{i}" for i in range(LOAD_CHUNK + 2 * CHUNK)] + ODD_KEYS
    assert len(keys) > LOAD_CHUNK > CHUNK >= STAGED_FROM
    entries = _entries(keys)
    with app.db.transaction() as conn:
        table.save(conn, "bulk", entries)
    want = {k: (encode(e.value), encode(e.offsets), e.dropped) for k, e in entries.items()}
    assert _stored(app, "bulk") == want  # the same texts as one statement per key writes
    missing = [f"missing {i}" for i in range(50)]
    asked = sorted(keys + missing, reverse=True)  # any order
    with app.db.connection() as conn:
        got = table.load(conn, "bulk", asked)
    assert {k: (e.value, e.offsets, e.dropped) for k, e in got.items()} == {
        k: (e.value, e.offsets, e.dropped) for k, e in entries.items()
    }
    assert table.get("bulk", "'; DROP TABLE el_aggregates; --") == entries[ODD_KEYS[0]].value
    assert table.get("bulk", "missing 1") is None
    app.close()


def test_a_second_save_updates_every_row_and_creates_new_ones(store_url: str) -> None:
    app, table = _table(store_url)
    old = [f"k{i}" for i in range(2 * CHUNK)]
    first = _entries(old)
    with app.db.transaction() as conn:
        table.save(conn, "again", first)
    both = old[CHUNK:] + [f"new{i}" for i in range(CHUNK + 5)] + ODD_KEYS
    changed = _entries(both, salt=1000)
    with app.db.transaction() as conn:
        table.save(conn, "again", changed, keys=set(both))
    stored = _stored(app, "again")
    assert len(stored) == len(set(old) | set(both))
    for key in both:
        assert stored[key][0] == encode(changed[key].value)
    for key in old[:CHUNK]:  # not among the keys saved: as first written
        assert stored[key][0] == encode(first[key].value)
    app.close()


def test_a_state_that_would_not_read_back_equal_fails_the_whole_write(store_url: str) -> None:
    """The bad state is in a later chunk: the chunks before it were sent already, and the
    transaction's rollback leaves every stored row as it was."""
    app, table = _table(store_url)
    keys = [f"k{i:05d}" for i in range(3 * CHUNK)]
    with app.db.transaction() as conn:
        table.save(conn, "strict", _entries(keys))
    before = _stored(app, "strict")
    changed = _entries(keys + ["zz new"], salt=5)
    bad = keys[2 * CHUNK + 10]
    changed[bad].value[1] = "an int key"  # JSON would make it "1"
    refused = pytest.raises(InvalidInputError, match=rf"aggregation 'strict', key '{bad}'")
    with refused, app.db.transaction() as conn:
        table.save(conn, "strict", changed)
    assert _stored(app, "strict") == before
    with app.db.transaction() as conn:  # the connection (and its staging table) still works
        table.save(conn, "strict", {"zz new": Entry({"n": 1})})
    assert table.get("strict", "zz new") == {"n": 1}
    app.close()


def test_texts_are_those_of_encode_for_every_kind_of_state(store_url: str) -> None:
    """Values whose text the stdlib writes (NaN, infinities, integers beyond 64 bits, "null" in
    a string) and nested ones: stored as :func:`encode` writes them, read back equal."""
    app, table = _table(store_url)
    values: dict[str, Any] = {
        "nan": {"x": math.inf, "y": -math.inf},
        "big": {"n": 2**70, "neg": -(2**65)},
        "nineteen digits": {"n": 1234567890123456789},
        "null text": {"s": "null", "none": None},
        "nested": {"a": [1, [2, [3, {"b": 'é\n\t"\\'}]]], "f": 1.5},
        "unicode digits": {"s": "١٢٣٤٥٦٧٨٩٠١٢٣٤٥٦٧٨٩٠"},
        "plain": 7,
    }
    keys = [f"{name} {i}" for i in range(STAGED_FROM) for name in values]
    entries = {k: Entry(values[k.rsplit(" ", 1)[0]], {}, 0) for k in keys}
    with app.db.transaction() as conn:
        table.save(conn, "kinds", entries)
    stored = _stored(app, "kinds")
    assert {k: v for k, (v, _, _) in stored.items()} == {
        k: encode(e.value) for k, e in entries.items()
    }
    with app.db.connection() as conn:
        got = table.load(conn, "kinds", keys)
    for key, entry in entries.items():
        assert got[key].value == entry.value
        assert type(got[key].value) is type(entry.value)
    assert got["big 0"].value["n"] == 2**70  # not a float
    app.close()


def test_lock_creates_missing_rows_and_keeps_existing_ones(store_url: str) -> None:
    app, table = _table(store_url)
    existing = [f"k{i}" for i in range(STAGED_FROM)]
    with app.db.transaction() as conn:
        table.save(conn, "stage", _entries(existing))
    before = _stored(app, "stage")
    keys = existing + [f"fresh{i}" for i in range(STAGED_FROM + 1)] + ODD_KEYS
    with app.db.transaction() as conn:
        got = table.lock(conn, "stage", keys, lambda: {"ok": 0})
    assert set(got) == set(keys)
    stored = _stored(app, "stage")
    for key in existing:
        assert stored[key] == before[key]
    for key in set(keys) - set(existing):
        assert stored[key][:2] == ('{"ok":0}', "{}") and got[key].value == {"ok": 0}
    app.close()


def test_two_writes_in_one_transaction_and_encoded_rows(store_url: str) -> None:
    """Two aggregations saved in one transaction (PostgreSQL: the staging table emptied between
    them); rows encoded elsewhere (Spark), one key twice: the last."""
    app, table = _table(store_url)
    first, second = _entries([f"a{i}" for i in range(CHUNK + 1)]), _entries(ODD_KEYS)
    second.update(_entries([f"b{i}" for i in range(STAGED_FROM)]))
    with app.db.transaction() as conn:
        table.save(conn, "first", first)
        table.save(conn, "second", second)
    assert set(_stored(app, "first")) == set(first)
    assert set(_stored(app, "second")) == set(second)
    rows: list[tuple[str, str, str, int, str | None]] = [
        (f"e{i}", f'{{"i":{i}}}', "{}", i, None) for i in range(CHUNK + 3)
    ]
    rows.append(("e0", '{"i":"last"}', "{}", 9, '{"up":9}'))
    with app.db.transaction() as conn:
        table.save_encoded(conn, "encoded", rows)
    stored = _stored(app, "encoded")
    assert len(stored) == CHUNK + 3
    assert stored["e0"] == ('{"i":"last"}', "{}", 9)
    assert stored["e5"] == ('{"i":5}', "{}", 5)
    with app.db.connection() as conn:
        loaded = table.load(conn, "encoded", ["e0", "e5"])
    assert (loaded["e0"].dropped_by, loaded["e5"].dropped_by) == ({"up": 9}, None)
    assert table.dropped_by("encoded") == {"up": 9}
    app.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_pipelined_transaction_writes_without_staging(store_url: str) -> None:
    """COPY has no pipeline mode: a pipelined transaction's write is one statement per row."""
    app, table = _table(store_url)
    entries = _entries([f"k{i}" for i in range(STAGED_FROM + 5)] + ODD_KEYS)
    with app.db.transaction(pipeline=True) as conn:
        table.save(conn, "piped", entries)
    assert {k: v for k, (v, _, _) in _stored(app, "piped").items()} == {
        k: encode(e.value) for k, e in entries.items()
    }
    app.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_keys_json_each_cannot_carry_are_read_by_marks(store_url: str) -> None:
    """A NUL (SQLite's JSON ends the text there) and a lone surrogate (no UTF-8): read with a
    mark per key, as before."""
    app, table = _table(store_url)
    keys = ["a\x00b", "a", "b"]
    with app.db.transaction() as conn:
        table.save(conn, "nul", _entries(keys))
    with app.db.connection() as conn:
        assert set(table.load(conn, "nul", keys + ["a\x00c"])) == set(keys)
        assert set(table.load(conn, "nul", ["a\x00b", *ODD_KEYS])) == {"a\x00b"}
        with pytest.raises(UnicodeEncodeError):  # as binding it has always raised
            table.load(conn, "nul", ["\ud800"])
    app.close()


def test_decode_all_reads_as_decode() -> None:
    texts = [
        '{"n":12345678901234567890}',  # beyond 64 bits: the stdlib reads it
        '{"n":1234567890123456789}',
        "NaN",
        '{"x":Infinity}',
        '{"s":"١٢٣٤٥٦٧٨٩٠١٢٣٤٥٦٧٨٩٠"}',
        "[1,2.5,null,true]",
        '"text"',
    ]
    for i in range(len(texts)):
        for part in (texts[i:], texts[i : i + 1], [t for t in texts if "N" not in t]):
            got, want = decode_all(part), [decode(t) for t in part]
            assert json.dumps(got) == json.dumps(want)  # NaN != NaN: compared as text
            assert [type(v) for v in got] == [type(v) for v in want]
    assert decode_all([]) == []
