"""Bulk reads straight into Arrow (``scan_arrow``: ADBC, PostgreSQL through binary COPY) give
exactly what the row scan gives, on both backends: unicode, integers beyond 64 bits, metadata,
segment and type filters, empty ranges, ranges past PostgreSQL's gaps; invalid UTF-8 fails
alike; the reads open read-only and stop at PostgreSQL's visibility horizon. Typed columns
parsed in C equal Python's reading or are not taken. Spark's count of what it read still fails
a replay that read another set of events."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import eventlanes as el
from eventlanes.columnar.json import declared
from eventlanes.errors import CorruptEventError
from eventlanes.spark.export import typed_arrays, typed_columns
from eventlanes.store.arrow import FIELDS
from tests.conftest import mounted_tmpfs

E = el.NewEvent
UNICODE = ["é", "漢字", "🎉 party", "Ω≈ç√", "tab\tand\nnewline", 'q"uote\\', "\u2028", "ü" * 50]


def rows_of(batches: Any) -> list[tuple[Any, ...]]:
    table = pa.Table.from_batches(list(batches), schema=pa.schema(
        [(n, t) for n, t in zip(FIELDS, [pa.int64(), pa.string(), pa.int64(), pa.string(),
                                         pa.string(), pa.string(), pa.int64(), pa.int64()],
                                strict=True)]))  # fmt: skip
    return list(zip(*(table.column(n).to_pylist() for n in FIELDS), strict=True))


def scanned(store: el.EventStore, after: int, until: int, segments: Any = None) -> list:
    return [r for rows in store.scan(after, until, segments, chunk=7) for r in rows]


def fill(store: el.EventStore) -> None:
    rng = random.Random(7)
    for i in range(12):
        batch = []
        for j in range(9):
            data: dict[str, Any] = {"i": i * 9 + j, "s": rng.choice(UNICODE),
                                    "big": rng.choice([2**70, -(2**65) - 3, 2**63, 5]),
                                    "f": rng.random(), "o": {"n": [1, {"x": None}]}}  # fmt: skip
            meta = rng.choice([{}, {"who": "ü"}, {"source_chain": [{"source": "up",
                               "partition": "", "offset": i, "out": 0}]}])  # fmt: skip
            batch.append(E(rng.choice(["A", "B", "Ç"]), data, meta))
        store.append(f"stream-{rng.choice(UNICODE)}-{i % 5}", batch)


def test_scan_arrow_equals_the_row_scan(store: el.EventStore) -> None:
    fill(store)
    if store.db.backend == "postgresql":  # gaps: positions an aborted append took
        with pytest.raises(RuntimeError), store.db.transaction() as conn:
            store.append("gone", [E("A", {"x": 1})] * 20, conn=conn)
            raise RuntimeError("rolled back")
        fill(store)
    head = store.head()
    all_rows = scanned(store, 0, head)
    assert len(all_rows) == store.count() > 100
    positions = [r[0] for r in all_rows]
    if store.db.backend == "postgresql":
        gap = next(p for p, q in zip(positions, positions[1:], strict=False) if q - p > 1)
        assert rows_of(store.scan_arrow(gap, gap + 20)) == []  # inside the gap: nothing
        assert rows_of(store.scan_arrow(gap - 3, gap + 25)) == scanned(store, gap - 3, gap + 25)
    for after, until in [(0, head), (5, 50), (17, 18), (30, 30), (head, head), (60, 12)]:
        assert rows_of(store.scan_arrow(after, until)) == scanned(store, after, until)
    for segments in ([(1, 3)], [(0, 1)], [(0, 3), (3, 3)], [(5, 7)]):
        got = rows_of(store.scan_arrow(0, head, segments))
        assert got == scanned(store, 0, head, segments) and got
    by_type = rows_of(store.scan_arrow(0, head, types=["Ç", "B"]))
    assert by_type == [r for r in all_rows if r[3] in ("Ç", "B")] and by_type
    part = pa.Table.from_batches(list(store.scan_arrow(0, head, columns=["data", "type"])))
    assert part.column_names == ["position", "type", "data"]
    assert list(zip(*(part.column(n).to_pylist() for n in part.column_names), strict=True)) == [
        (r[0], r[3], r[4]) for r in all_rows
    ]
    with pytest.raises(el.InvalidInputError, match="unknown event columns"):
        list(store.scan_arrow(0, head, columns=["data; DROP TABLE x"]))
    decoded = el.Event(*rows_of(store.scan_arrow(0, 1))[0])
    assert decoded.data == store.read(0, 1)[0].data and decoded.data["big"] in (2**70,
        -(2**65) - 3, 2**63, 5)  # fmt: skip
    with pytest.raises(el.InvalidInputError):
        list(store.scan_arrow(0, head, types="A"))
    with pytest.raises(el.InvalidInputError):
        list(store.scan_arrow(-1, head))


@pytest.mark.parametrize(
    ("stream", "data", "meta", "reason"),
    [
        ("'s'", "CAST(x'7b22ff223a317d' AS TEXT)", "'{}'", "data is not valid UTF-8"),
        ("'s'", "'{}'", "CAST(x'ff' AS TEXT)", "metadata is not valid UTF-8"),
        ("CAST(x'61ff' AS TEXT)", "'{}'", "'{}'", "stream_id is not valid UTF-8"),
        ("CAST(x'61ff' AS TEXT)", "CAST(x'ff' AS TEXT)", "'{}'",
         "stream_id and data are not valid UTF-8"),
    ],
)  # fmt: skip
def test_invalid_utf8_fails_the_arrow_scan_as_the_row_scan(
    tmp_path: Path, stream: str, data: str, meta: str, reason: str
) -> None:
    store = el.open_store(f"sqlite:///{tmp_path}/u.db")
    store.append("before", [E("A", {"n": 1})] * 3)
    with store.db.transaction() as conn:
        conn.execute(f"INSERT INTO el_events VALUES (4, {stream}, 1, 'T', {data}, {meta}, 0, 7)")
    store.append("after", [E("B")])
    with pytest.raises(CorruptEventError) as rows:
        scanned(store, 0, 5)
    with pytest.raises(CorruptEventError) as arrow:
        list(store.scan_arrow(0, 5))
    assert arrow.value.position == rows.value.position == 4
    assert str(arrow.value) == str(rows.value) and reason in str(arrow.value)
    assert rows_of(store.scan_arrow(0, 3)) == scanned(store, 0, 3)  # the rows before: fine
    # Rows that are not JSON objects are read as they are: their readers fail on them.
    with store.db.transaction() as conn:
        conn.execute("INSERT INTO el_events VALUES (6, 'x', 1, 'T', '[1, 2]', 'null', 0, 7)")
    assert rows_of(store.scan_arrow(5, 6)) == scanned(store, 5, 6)
    store.close()


def test_arrow_reads_are_read_only(store_url: str) -> None:
    store = el.open_store(store_url)
    store.append("s", [E("A")])
    conn = store.arrow_connection()  # type: ignore[attr-defined]
    cur = conn.cursor()
    with pytest.raises(Exception, match="(?i)read-?only"):
        cur.execute(f"DELETE FROM {store.events_table}")
    cur.close()
    conn.close()
    assert store.count() == 1
    store.close()


def test_arrow_scan_of_a_store_on_a_read_only_file_system(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "mnt", "16m") as mnt:
        store = el.open_store(f"sqlite:///{mnt}/r.db")
        store.append("s", [E("A", {"n": i}) for i in range(5)])
        store.close()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        before = {p.name: p.read_bytes() for p in mnt.iterdir()}
        reader = el.open_store(f"sqlite:///{mnt}/r.db", create=False)
        assert [r[0] for r in rows_of(reader.scan_arrow(0, 5))] == [1, 2, 3, 4, 5]
        reader.close()
        assert {p.name: p.read_bytes() for p in mnt.iterdir()} == before


def test_arrow_scan_never_passes_the_visibility_horizon(pg_url: str) -> None:
    url = f"{pg_url}?prefix=hz_{random.randrange(10**9)}_"
    store = el.open_store(url)
    store.append("a", [E("A")] * 3)
    other = el.open_store(url)  # before the transaction: its schema check would wait for it
    with store.db.transaction() as conn:  # an append in flight below the next one
        [pending] = store.append("slow", [E("S")], conn=conn)
        [later] = other.append("fast", [E("F")])
        assert store.head() == 3 < pending < later
        with pytest.raises(el.InvalidInputError, match="visibility horizon"):
            list(other.scan_arrow(0, later))
        assert [r[0] for r in rows_of(other.scan_arrow(0, other.head()))] == [1, 2, 3]
        other.close()
    assert [r[0] for r in rows_of(store.scan_arrow(0, store.head()))] == [1, 2, 3, 4, 5]
    store.close()


# -- typed columns parsed in C --------------------------------------------------------------
EDGE = [
    '{"k": "a", "v": 1}', '{"k": "b", "v": -9223372036854775808, "w": 1.5}',
    '{"v": 9223372036854775808}', '{"v": 123456789012345678901234567890}', '{"v": 1.0}',
    '{"v": 1e2}', '{"v": -0}', '{"v": "5"}', '{"v": true}', '{"v": null}', '{}',
    '{"v": {"x": 1}}', '{"v": [1]}', '{"v": 1, "v": 2}', '{"\\u0076": 7}', '{"v\\u0000": 1}',
    '{"k": "\\ud83d\\ude00"}', '{"k": "\\ud800"}', '{"k": "a\\nb\\"c\\/"}', '{"k": "é漢"}',
    '{"t": "2020-01-01T00:00:00"}', '{"t": "12:00"}', '{"f": NaN}', '{"f": 1e400}',
    '{"f": 2.5}', '{"f": 3}', '{"b": false}', '{"v": 1} ', ' {"v": 1}', '{"v": 1}{"v": 2}',
    '', 'null', '[1]', '5', '"x"', '{"v": 1,}', '{"v": 01}', "{'v': 1}", '{"v": 1} // c',
    '{"d": ' + "[" * 500 + "]" * 500 + "}", '{"k":\n"a"}', '{"k": "a\tb"}',
]  # fmt: skip


def reference(texts: list[str], kinds: dict[str, str]) -> dict[str, list[Any]] | None:
    """Python's reading (what the row path and Spark's from_json take), or None when it
    fails or a value is not of the declared type."""
    from eventlanes.processing.aggregating.declarative import convert

    out: dict[str, list[Any]] = {p: [] for p in kinds}
    event = el.Event(1, "s", 1, "T", "{}", "{}", 0, 0)  # named in the errors only
    types = {"long": int, "double": float, "string": str, "boolean": bool}
    for text in texts:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict):
            return None
        for p, k in kinds.items():
            value = data.get(p)
            if value is not None and k == "string" and not isinstance(value, str):
                return None  # declared() takes strings only: not a difference
            try:
                out[p].append(convert(value, types[k], p, event))
            except el.InvalidInputError:
                return None
    return out


@pytest.mark.parametrize("kinds", [{"k": "string", "v": "long"}, {"f": "double", "b": "boolean"},
                                   {"t": "string", "k": "string"}])  # fmt: skip
def test_declared_columns_equal_python_or_are_not_taken(kinds: dict[str, str]) -> None:
    rng = random.Random(3)
    plain = [t for t in EDGE if "v" in t or '"k"' in t or '"f"' in t or '"b"' in t]
    groups = [[t] for t in EDGE] + [rng.sample(EDGE, 6) for _ in range(200)]
    groups += [rng.sample(plain, 3) for _ in range(200)]
    taken = 0
    for texts in groups:
        got = declared(pa.array(texts, pa.string()), kinds)
        if got is None:
            continue
        taken += 1
        want = reference(texts, kinds)
        assert want is not None, texts
        for p in kinds:
            values = got[p].to_pylist()
            assert len(values) == len(texts)
            assert all(
                (a != a and b != b) or (a == b and type(a) is type(b))
                for a, b in zip(values, want[p], strict=True)
            ), (texts, p, values, want[p])
    assert taken > 20


def table_of(datas: list[str], metas: list[str]) -> tuple[list[tuple], Any]:
    rows = [(i + 1, "s", i + 1, "TU"[i % 2], d, m, 0, 0)
            for i, (d, m) in enumerate(zip(datas, metas, strict=True))]  # fmt: skip
    return rows, pa.table([pa.array(c) for c in zip(*rows, strict=True)], names=FIELDS)


def test_export_columns_typed_in_c_never_differ_from_the_reference() -> None:
    """Where the C path types a column, the Python reference types it alike with the same
    values; it may leave a property untyped the reference types (then replays parse it)."""
    rng = random.Random(11)
    typable = [t for t in EDGE if t.startswith("{") and t.endswith("}") and "\n" not in t]
    same = 0
    for n in range(300):
        datas = rng.sample(typable, rng.randrange(1, 6)) if n % 3 else [
            json.dumps({"k": f"k{rng.randrange(5)}", "v": rng.randrange(-9, 9),
                        "s": rng.choice(UNICODE), "f": rng.choice([0.5, 1.25, None])})
            for _ in range(8)]  # fmt: skip
        metas = [rng.choice(["{}", '{"source_chain": []}']) for _ in datas]
        rows, table = table_of(datas, metas)
        want_arrays, want = typed_columns(rows)
        got_arrays, got = typed_arrays(table)
        assert got["chained"] == want["chained"]
        assert got["columns"].items() <= want["columns"].items()
        if want["untyped"] is None:
            assert got["untyped"] is None or not got["columns"]
        else:
            assert set(got["untyped"]) == set(want["untyped"]) | (
                set(want["columns"]) - set(got["columns"])
            )
        for name in got_arrays:
            assert got_arrays[name].type == want_arrays[name].type
            a, b = got_arrays[name].to_pylist(), want_arrays[name].to_pylist()
            assert all((x != x and y != y) or x == y for x, y in zip(a, b, strict=True))
        same += got == want
    assert same > 150  # the usual data: the same columns


# -- Spark: what was read is counted -------------------------------------------------------
def test_a_replay_that_read_other_events_than_the_store_holds_writes_nothing(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Executors reading a stale copy of the store (one event short): the count of what they
    read differs from the store's, the replay fails before any write."""
    from eventlanes.spark import bulk_replay as bulk

    app = el.App(f"sqlite:///{tmp_path}/live.db")
    declared_agg = app.aggregation("d", key="k", on="T", fields={"n": el.count()})
    python_agg = app.aggregation("p", key="k", initial=lambda: {"n": 0})
    python_agg.on("T")(lambda s, e: s.__setitem__("n", s["n"] + 1))
    app.store.append("s", [E("T", {"k": f"k{i % 3}"}) for i in range(20)])
    app.store.db.close()
    shutil.copy(tmp_path / "live.db", tmp_path / "stale.db")
    stale = sqlite3.connect(tmp_path / "stale.db")
    stale.execute("DELETE FROM el_events WHERE position = 7")
    stale.commit()
    stale.close()
    monkeypatch.setattr(bulk, "executor_url", lambda url, master: f"sqlite:///{tmp_path}/stale.db")
    for name in ("d", "p"):
        with pytest.raises(el.SparkJobError, match="19 events but the store holds 20"):
            el.spark.replay(app, name, spark=spark)
        assert app.get(name).get("k0") is None
        assert all(s.position == 0 for s in app.status(name).segments)
    monkeypatch.undo()
    el.spark.replay(app, "d", spark=spark)
    assert declared_agg.get("k0") == {"n": 7}


def test_range_counts_replace_and_flag_disagreement() -> None:
    from eventlanes.spark.source import ReadCount, merge_reads

    reads = [(0, (5, ())), (0, (5, ())), (1, (3, ("T",)))]  # range 0 twice: replaces, not adds

    def count(reports: list, ranges: int) -> ReadCount:
        return ReadCount(None, ranges, merge_reads(reports))  # the count rows, as collected

    assert count(reads, 2).total() == 8 and count(reads, 2).chained_types() == {"T"}
    assert count(reads, 3).total() is None  # a range not read
    assert count([*reads, (1, (4, ("T",)))], 2).total() is None  # two reads of it disagree


def test_declared_replay_from_the_store_equals_the_python_fold(spark, store_url: str) -> None:
    """On both backends; some batches are not typed in C (a deep value: Spark parses them),
    one type has chained events (the second plan)."""
    from tests.test_declarative import FIELDS, by_hand, define, load, run, stored

    app = el.App(store_url, claim_timeout=5)
    define(app)
    load(app.store, 1500, seed=8)
    deep = {"robot": "r1", "n": 1, "deep": [[[[]]]] * 2, "nest": json.loads("[" * 450 + "]" * 450)}
    app.store.append("deep", [E("Fastened", deep)])
    run(app, ["python"])
    el.spark.replay(app, "declared", spark=spark)
    assert stored(app, "declared") == stored(app, "python")
    del FIELDS, by_hand


# -- Spark: the executors fold what they read (declarative, no source chains) ---------------
def deep_event(robot: str) -> el.NewEvent:
    """An event of ``Fastened`` whose data the C reader does not take (nested too deep)."""
    return E("Fastened", {"robot": robot, "n": 1, "status": "ok", "big": False,
                          "nest": json.loads("[" * 450 + "]" * 450)})  # fmt: skip


def event_batch(rows: list[tuple[str, dict]], start: int = 1) -> pa.RecordBatch:
    """Events ``(type, data)`` at positions from ``start``, as the store's Arrow reads give them."""
    from eventlanes.store.arrow import schema

    return pa.RecordBatch.from_pylist(
        [{"position": start + i, "stream_id": "s", "version": start + i, "type": t,
          "data": json.dumps(d), "metadata": "{}", "recorded_at": 0, "routing_hash": 0}
         for i, (t, d) in enumerate(rows)],
        schema=schema(),
    )  # fmt: skip


def with_first_big(state: dict, event: el.Event) -> None:
    """``by_hand`` of the declarative tests, and the first value of the boolean ``big``."""
    from tests.test_declarative import by_hand

    by_hand(state, event)
    if state["first_big"] is None:
        state["first_big"] = event.data["big"]


def no_chain_app(store_url: str, *names: str) -> el.App:
    """``declared`` (declarative) and Python folds ``names`` of the same fields, over events
    without source chains, and one batch the C reader does not take."""
    from tests.test_declarative import FIELDS, load

    fields = {**FIELDS, "first_big": el.first("big", bool)}
    app = el.App(store_url, claim_timeout=5)
    app.aggregation("declared", key="robot", on="Fastened", fields=fields)
    for name in names:
        agg = app.aggregation(
            name, key="robot", initial=lambda: {f: op.initial for f, op in fields.items()}
        )
        agg.on("Fastened")(with_first_big)  # fmt: skip
    load(app.store, 2400, seed=11, chains=False)
    app.store.append("deep", [deep_event("r1")])
    return app


def test_executor_folds_equal_spark_folding_the_events(spark, store_url: str) -> None:
    """The partials folded on the executors (in C), merged by Spark, give exactly the states
    of Spark folding every event, and of the Python fold; batches the C reader does not take
    (a deep value) are sent as events and merged with the rest."""
    from eventlanes.processing.aggregating.declarative import TYPES
    from eventlanes.spark.declarative import declared_plan
    from eventlanes.spark.source import Declared, read_events
    from tests.test_declarative import run, stored
    from tests.test_spark_export import collected

    app = no_chain_app(store_url, "python")
    decl = app.get("declared").declaration
    assert decl is not None
    kinds = {p: TYPES[t] for p, t in decl.columns.items()}
    fields = tuple((op.kind, op.field, op.where) for op in decl.fields.values())
    head = app.store.head()
    url, table = app.url, app.store.events_table
    events = read_events(spark, url, 0, head, 4, Declared(kinds, ("Fastened",)))[0]
    want, read = collected(declared_plan(decl, events, table, None, []))
    assert read == head
    for partitions in (1, 8):
        shape = Declared(kinds, ("Fastened",), fields, decl.key)
        df, counter = read_events(spark, url, 0, head, partitions, shape)
        got, read = collected(declared_plan(decl, df, table, None, []))
        assert read == head and counter.total() == head
        assert got == want
    run(app, ["python"])
    el.spark.replay(app, "declared", spark=spark)
    assert stored(app, "declared") == stored(app, "python")


def test_executor_folds_send_what_they_cannot_fold_as_events() -> None:
    """Per chunk: a row per key and one counting the other types; a batch with a value of
    another type or a missing key goes as events (Spark raises naming the event); a chunk
    whose sum may pass 64 bits goes as events too. Every event read is counted once."""
    from eventlanes.spark.source import Declared

    shape = Declared({"k": "string", "v": "long"}, ("T",), (("sum", "v", ()), ("count", None, ())),
                     "k")  # fmt: skip
    good = event_batch([("T", {"k": "a", "v": 1}), ("U", {}), ("T", {"k": "a", "v": 2}),
                        ("T", {"k": "b", "v": 5})])  # fmt: skip
    wrong = event_batch([("T", {"k": "a", "v": "7"})], start=5)
    keyless = event_batch([("T", {"v": 1})], start=6)
    huge = event_batch([("T", {"k": "c", "v": 2**62}), ("T", {"k": "c", "v": 2**62})], start=7)
    out = list(shape.batches(iter([good, wrong, keyless])))
    rows = [r for b in out for r in b.to_pylist()]
    partial = [r for r in rows if r["events"] is not None]
    events = [r for r in rows if r["events"] is None]
    assert sorted(r["position"] for r in events) == [5, 6]  # as read, for Spark to raise
    assert sum(r["events"] for r in partial) + len(events) == 6
    by_key = {r["data_k"]: r for r in partial if r["type"] == "T"}
    assert (by_key["a"]["f0"], by_key["a"]["f1"], by_key["a"]["position"]) == (3, 2, 3)
    assert (by_key["b"]["f0"], by_key["b"]["events"]) == (5, 1)
    assert [r["events"] for r in partial if r["type"] == ""] == [1]  # the "U" event
    rows = [r for b in shape.batches(iter([good, huge])) for r in b.to_pylist()]
    assert [r["position"] for r in rows] == [1, 2, 3, 4, 7, 8]  # the chunk, as events
    assert all(r["events"] is None for r in rows)
    # Chunks: every batch folded on its own when a chunk is one row.
    small = Declared(shape.kinds, shape.folded, shape.fields, "k", chunk_rows=1)
    rows = [r for b in small.batches(iter([good, good])) for r in b.to_pylist()]
    assert [r["data_k"] for r in rows if r["type"] == "T"] == ["a", "b", "a", "b"]


def test_a_fold_keyed_by_a_property_reads_its_keys_on_the_executors() -> None:
    """The events of the folded types only, each with its key where the property is a string
    read exactly; a batch where it is not (a number, a deep value) leaves the keys to Spark."""
    from eventlanes.spark.source import Keyed

    shape = Keyed("k", ("A", "B"))
    plain = event_batch([("A", {"k": "x"}), ("C", {"k": "y"}), ("B", {"k": "ü\"", "v": 1}),
                        ("A", {"v": 2})])  # fmt: skip
    numbered = event_batch([("A", {"k": 5}), ("A", {"k": "z"})])
    other = event_batch([("C", {"k": "w"})])
    out = [r for b in shape.batches(iter([plain, numbered, other])) for r in b.to_pylist()]
    assert [(r["type"], r["key"]) for r in out] == [
        ("A", "x"), ("B", 'ü"'), ("A", None),  # no key property: dropped by Spark, as before
        ("A", None), ("A", None),  # a number among the keys: Spark reads this batch's keys
    ]  # fmt: skip


def test_python_fold_replay_from_the_store_equals_the_local_engine(spark, store_url: str) -> None:
    """Keys read on the executors, and by Spark for the batches they do not take exactly."""
    from tests.test_declarative import run, stored

    app = no_chain_app(store_url, "local", "replayed")
    run(app, ["local"])
    result = el.spark.replay(app, "replayed", spark=spark)
    assert result.events == app.store.head()
    want = stored(app, "local")
    assert stored(app, "replayed") == want
    assert want["r1"][0]["events"] > 1


def test_an_arrow_scan_keeps_the_locks_of_the_process_other_connections(tmp_path: Path) -> None:
    """POSIX locks belong to the process: a second SQLite library in it (the ADBC driver bundles
    its own) closing its descriptor of the file drops the write lock the store's connection
    holds, and another process then writes beside it. Two writers at once is a malformed file
    (issue 30, item 19: seen once after Spark replays on one SQLite file)."""
    url = f"sqlite:///{tmp_path}/locks.db"
    store = el.open_store(url)
    store.append("s", [E("A", {"n": i}) for i in range(50)])
    other = (
        "import sqlite3, sys\n"
        f"c = sqlite3.connect({str(tmp_path / 'locks.db')!r}, timeout=0, isolation_level=None)\n"
        "try:\n    c.execute('BEGIN IMMEDIATE')\nexcept sqlite3.OperationalError as e:\n"
        "    sys.exit(str(e))\nprint('wrote')\n"
    )

    def another_process_writes() -> bool:
        done = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
        assert done.returncode == 0 or "locked" in done.stderr, done.stderr
        return done.returncode == 0

    with store.db.transaction() as conn:
        conn.execute(f"INSERT INTO {store.events_table} VALUES (51, 'w', 1, 'T', '{{}}', "
                     "'{}', 0, 7)")  # fmt: skip
        assert not another_process_writes()
        assert len(rows_of(store.scan_arrow(0, 50))) == 50
        assert not another_process_writes(), "the Arrow scan dropped the store's write lock"
    store.close()
    check = sqlite3.connect(tmp_path / "locks.db")
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert check.execute("SELECT count(*) FROM el_events").fetchone() == (51,)
