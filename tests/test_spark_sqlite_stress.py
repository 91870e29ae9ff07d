"""Spark replays of a projection and an aggregation and Parquet exports, round after round,
against one SQLite file while a thread of the same process appends to it: every round reads
what it says, writes it once, and the file stays whole (``PRAGMA integrity_check``).

A malformed store is the worst outcome there is. It was seen once (issue 30, item 19): the
executors and the driver read the file through a second SQLite library (the ADBC driver's),
whose closing dropped the POSIX locks of the process's own connections, so two writers wrote
at once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter

import pyarrow.parquet as pq

import eventlanes as el
from tests.apps.recorder import clear, create_schema, record

E = el.NewEvent
ROUNDS = 3


def count(state: dict, event: el.Event) -> None:
    state["n"] += 1


def test_replays_and_exports_leave_one_sqlite_file_whole(spark, tmp_path) -> None:
    path = tmp_path / "stress.db"
    app = el.App(f"sqlite:///{path}", claim_timeout=5)
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=lambda: {"n": 0})
    totals.on_any(count)
    proc = app.processor("recorder", segments=2)
    proc.on_any(record)
    proc.on_reset(clear)
    table = create_schema(app)
    for i in range(600):
        app.store.append(f"s-{i % 23}", [E("Step")])

    stop = threading.Event()
    appended: list[int] = []

    def append() -> None:  # a writer in the driver's process, beside the replays' reads
        writer = el.open_store(f"sqlite:///{path}")
        try:
            while not stop.is_set():
                writer.append(f"s-{len(appended) % 23}", [E("Step")] * 5)
                appended.append(5)
                stop.wait(0.02)  # SQLite queues no writers: a loop without a pause starves them
        finally:
            writer.close()

    thread = threading.Thread(target=append, daemon=True)
    thread.start()
    try:
        for round_ in range(ROUNDS):
            export = tmp_path / f"export-{round_}"
            end = el.spark.export_parquet(app.store, str(export))
            exported = pq.read_table(export, columns=["position"]).column(0).to_pylist()
            assert sorted(exported) == list(range(1, end + 1))
            replayed = el.spark.replay(app, "totals", spark=spark)
            read = app.store.read(0, limit=replayed.end)
            assert len(read) == replayed.events == replayed.end
            expected = Counter(e.stream_id for e in read)
            assert {k: totals.get(k)["n"] for k in expected} == expected
            projected = el.spark.replay(app, "recorder", spark=spark)
            positions = [p for (p,) in app.db.query(f"SELECT position FROM {table} ORDER BY id")]
            assert sorted(positions) == list(range(1, projected.end + 1)), f"round {round_}"
            check = sqlite3.connect(path)
            try:
                assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            finally:
                check.close()
    finally:
        stop.set()
        thread.join(30)
    assert sum(appended) > 0, "the writer never wrote beside the replays"
    app.close()
