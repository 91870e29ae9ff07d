"""Scaling on lag, safely: the autoscaler of tests/autoscaler.py starts and SIGTERMs real
`eventlanes run` worker processes, 1 -> 4 -> 1, on the lag it reads from their metrics, while
events arrive at a steady rate. Nothing is lost, doubled or handled out of order (per key),
every worker stops within the grace, the others take its segments over at once (released,
not left to expire), four workers share the segments evenly, and the lag ends at zero.

The run prints its table (pytest -s): phase, workers, seconds, events appended, lag, lost,
doubled, out of order, stop times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import eventlanes as el
from tests.apps.scaling_app import create_schema
from tests.autoscaler import Autoscaler
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.scaling_app:app"
RATE = 40  # events a second, steady: one worker keeps up with it, not with the backlog
BACKLOG = 2_000  # what the first worker finds: four workers drain it
STREAMS = 40
CLAIM_TIMEOUT = 10.0  # a claim left behind would block its segment this long


class Producer(threading.Thread):
    """Appends RATE events a second, one per append, round the streams."""

    def __init__(self, store: el.EventStore) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.done = threading.Event()
        self.appended = 0

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.is_set():
            due = int((time.monotonic() - start) * RATE)
            while self.appended < due:
                n = self.appended
                self.store.append(f"s-{n % STREAMS}", [el.NewEvent("Placed", {"n": n})])
                self.appended += 1
            self.done.wait(0.02)


def _owners(app: el.App) -> list[str | None]:
    return [s.owner for s in app.status("orders").segments]


def test_scale_out_and_in_on_lag_loses_nothing(store_url: str, tmp_path: Path) -> None:
    app = el.App(store_url, claim_timeout=CLAIM_TIMEOUT)
    app.processor("orders", segments=4)
    table = create_schema(app)
    for i in range(BACKLOG // 20):
        app.store.append(f"s-{i % STREAMS}", [el.NewEvent("Placed", {"n": -1})] * 20)
    env = dict(os.environ, EVENTLANES_TEST_SCALE_URL=store_url,
               EVENTLANES_TEST_SCALE_CLAIM_TIMEOUT=str(CLAIM_TIMEOUT))  # fmt: skip
    logs: list[Path] = []

    def spawn(port: int) -> subprocess.Popen:
        log = tmp_path / f"worker-{len(logs)}.log"
        logs.append(log)
        return subprocess.Popen(
            [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress",
             "--metrics-port", str(port), "--grace", "30"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"),
        )  # fmt: skip

    scaler = Autoscaler(spawn, "orders", target=250, max_workers=4, down_after=3.0)
    phases: list[dict] = []

    def phase(name: str) -> None:
        now = time.monotonic()
        # one read: an event committed between two reads would belong to neither phase
        head = app.store.committed_head()
        if phases:
            phases[-1].update(end=now, last=head)
        phases.append({"name": name, "start": now, "first": head + 1,
                       "workers": len(scaler.workers), "stops": []})  # fmt: skip

    def run_until(condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s: {scaler.log[-5:]}"
            scaler.step()
            time.sleep(0.5)

    producer = Producer(app.store)
    try:
        producer.start()
        phases.append({"name": "1 worker, backlog", "start": time.monotonic(), "first": 1,
                       "workers": 1, "stops": []})  # fmt: skip
        scaler.scale_to(1)
        run_until(lambda: len(scaler.workers) == 4, 40, "scale out to 4")

        phase("4 workers")
        grown = time.monotonic()
        # Fair share on growth: each of the four holds one segment (the autoscaler goes on).
        run_until(lambda: len(set(_owners(app)) - {None}) == 4, 30, "one segment each")
        phases[-1]["share_s"] = time.monotonic() - grown
        run_until(lambda: len(scaler.workers) == 1, 60, "scale in to 1")
        shrunk = scaler.signalled
        phases[-1]["stops"] = [w.stopped for w in scaler.stopped]

        phase("1 worker")
        # The segments of the workers that left are released, not left to expire: the one
        # left takes them all over well within the claim timeout.
        last = scaler.workers[0]
        wait_for(lambda: all(o is not None and f":{last.proc.pid}:" in o for o in _owners(app)),
                 CLAIM_TIMEOUT, what="the last worker to hold every segment")  # fmt: skip
        phases[-1]["takeover_s"] = time.monotonic() - shrunk
        steady = time.monotonic() + 4.0
        run_until(lambda: time.monotonic() > steady, 10, "one worker at the steady rate")
        assert len(scaler.workers) == 1  # it keeps up: no scaling back out

        phase("drain")
        producer.done.set()
        producer.join()
        # A lag read before the last append may say 0 with that event still to handle: only
        # a reading asked for after the producer stopped tells the backlog is gone.
        stopped = time.monotonic()
        run_until(lambda: bool(scaler.log) and scaler.log[-1][0] > stopped and
                  scaler.log[-1][1] == 0, 30, "lag back to 0")  # fmt: skip
        phases[-1]["lag_end"] = scaler.log[-1][1]
        scaler.scale_to(0)
        phases[-1]["stops"] = [scaler.stopped[-1].stopped]
        phase("end")
        phases.pop()
    finally:
        producer.done.set()
        scaler.scale_to(0)

    errors = {str(p): p.read_text()[-2000:] for p in logs}
    for worker in scaler.stopped:
        assert worker.code == 0, errors
        assert worker.stopped is not None and worker.stopped < 30.0, worker.stopped
    assert len(scaler.stopped) == 4  # 1 + 3 started, all stopped by SIGTERM

    # Nothing lost, nothing doubled, each stream in order: per phase, by the events' positions.
    rows = app.db.query(f"SELECT stream_id, version, position FROM {table} ORDER BY id")
    seen = Counter(pos for _, _, pos in rows)
    disorder: set[int] = set()
    last_version: dict[str, int] = defaultdict(int)
    for stream, version, position in rows:
        if version <= last_version[stream]:
            disorder.add(position)
        last_version[stream] = max(last_version[stream], version)
    positions = [e.position for e in app.store.iter_events(batch_size=10_000)]
    assert len(positions) == BACKLOG + producer.appended
    report = []
    for p in phases:
        mine = [q for q in positions if p["first"] <= q <= p.get("last", positions[-1])]
        lags = [
            lag
            for t, lag, _ in scaler.log
            if p["start"] <= t <= p.get("end", t) and lag is not None
        ]
        p.update(events=len(mine), lost=sum(1 for q in mine if seen[q] == 0),
                 doubled=sum(1 for q in mine if seen[q] > 1),
                 disorder=sum(1 for q in mine if q in disorder),
                 lag_max=max(lags, default=0),
                 seconds=p.get("end", time.monotonic()) - p["start"])  # fmt: skip
        report.append(p)
    print("\nphase              | workers | seconds | events | max lag | lost | doubled "
          "| out of order | stop times (s)")  # fmt: skip
    for p in report:
        stops = ", ".join(f"{s:.2f}" for s in p["stops"]) or "-"
        print(
            f"{p['name']:<18} | {p['workers']:>7} | {p['seconds']:>7.1f} | {p['events']:>6} | "
            f"{p['lag_max']:>7.0f} | {p['lost']:>4} | {p['doubled']:>7} | {p['disorder']:>12} | "
            f"{stops}"
        )
    print(
        f"fair share after growth: {phases[1]['share_s']:.1f} s; take-over after shrink: "
        f"{phases[2]['takeover_s']:.1f} s; lag at the end: {phases[3]['lag_end']:.0f}"
    )
    assert sum(p["events"] for p in report) == len(positions)
    assert all(p["lost"] == p["doubled"] == p["disorder"] == 0 for p in report), report
    assert set(seen) == set(positions) and max(seen.values()) == 1
    assert phases[3]["lag_end"] == 0 and app.status("orders").caught_up
    assert phases[2]["takeover_s"] < CLAIM_TIMEOUT / 2
    app.close()


def _held(app: el.App, owners: list[el.App]) -> list[int]:
    """Segments each app's runner holds, in the order given."""
    rows = app.status("orders").segments
    return [sum(1 for s in rows if s.owner == a._runners[0].owner) for a in owners]


def test_fair_share_gives_a_new_node_a_segment_when_the_others_hold_them_all(
    store_url: str,
) -> None:
    """Four segments, a third node arrives while two hold two each: before, each node's cap
    was ceil(4 / 3) = 2, so the two kept theirs and the third (started by a scale-out)
    idled for as long as they ran. One of them now gives a segment up: 2, 1, 1."""
    nodes = []
    for _ in range(3):
        node = el.App(store_url, claim_timeout=1.5)
        node.processor("orders", segments=4).on_any(lambda event, ctx: None)
        nodes.append(node)
    a, b, c = nodes
    try:
        a.start()
        wait_for(lambda: _held(a, [a]) == [4], 20, what="the first node to hold all four")
        b.start()
        wait_for(lambda: _held(a, [a, b]) == [2, 2], 20, what="two segments each")
        c.start()
        wait_for(lambda: sorted(_held(a, [a, b, c])) == [1, 1, 2], 15,
                 what="the third node to get a segment")  # fmt: skip
        time.sleep(3)  # and it stays so (no segment moves back and forth)
        assert sorted(_held(a, [a, b, c])) == [1, 1, 2]
    finally:
        for node in nodes:
            node.close()
