"""The Spark fold's fast path (events without a source chain) against the general dedupe of
the local engine (``chains.coordinates``/``is_newer``/``record``), on random event mixes.
Pure Python on Arrow batches: no SparkSession."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eventlanes as el
from eventlanes.events import Event
from eventlanes.lineage import coordinates, is_newer, record
from eventlanes.processing.tables.states import Entry
from eventlanes.spark.fold import FoldSpec, fold_sorted
from eventlanes.spark.source import FIELDS

pa = pytest.importorskip("pyarrow")

STORE = "events"  # the store's own source name


def _fold(state: dict, event: Event) -> el.NewEvent:
    state["seen"].append(event.position)  # order-sensitive: the exact sequence folded
    return el.NewEvent("Out", {"d": event.position % 2})  # an output for the downstream stage


DOWN = FoldSpec("down", lambda e: str(e.data["d"]), dict, {}, [], STORE)  # keys are text
SPEC = FoldSpec("agg", lambda e: e.data["k"], lambda: {"seen": []}, {"T": [_fold]}, [], STORE,
                [DOWN])  # fmt: skip

chains = st.one_of(
    st.just("{}"),
    st.just('{"note": "source_chain"}'),  # the words, but no chain: still the event's own root
    st.builds(
        lambda source, partition, offset, out: json.dumps(
            {
                "source_chain": [
                    {"source": source, "partition": partition, "offset": offset, "out": out}
                ]
            }  # fmt: skip
        ),
        st.sampled_from([STORE, "up"]),
        st.sampled_from(["", "p1"]),
        st.integers(0, 30),
        st.integers(0, 1),
    ),
)
stored_offsets = st.dictionaries(
    st.sampled_from([STORE, "up"]),
    st.tuples(st.sampled_from(["", "p1"]), st.lists(st.integers(0, 30), min_size=1, max_size=2)),
    max_size=2,
)


def _copy(entry: Entry) -> Entry:
    """A deep copy (folds mutate the entries they are given), as the state table would load."""
    return Entry(json.loads(json.dumps(entry.value)), json.loads(json.dumps(entry.offsets)))


def _reference(
    rows: list[tuple[Any, ...]], stored: dict[str, Entry], outputs: list[tuple]
) -> dict[str, tuple]:
    """Per key (value, offsets, dropped) by the general dedupe; appends to ``outputs`` the
    (upstream source, position, path) of each output the downstream stage receives."""
    result: dict[str, Entry] = {}
    for row in rows:
        key = row[8]
        if key not in result:
            prior = stored.get(key)
            result[key] = _copy(prior) if prior else Entry(SPEC.initial())
        entry = result[key]
        event = Event(*row[:8])
        coords = coordinates(event, STORE)
        if not is_newer(entry.offsets, coords):
            entry.drop(coords[0])
            continue
        _fold(entry.value, event)
        outputs.append((f"agg:{key}", event.position, [*coords[2], 0]))
        record(entry.offsets, coords)
    return {k: (e.value, e.offsets, e.dropped, e.dropped_by) for k, e in result.items()}


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(st.tuples(st.sampled_from("abc"), chains), min_size=1, max_size=40),
    prior=st.dictionaries(st.sampled_from("ab"), stored_offsets, max_size=2),
    batch_size=st.integers(1, 7),
)
def test_fast_path_equals_the_general_dedupe(events, prior, batch_size) -> None:
    rows = [
        (pos, "s", pos, "T", json.dumps({"k": k}), meta, 0, 0, k)
        for pos, (k, meta) in enumerate(events, start=1)
    ]
    # Replays and re-appended outputs: the same positions again, in the sorted input.
    rows += [r for r in rows if r[0] % 3 == 0]
    rows.sort(key=lambda r: (r[8], r[0]))
    stored = {
        k: Entry({"seen": [-1]}, {s: [p, path] for s, (p, path) in offs.items()})
        for k, offs in prior.items()
    }
    names = [*FIELDS, "key"]
    chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    batches = [
        pa.RecordBatch.from_arrays([pa.array(c) for c in zip(*chunk, strict=True)], names)
        for chunk in chunks
    ]

    # ``load`` is handed fresh copies: the fold mutates the entries it is given.
    def load(keys: list[str]) -> dict[str, Entry]:
        return {k: _copy(e) for k, e in stored.items() if k in keys}

    # Bulk replays fold without stored states (``load`` None); continuous mode loads them.
    folded = fold_sorted(SPEC, iter(batches), load if prior else None)
    out = pa.Table.from_batches(list(folded)).to_pylist()
    got = {
        r["key"]: (
            json.loads(r["value"]),
            json.loads(r["offsets"]),
            r["dropped"],
            r["dropped_by"] and json.loads(r["dropped_by"]),
        )
        for r in out
        if r["kind"] == "state"
    }
    outputs: list[tuple] = []
    assert got == _reference(rows, stored, outputs)
    assert len([r for r in out if r["kind"] == "state"]) == len(got)  # one state row per key
    emitted = [(r["offsets"], r["position"], json.loads(r["path"])) for r in out
               if r["kind"] == "out"]  # fmt: skip
    assert sorted(emitted) == sorted(outputs)


@pytest.mark.parametrize("after", [0, 3])
@pytest.mark.parametrize("partitions", [1, 2, 4, 8])
def test_batch_read_partitions_cover_every_position_once(tmp_path, after, partitions) -> None:
    """Batch reads split the positions into contiguous ranges: together they read exactly
    the events of (after, until], whatever the count of partitions and events."""
    from eventlanes.spark.source import StoreReader, read_slice

    url = f"sqlite:///{tmp_path}/s.db"
    store = el.open_store(url)
    store.append("s", [el.NewEvent("T", {"i": i}) for i in range(11)])
    expected = [e.position for e in store.read(after=after, limit=100) if e.position <= 10]
    store.close()
    reader = StoreReader({"url": url, "after": str(after), "until": "10",
                          "partitions": str(partitions)})  # fmt: skip
    parts = reader.partitions()
    assert len(parts) <= partitions
    read = [p for part in parts for b in read_slice(url, part) for p in b.column(0).to_pylist()]
    assert read == expected


def test_export_overwrites_an_export_refuses_other_files_and_checks_the_store(tmp_path) -> None:
    from eventlanes.spark.export import MANIFEST, export_parquet, read_manifest

    store = el.open_store(f"sqlite:///{tmp_path}/a.db")
    store.append("s", [el.NewEvent("T", {"i": i}) for i in range(25)])
    out = tmp_path / "export"
    assert export_parquet(store, str(out), rows_per_file=10) == 25
    assert len(list(out.glob("*.parquet"))) == 3
    # Again, fewer files: none of the first export's may remain (a replay would read them).
    export_parquet(store, str(out), rows_per_file=100)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "events-00000.parquet"]
    import pyarrow.parquet as pq

    rows = pq.read_table(out).column("position").to_pylist()
    assert rows == list(range(1, 26))
    assert read_manifest(str(out), store)["end"] == 25

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "events-2024-q1.parquet").write_text("a user's file, named like ours")
    with pytest.raises(el.InvalidInputError, match="holds other files"):
        export_parquet(store, str(mine))
    assert sorted(p.name for p in mine.iterdir()) == ["events-2024-q1.parquet", "notes.txt"]

    shorter = el.open_store(f"sqlite:///{tmp_path}/b.db")  # ends before the export's end
    shorter.append("s", [el.NewEvent("T", {}) for _ in range(20)])
    with pytest.raises(el.InvalidInputError, match="does not match this store"):
        read_manifest(str(out), shorter)
    # A stray copy is not read: a replay reads exactly the files the manifest lists.
    (out / "events-00000 (1).parquet").write_bytes((out / "events-00000.parquet").read_bytes())
    # Paths are URIs: Spark reads them on executors the same way from any filesystem.
    assert read_manifest(str(out), store)["paths"] == [f"file://{out}/events-00000.parquet"]
    # A listed file lost or replaced by a shorter one: refused, or the replay would skip events.
    export_parquet(store, str(tmp_path / "short"), rows_per_file=10)
    (tmp_path / "short" / "events-00002.parquet").write_bytes(
        (tmp_path / "short" / "events-00000.parquet").read_bytes()  # 10 rows, not 5
    )
    with pytest.raises(el.InvalidInputError, match="events-00002.parquet has 10 rows"):
        read_manifest(str(tmp_path / "short"), store)
    (tmp_path / "short" / "events-00001.parquet").unlink()
    with pytest.raises(el.InvalidInputError, match="events-00001.parquet unreadable"):
        read_manifest(str(tmp_path / "short"), store)
    (out / MANIFEST).unlink()
    with pytest.raises(el.InvalidInputError, match="not a complete eventlanes export"):
        read_manifest(str(out), store)


def test_export_and_manifest_through_a_file_uri(tmp_path, monkeypatch) -> None:
    """file:// goes through the filesystem layer: no local folder named "file:", and a replay
    given the URI reads the same files."""
    from eventlanes.spark.export import MANIFEST, export_parquet, read_manifest

    monkeypatch.chdir(tmp_path)
    store = el.open_store(f"sqlite:///{tmp_path}/a.db")
    store.append("s", [el.NewEvent("T", {"i": i}) for i in range(12)])
    uri = f"file://{tmp_path}/exported"
    assert export_parquet(store, uri, rows_per_file=5) == 12
    assert not (tmp_path / "file:").exists()
    assert sorted(p.name for p in (tmp_path / "exported").iterdir()) == [
        MANIFEST, "events-00000.parquet", "events-00001.parquet", "events-00002.parquet"
    ]  # fmt: skip
    manifest = read_manifest(uri, store)
    assert manifest["events"] == 12
    assert manifest["paths"][0] == f"{uri}/events-00000.parquet"
    with pytest.raises(el.InvalidInputError, match="cannot open"):
        export_parquet(store, "nosuchscheme://bucket/x")


def test_engine_spark_says_what_it_runs_and_refuses_what_it_cannot(tmp_path) -> None:
    from eventlanes.spark.continuous import plan
    from tests.apps.cluster_app import define

    app = define(el.App(f"sqlite:///{tmp_path}/a.db"))
    assert plan(app, []) == (["totals", "by_function"], ["recorder"])
    assert plan(app, ["by_function"]) == (["by_function"], [])
    with pytest.raises(el.InvalidInputError, match="'recorder' is not one"):
        plan(app, ["totals", "recorder"])


def test_relative_sqlite_urls_resolve_locally_and_are_refused_on_clusters(tmp_path) -> None:
    from eventlanes.spark.ship import executor_url

    assert executor_url("sqlite:///ev.db?prefix=x_", "local[2]").startswith("sqlite:////")
    assert executor_url("sqlite:///ev.db?prefix=x_", "local[2]").endswith("/ev.db?prefix=x_")
    assert executor_url(f"sqlite:///{tmp_path}/ev.db", "yarn") == f"sqlite:///{tmp_path}/ev.db"
    for master in ("spark://h:7077", "yarn", "k8s://https://h"):
        with pytest.raises(el.InvalidInputError, match="relative SQLite path"):
            executor_url("sqlite:///ev.db", master)
