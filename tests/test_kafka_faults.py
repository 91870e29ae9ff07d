"""Kafka ingest through faults, with real processes and signals on a real broker (Tansu):
`run --processes N` workers killed with SIGKILL, the broker stopped with SIGSTOP; partitions
shared by fair share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
import pytest

import eventlanes as el
from tests.kafka_helpers import create_topic, high_watermarks, produce
from tests.processing_helpers import ask_workers_for_stacks, wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.kafka_app:app"
NAME = "readings-in"


def _run(url: str, bootstrap: str, topic: str, processes: int, **extra: str) -> subprocess.Popen:
    env = dict(os.environ)
    options = {"url": url, "bootstrap": bootstrap, "topic": topic, "claim_timeout": "1.5", **extra}
    env.update({f"EVENTLANES_TEST_KAFKA_{k.upper()}": v for k, v in options.items()})
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress",
         "--processes", str(processes), "--max-restarts", "10"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=90)
    return err


def _tokens(app: el.App) -> dict[int, int]:
    return {s.segment.id: s.position for s in app.tokens.status(NAME)}


def _workers(supervisor: subprocess.Popen) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(supervisor.pid).children():
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "spawn_main" in cmdline and child.status() != psutil.STATUS_ZOMBIE:
            found.append(child)  # not the resource tracker
    return found


def test_exactly_once_through_kills_and_a_stopped_broker(tmp_path, kafka_broker) -> None:
    """200,000 keyed records ingested by `run --processes 2`; one worker is SIGKILLed twice
    and the broker is stopped (SIGSTOP) for 10 s: every record is appended once, each key's
    events are in offset order, and every partition's token ends at its high watermark."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 4)
    keys, total = 2000, 200_000
    produce(b, topic, [(f"k{i % keys}", {"n": i // keys}, None) for i in range(total)])
    hw = high_watermarks(b, topic, 4)
    assert sum(hw.values()) == total
    url = f"sqlite:///{tmp_path}/s.db"
    app = el.App(url, claim_timeout=1.5)
    supervisor = _run(url, b, topic, 2, batch="2000")
    faults = []

    def progress() -> int:
        return sum(_tokens(app).values())

    def resumed_after(fault: str, start: float) -> None:
        """Seconds from the fault until every partition that was behind has moved on."""
        before = _tokens(app)

        def moved() -> bool:
            now = _tokens(app)
            return all(now[p] > before[p] or now[p] == hw[p] for p in hw)

        wait_for(moved, timeout=120, interval=0.05, what=f"every partition after {fault}")
        faults.append((fault, time.monotonic() - start))

    try:
        for fraction, fault in ((0.15, "kill"), (0.4, "stop"), (0.65, "kill")):
            wait_for(lambda f=fraction: progress() >= f * total, timeout=180, what=f"{fraction}")
            if fault == "kill":
                wait_for(lambda: len(_workers(supervisor)) == 2, timeout=60, what="2 workers")
                victim = _workers(supervisor)[0]
                victim.send_signal(signal.SIGKILL)
                resumed_after("worker SIGKILL", time.monotonic())
            else:
                kafka_broker.pause()
                try:
                    time.sleep(10)
                finally:
                    kafka_broker.resume()
                resumed_after("broker SIGSTOP 10 s (from SIGCONT)", time.monotonic())
        wait_for(lambda: _tokens(app) == hw, timeout=240, interval=0.2, what="tokens == hw")
    finally:
        kafka_broker.resume()
        err = _stop(supervisor)
    assert "restarting" in err.lower() or "restart" in err.lower(), err[-3000:]
    seen: dict[tuple[int, int], int] = defaultdict(int)
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in app.store.iter_events(batch_size=20_000):
        k = e.metadata["kafka"]
        seen[k["partition"], k["offset"]] += 1
        per_key[e.stream_id].append((e.data["n"], k["offset"]))
    doubled = sum(1 for c in seen.values() if c > 1)
    lost = total - len(seen)
    out_of_order = sum(
        1 for evs in per_key.values() for a, b_ in zip(evs, evs[1:], strict=False) if b_ <= a
    )
    for fault, seconds in faults:
        print(f"| {fault} | lost {lost} | doubled {doubled} | out of order {out_of_order} | "
              f"resumed in {seconds:.1f} s |")  # fmt: skip
    assert (lost, doubled, out_of_order) == (0, 0, 0)
    assert app.store.count() == total
    assert all([n for n, _ in evs] == list(range(len(evs))) for evs in per_key.values())
    assert _tokens(app) == hw


@pytest.mark.parametrize("backend", ["postgres"])
def test_partitions_shared_fairly_by_three_processes(store_url: str, kafka_broker) -> None:
    """Six partitions, `run --processes 3`: each worker holds two (fair share over the live
    nodes, no consumer group), and everything is ingested once."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 6)
    produce(b, topic, [(f"k{i % 60}", {"i": i}, None) for i in range(6000)])
    hw = high_watermarks(b, topic, 6)
    app = el.App(store_url, claim_timeout=1.5)
    supervisor = _run(store_url, b, topic, 3, batch="100")
    try:
        wait_for(lambda: _tokens(app) == hw, timeout=120, what="ingested")

        def shares() -> list[int]:
            owners: dict[str, int] = defaultdict(int)
            for s in app.tokens.status(NAME):
                if s.owner:
                    owners[s.owner] += 1
            return sorted(owners.values())

        wait_for(lambda: shares() == [2, 2, 2], timeout=60, what="two partitions each")
        assert len(app.tokens.live_nodes(NAME)) == 3
    finally:
        _stop(supervisor)
    assert sorted(e.data["i"] for e in app.store.iter_events()) == list(range(6000))


@pytest.fixture(scope="module")
def private_pg():
    """A PostgreSQL server of this module's own, to stop and start again."""
    from eventlanes.testing.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(fsync=False, max_connections=60)
    try:
        yield pg
    finally:
        pg.stop()


def test_ingest_through_a_postgres_restart(private_pg, kafka_broker) -> None:
    """The database is stopped (pg_ctl stop -m immediate) for 8 s while `run --processes 2`
    ingests: the workers wait and go on by themselves; every record is appended once, in
    offset order per key."""
    b = kafka_broker.bootstrap
    topic = create_topic(b, 4)
    total, keys = 30_000, 300
    produce(b, topic, [(f"k{i % keys}", {"n": i // keys}, None) for i in range(total)])
    hw = high_watermarks(b, topic, 4)
    url = f"{private_pg.url}?prefix=k{os.getpid()}_"
    app = el.App(url, claim_timeout=1.5)
    supervisor = _run(url, b, topic, 2, batch="500")

    def progress() -> int:
        try:
            return sum(_tokens(app).values())
        except el.StoreConnectionError:  # the server is down: not yet
            return 0

    try:
        wait_for(lambda: progress() >= 0.2 * total, timeout=180, what="20% ingested")
        private_pg.halt("immediate")
        time.sleep(8)
        private_pg.start()
        back = time.monotonic()
        before = wait_for(progress, timeout=60, what="the database to answer")
        wait_for(lambda: progress() > before or progress() == total, timeout=120,
                 what="progress after the restart")  # fmt: skip
        print(f"| PostgreSQL stopped 8 s | resumed {time.monotonic() - back:.1f} s after start |")
        try:
            wait_for(lambda: progress() == total, timeout=240, interval=0.2, what="all ingested")
        except AssertionError as exc:  # where each partition stood, and the run's log
            tokens = _tokens(app)
            ask_workers_for_stacks(supervisor)  # into the log: where the workers are
            log = _stop(supervisor)
            raise AssertionError(f"{exc}: tokens {tokens} of {hw}; the run's log:\n"
                                 f"{log[-16000:]}") from None  # fmt: skip
        assert supervisor.poll() is None, "the workers must wait for the database, not exit"
    finally:
        err = _stop(supervisor)
    assert "worker" not in err or "restarting" not in err, err[-2000:]  # none died
    per_key: dict[str, list[int]] = defaultdict(list)
    offsets = set()
    for e in app.store.iter_events(batch_size=20_000):
        offsets.add((e.metadata["kafka"]["partition"], e.metadata["kafka"]["offset"]))
        per_key[e.stream_id].append(e.data["n"])
    assert app.store.count() == total == len(offsets)
    assert all(ns == list(range(len(ns))) for ns in per_key.values())
    assert _tokens(app) == hw
