"""Whole-batch event helpers give exactly what the per-event properties give: the same data
(integers beyond 64 bits exact), the same error naming a corrupt event."""

from __future__ import annotations

import sqlite3

import pytest

import eventlanes as el
from eventlanes.events import Event, datas, without_metadata

E = el.NewEvent
BIG = 123456789012345678901234567890


def test_datas_equal_each_events_data(tmp_path) -> None:
    store = el.open_store(f"sqlite:///{tmp_path}/e.db")
    store.append("s", [E("A", {"k": "é", "n": [1, {"x": None}]}), E("A", {"k": BIG}),
                       E("A", {"k": 2**63 - 1, "f": 1.5}), E("A", {})])  # fmt: skip
    batch = store.read(0, 10)
    want = [e.data for e in store.read(0, 10)]
    assert datas(batch, keep=False) == want
    assert want[1]["k"] == BIG and isinstance(want[1]["k"], int)
    assert datas(batch) == want and batch[0]._data == want[0]  # kept, as event.data keeps it
    assert datas(batch) == want  # already decoded
    assert without_metadata(batch)
    store.append("s", [E("A", {}, {"m": 1})])
    assert not without_metadata(store.read(0, 10))


def test_datas_name_a_corrupt_event(tmp_path) -> None:
    path = tmp_path / "c.db"
    store = el.open_store(f"sqlite:///{path}")
    store.append("s", [E("A", {"i": 1}), E("A", {"i": 2})])
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {store.events_table} SET data = '[1]' WHERE position = 2")
    batch = store.read(0, 10)
    with pytest.raises(el.CorruptEventError, match="not a JSON object") as failed:
        datas(batch)
    assert failed.value.position == 2
    good = Event(1, "s", 1, "A", '{"i": 1}', "{}", 0, 0)
    assert datas([good]) == [{"i": 1}]


def test_a_key_beyond_64_bits_is_exact_in_both_aggregations(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/k.db")
    declared = app.aggregation("d", key="k", on="A", fields={"n": el.count()})
    python = app.aggregation("p", key="k", initial=lambda: {"n": 0})

    @python.on("A")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1

    app.store.append("s", [E("A", {"k": BIG}), E("A", {"k": BIG + 1}), E("A", {"k": BIG})])
    app.start()
    try:
        app.wait_until_caught_up(30)
    finally:
        app.stop()
    for agg in (declared, python):
        assert agg.get(str(BIG)) == {"n": 2} and agg.get(str(BIG + 1)) == {"n": 1}
