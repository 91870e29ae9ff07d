"""Whole-batch event helpers give exactly what the per-event properties give: the same data
(integers beyond 64 bits exact), the same error naming a corrupt event."""

from __future__ import annotations

import sqlite3
import time

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


def test_datas_of_a_batch_partly_decoded_decode_the_rest(tmp_path) -> None:
    """A batch whose first events were decoded already (carried over from the last batch):
    the others are decoded and kept too, each equal to its ``event.data``."""
    store = el.open_store(f"sqlite:///{tmp_path}/e.db")
    store.append("s", [E("A", {"i": i, "k": f"k{i}"}) for i in range(6)] + [E("A", {"k": BIG})])
    batch = store.read(0, 10)
    want = [e.data for e in store.read(0, 10)]
    datas(batch[:3])  # decoded and kept: dicts now
    assert datas(batch[:6]) == want[:6]
    assert all(isinstance(e._data, dict) for e in batch[:6])  # the rest kept too
    assert datas(batch) == want and want[6]["k"] == BIG  # digits past 64 bits: by the stdlib


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


def test_a_key_beyond_64_bits_is_refused_alike_by_both_aggregations(tmp_path) -> None:
    """A number beyond 64 bits as a key is neither rounded nor merged with its text: both
    aggregations (declared, folded in SQLite, and Python) refuse it naming the event (keys are
    text: tests/test_keys.py), and fold nothing."""
    app = el.App(f"sqlite:///{tmp_path}/k.db")
    declared = app.aggregation("d", key="k", on="A", fields={"n": el.count()})
    python = app.aggregation("p", key="k", initial=lambda: {"n": 0})

    @python.on("A")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1

    app.store.append("s", [E("A", {"k": BIG}), E("A", {"k": BIG + 1}), E("A", {"k": BIG})])

    def errors(name: str) -> list[str]:
        return [s.last_error for s in app.status(name).segments if s.last_error]

    app.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (errors("d") and errors("p")):
            time.sleep(0.05)
    finally:
        app.stop()
    for agg in (declared, python):
        (error,) = errors(agg.name)
        assert f"the key is int {BIG}" in error and "a key must be a string" in error
        assert agg.get(str(BIG)) is None and agg.get(str(BIG + 1)) is None
