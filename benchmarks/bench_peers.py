"""The same tumbling count in eventlanes and in quixstreams (issue 33), over the same topic of
a Tansu broker started for the run: 200,000 records (``--quick``: 20,000) of 500 robots on 4
partitions, in time order, 10 ms apart, each record's Kafka timestamp its ``ts``. Each side
reads the topic from its beginning and counts records per robot per minute, one after the
other in one run: the seconds from its start to the first record read (quixstreams joins a
consumer group first) and to the last record folded, and records/s between the two.

* quixstreams (a kept peer; a virtualenv of its own in ``bench-data/``, made from the registry
  on first use: it pins confluent-kafka below 2.13): ``tumbling_window(1 min).count()
  .final()``, its RocksDB state, at-least-once and exactly-once (Kafka transactions);
* eventlanes: an ingestor that interleaves the partitions by time (``order="time"``) and a
  declared windowed count (``window=el.tumbling("1m")``, ``time=el.event_time("ts",
  unit="ms")``, ``lateness="30s"``) on SQLite, exactly once. (With the default order, the
  ingestor appends a backlog about a partition at a time and the store's clock calls most of
  the other partitions' records late: 103,500 of 200,000 at ``lateness="10m"``.)

Checked: every window eventlanes holds equals a plain loop's count over the records produced;
every window quixstreams emitted too (it emits closed windows only, so each key's last ones
are missing there, as its time stops with the topic).
``python benchmarks/run.py peers [--quick]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import eventlanes as el
from eventlanes.testing.kafka import TansuBroker

from .common import in_child, print_table

ROOT = Path(__file__).resolve().parent.parent
QUIX = "3.28.1"
VENV = ROOT / "bench-data" / "quixstreams-venv"
RECORDS, QUICK_RECORDS, ROBOTS, PARTITIONS = 200_000, 20_000, 500, 4
BASE_MS, STEP_MS = 1_767_225_600_000, 10


def quix_python() -> Path:
    """The Python of the quixstreams virtualenv, made on first use."""
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX}"],
                       check=True)  # fmt: skip
    return python


def produce(bootstrap: str, n: int) -> tuple[str, Counter[tuple[str, int]]]:
    """A topic of ``n`` records and the plain loop's count per (robot, minute start in ms)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"peers-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, num_partitions=PARTITIONS, config={"retention.ms": "-1"})
    for future in admin.create_topics([new]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 20})  # fmt: skip
    counts: Counter[tuple[str, int]] = Counter()
    for i in range(n):
        robot, ts = f"r{i % ROBOTS}", BASE_MS + i * STEP_MS
        counts[(robot, ts - ts % 60_000)] += 1
        value = json.dumps({"robot": robot, "ts": ts, "ok": i % 7 != 0}).encode()
        while True:
            try:
                producer.produce(topic, value, robot.encode(), timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return topic, counts


def ours(conn: Any, bootstrap: str, topic: str, n: int, folder: str) -> None:
    """eventlanes in a process of its own: (seconds to the first record ingested, to the last
    folded, windows as [robot, start_ms, count])."""
    app = el.App(f"sqlite:///{folder}/ours.db")
    app.ingest("in", el.Kafka(bootstrap), topic=topic, type="Screwed", batch_size=2000,
               order="time")  # fmt: skip
    agg = app.aggregation(
        "per-minute", key="robot", on="Screwed", fields={"n": el.count()},
        window=el.tumbling("1m"), time=el.event_time("ts", unit="ms"), lateness="30s",
        persist_every=0.5, retain="1d",
    )  # fmt: skip
    app.store.head()  # the schema made before the clock starts
    started, first = time.perf_counter(), None
    app.start()
    try:
        while (count := app.store.count()) < n:
            if count and first is None:
                first = time.perf_counter() - started
            time.sleep(0.02)
        app.wait_until_caught_up(600)
        seconds = time.perf_counter() - started
    finally:
        app.stop()
    windows = [[r, w.start_us // 1000, w.value["n"]] for r in (f"r{i}" for i in range(ROBOTS))
               for w in agg.windows(r)]  # fmt: skip
    counts = agg.window_counts()
    app.close()
    conn.send((first or 0.0, seconds, windows, counts))


def theirs(bootstrap: str, topic: str, folder: str, guarantee: str) -> dict[str, Any]:
    out = Path(folder) / f"quix-{guarantee}.json"
    subprocess.run(
        [str(quix_python()), str(Path(__file__).with_name("peer_quixstreams.py")),
         "--bootstrap", bootstrap, "--topic", topic, "--state-dir", f"{folder}/quix-{guarantee}",
         "--out", str(out), "--guarantee", guarantee],
        check=True, timeout=1800,
    )  # fmt: skip
    return json.loads(out.read_text())


def run(backends: list[str], quick: bool = False) -> None:
    del backends  # SQLite: the embedded default, as quixstreams' RocksDB is embedded
    n = QUICK_RECORDS if quick else RECORDS
    quix_python()
    rows = []
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as folder:
        topic, want = produce(broker.bootstrap, n)
        first, seconds, windows, counts = in_child(ours, broker.bootstrap, topic, n, folder)
        got = {(r, s): c for r, s, c in windows}
        diff = {w: (got.get(w), c) for w, c in want.items() if got.get(w) != c}
        assert got == dict(want), f"eventlanes' windows differ: {counts} {list(diff.items())[:5]}"
        base = n / (seconds - first)
        rows.append(["eventlanes (SQLite)", "exactly once", n, first, seconds, base, "1.00x"])
        for guarantee in ("at-least-once", "exactly-once"):
            result = theirs(broker.bootstrap, topic, folder, guarantee)
            emitted = {(k, s): c for k, s, _e, c in result["windows"]}
            assert result["read"] == n, f"quixstreams read {result['read']} of {n} records"
            assert emitted and all(want[w] == c for w, c in emitted.items()), (
                "quixstreams' windows differ from the plain loop's counts"
            )
            rate = n / (result["seconds"] - result["first"])
            rows.append([f"quixstreams {QUIX}", guarantee, n, result["first"],
                         result["seconds"], rate, f"{rate / base:.2f}x"])  # fmt: skip
    print_table(
        f"A tumbling 1-minute count per key over {n:,} records ({ROBOTS} keys, "
        f"{PARTITIONS} partitions), one run",
        [
            "system",
            "guarantee",
            "records",
            "s to the first",
            "s to the last",
            "records/s after the first",
            "vs eventlanes",
        ],
        [[s, g, r, f"{f:.2f}", f"{t:.2f}", rate, v] for s, g, r, f, t, rate, v in rows],
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(["sqlite"], quick=parser.parse_args().quick)
