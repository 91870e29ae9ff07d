"""What a Parquet export stores for cheap replays (typed data columns, chained types), and
that replays using it keep their meaning: declarative states equal to the Python fold (skewed
keys, republished duplicates), strict types naming the event, every row counted, the store
checked against the export before anything is written; data decoded once for Python folds."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import eventlanes as el
from eventlanes.events import Event
from eventlanes.spark.export import MANIFEST, merge_typed, typed_columns
from eventlanes.spark.fold import decoded_data
from tests.test_declarative import FIELDS, define, load, run, stored

E = el.NewEvent


def manifest(directory) -> dict:
    return json.loads((directory / MANIFEST).read_text())


def collected(plan: Any) -> tuple[dict[str, tuple[str, str, int, str | None]], int]:
    """A declarative plan's states as key -> (value, offsets, dropped, dropped_by) JSON texts,
    and the rows it read (a null key's row counts the other types: no state)."""
    rows = plan.toArrow().to_pylist()
    cols = ("value", "offsets", "dropped", "dropped_by")
    states = {r["key"]: tuple(r[c] for c in cols) for r in rows if r["key"] is not None}
    return states, sum(r["rows"] for r in rows)


def test_export_types_a_property_only_where_one_type_holds(tmp_path) -> None:
    store = el.open_store(f"sqlite:///{tmp_path}/e.db")
    first = [
        {"k": "a", "v": 1, "m": 1, "x": 1, "b": True, "f": 0.5, "o": {"y": 1}},
        {"k": "b", "v": None, "m": 2, "x": 1.5, "b": False, "f": 1.25, "big": 2**70},
    ]
    second = [{"k": "c", "m": "three", "b": True}, {"k": 4, "f": None, "new": "n"}]
    store.append("s", [E("A", d) for d in first])
    store.append("t", [E("A", second[0]), E("Re", second[1], {"source_chain": [{"source": "u"}]})])
    out = tmp_path / "export"
    el.spark.export_parquet(store, str(out), rows_per_file=2)
    found = manifest(out)
    # k: strings and an integer; m: int in one file, str in the other; x: int and float;
    # big: beyond 64 bits; o: nested. v is absent from the second file (read as null there).
    assert found["columns"] == {"b": "boolean", "f": "double", "new": "string", "v": "long"}
    assert found["chained_types"] == ["Re"]
    table = pq.read_table(out / "events-00000.parquet")
    assert table.column("data_v").to_pylist() == [1, None]
    assert table.column("data_f").to_pylist() == [0.5, 1.25]
    assert "data_k" in table.column_names  # typed in this file, not in the whole export
    store.close()


def test_a_row_whose_data_is_not_an_object_leaves_every_property_json_only() -> None:
    row = (1, "s", 1, "A", '{"k": "a"}', "{}", 0, 0)
    arrays, info = typed_columns([row, (2, "s", 2, "A", "not json", "{}", 0, 0)])
    assert arrays == {} and info["untyped"] is None
    good_arrays, good = typed_columns([row])
    assert list(good_arrays) == ["data_k"] and good["columns"] == {"k": "string"}
    assert merge_typed([good, info]) == ({}, [])
    assert merge_typed([good]) == ({"k": "string"}, [])


def test_data_decoded_once_gives_what_the_event_would_decode() -> None:
    texts = ['{"a": 1}', '{"big": 123456789012345678901}', "not json", "[]", "{}", "", None]
    got = decoded_data(pa.array(texts, pa.string()), texts)
    assert got[0] == {"a": 1} and got[4] == {}
    assert got[1:4] == texts[1:4] and got[5:] == ["", None]  # the text: Event decodes it
    for value, text in zip(got, texts, strict=True):
        lazy = Event(1, "s", 1, "A", text, "{}", 0, 0)
        eager = Event(1, "s", 1, "A", value, "{}", 0, 0)
        assert eager.corrupt == lazy.corrupt
        if lazy.corrupt is None:
            assert eager.data == lazy.data
    assert Event(1, "s", 1, "A", got[1], "{}", 0, 0).data["big"] == 123456789012345678901
    assert decoded_data(pa.array(texts[:1], pa.string()), texts[:1]) == [{"a": 1}]


def test_declared_replay_from_an_export_equals_the_python_fold(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/d.db", claim_timeout=5)
    declared, python = define(app)
    load(app.store, 3000, seed=7)  # skewed keys, republished duplicates, other types
    run(app, ["python"])
    export = tmp_path / "export"
    end = el.spark.export_parquet(app.store, str(export), rows_per_file=700)
    columns = manifest(export)["columns"]
    # The plan takes some properties from typed columns and parses the others (t holds
    # integers and floats: JSON only).
    assert {"robot", "n", "v", "s", "status", "big"} <= set(columns) and "t" not in columns
    load(app.store, 300, seed=8)  # after the export: the live processor folds these
    result = el.spark.replay(app, "declared", spark=spark, parquet=str(export))
    assert result.end == end and result.events == 3000
    assert stored(app, "declared") != {}
    run(app, ["declared", "python"])
    assert stored(app, "declared") == stored(app, "python")
    assert declared.dropped() == python.dropped() > 0


def test_a_typed_column_of_another_type_fails_the_replay_naming_the_event(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/t.db")
    agg = app.aggregation("t", key="robot", on="F", fields={"n": el.sum("n")})
    app.store.append("s", [E("F", {"robot": "7", "n": "1"}), E("F", {"robot": "7", "n": "2"})])
    export = tmp_path / "export"
    el.spark.export_parquet(app.store, str(export))
    assert manifest(export)["columns"] == {"n": "string", "robot": "string"}
    with pytest.raises(el.FieldTypeError, match=r"event 1 \(F\): data property 'n' is \"1\", "
                       "declared int"):  # fmt: skip
        el.spark.replay(app, "t", spark=spark, parquet=str(export))
    assert agg.get("7") is None and all(s.position == 0 for s in app.status("t").segments)
    # Mixed types in the export: no column, the JSON parse is strict as ever.
    app.store.append("s", [E("F", {"robot": "7", "n": 3})])
    el.spark.export_parquet(app.store, str(export))
    assert "n" not in manifest(export)["columns"]
    with pytest.raises(el.SparkJobError):
        el.spark.replay(app, "t", spark=spark, parquet=str(export))
    assert agg.get("7") is None
    # An integer key from its typed column is refused, as the local engine refuses it (keys
    # are text: tests/test_keys.py), and nothing is written.
    fine = el.App(f"sqlite:///{tmp_path}/k.db")
    ok = fine.aggregation("k", key="robot", on="F", fields={"n": el.sum("n"), "c": el.count()})
    fine.store.append("s", [E("F", {"robot": 7, "n": 2}), E("F", {"robot": 7, "n": 3})])
    el.spark.export_parquet(fine.store, str(tmp_path / "k"))
    with pytest.raises(el.InvalidInputError, match="a key must be a string"):
        el.spark.replay(fine, "k", spark=spark, parquet=str(tmp_path / "k"))
    assert ok.get("7") is None


def test_the_plan_counts_every_row_it_read_and_a_stale_export_writes_nothing(
    spark, tmp_path
) -> None:
    from eventlanes.spark.declarative import declared_plan
    from eventlanes.spark.source import SCHEMA

    app = el.App(f"sqlite:///{tmp_path}/c.db")
    agg = app.aggregation("c", key="robot", on="F", fields=FIELDS)
    app.store.append("s", [E("F" if i % 3 else "Other", {"robot": f"r{i % 4}", "n": i})
                           for i in range(30)])  # fmt: skip
    export = tmp_path / "export"
    el.spark.export_parquet(app.store, str(export))
    df = spark.read.schema(SCHEMA + ", data_robot string, data_n long").parquet(str(export))
    decl = agg.declaration
    assert decl is not None
    columns = manifest(export)["columns"]
    states, read = collected(declared_plan(decl, df.where("position > 5"), "x", columns, []))
    assert read == 25 and set(states) == {"r0", "r1", "r2", "r3"}  # the other type counted
    # An export the store does not match (here: of another store) is refused before any write.
    other = el.App(f"sqlite:///{tmp_path}/o.db")
    other.aggregation("c", key="robot", on="F", fields=FIELDS)
    other.store.append("s", [E("F", {"robot": "r", "n": 1})])
    with pytest.raises(el.InvalidInputError, match="does not match this store"):
        el.spark.replay(other, "c", spark=spark, parquet=str(export))
    assert other.get("c").get("r") is None
    assert all(s.position == 0 for s in other.status("c").segments)
