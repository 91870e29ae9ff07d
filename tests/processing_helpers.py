"""Helpers for processor tests: appending load, checking a recorded projection."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import eventlanes as el


def serial_pk(db) -> str:
    """An auto-incrementing primary key: the order rows were written in."""
    return (
        "INTEGER PRIMARY KEY AUTOINCREMENT" if db.backend == "sqlite" else "BIGSERIAL PRIMARY KEY"
    )


def append_load(store: el.EventStore, streams: int, events: int, seed: int = 0) -> None:
    """``events`` events spread at random over ``streams`` streams, in batches."""
    rng = random.Random(seed)
    left = events
    while left:
        n = min(left, rng.randint(1, 5))
        store.append(
            f"s-{rng.randrange(streams)}", [el.NewEvent("Step", {"n": i}) for i in range(n)]
        )
        left -= n


def handled_rows(app: el.App, table: str) -> list[tuple[str, int, int]]:
    return [
        tuple(r)
        for r in app.db.query(f"SELECT stream_id, version, position FROM {table} ORDER BY id")
    ]


def assert_exactly_once_in_order(app: el.App, table: str) -> int:
    """Every event of the store handled exactly once, each stream's events in version order."""
    rows = handled_rows(app, table)
    counts = Counter(pos for _, _, pos in rows)
    doubled = [p for p, c in counts.items() if c > 1]
    assert not doubled, f"{len(doubled)} events handled twice, e.g. {doubled[:5]}"
    expected = {e.position for e in app.store.iter_events(batch_size=10_000)}
    missing = expected - set(counts)
    assert not missing, f"{len(missing)} events never handled, e.g. {sorted(missing)[:5]}"
    last: dict[str, int] = {}
    for stream, version, _ in rows:
        assert version > last.get(stream, 0), f"{stream}: v{version} handled after v{last[stream]}"
        last[stream] = version
    return len(rows)


def worker_pids(supervisor: int) -> list[int]:
    """The worker processes of the ``run --processes`` supervisor ``supervisor`` (not its
    resource tracker, also a child). From /proc, stdlib only: Spark executors import this
    module."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
            if ppid == supervisor and b"spawn_main" in cmdline:
                pids.append(int(stat.parent.name))
    return pids


def ask_workers_for_stacks(supervisor: subprocess.Popen) -> None:
    """Ask each worker of a running ``run --processes`` for its threads' stacks (SIGUSR1:
    they write them to the log the supervisor's stderr carries), and give them a moment to.
    Workers only: SIGUSR1 would end the resource tracker."""
    for pid in worker_pids(supervisor.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kill_again_and_again(
    workers: list, spawn, busy, min_kills: int, pause: tuple[float, float], seed: int
) -> int:
    """SIGKILL a random worker process and start a new one, every ``pause`` seconds (random
    within the range), while ``busy()`` or until ``min_kills``; returns the kills."""
    import signal

    rng = random.Random(seed)
    kills = 0
    while busy() or kills < min_kills:
        time.sleep(rng.uniform(*pause))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        workers.append(spawn())
    return kills


def run_until_caught_up(
    app: el.App, timeout: float = 60.0, processors: list[str] | None = None
) -> None:
    """Start the app's processors (or ``processors``), wait until they have reached the
    store's head, and stop them, also when the wait fails."""
    app.start(processors)
    try:
        app.wait_until_caught_up(timeout, processors)
    finally:
        app.stop()


def context_in(app: el.App, conn: Any, processor: str = "test") -> el.Context:
    """A handler context in the transaction of ``conn`` on the app's database."""
    db = app.db
    return el.Context(processor, None, None, conn, db.backend, db.param, db.prefix)


class Logged:
    """A process whose stdout and stderr go to files, never to a pipe: a pipe nobody reads
    while the process runs fills at 64 KB and then blocks its writer (a Spark driver writes
    to stderr as it works; three continuous-runner tests waited on their first micro-batch
    so). ``out()`` and ``err()``: what it wrote so far."""

    def __init__(self, args: list[str], folder: Path, name: str, **popen: Any) -> None:
        self.paths = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.paths[0], "w") as out, open(self.paths[1], "w") as err:
            self.process = subprocess.Popen(args, stdout=out, stderr=err, text=True, **popen)

    def out(self) -> str:
        return self.paths[0].read_text(errors="replace")

    def err(self) -> str:
        return self.paths[1].read_text(errors="replace")

    def wait_working(self, predicate, what: str, quiet: float = 90.0, limit: float = 480.0):
        """``wait_for`` for a process that shows its progress as it works (a Spark driver
        redraws its stage bar): true once ``predicate`` is, failed when the process wrote
        nothing for ``quiet`` seconds (stuck) or after ``limit`` (too slow by far). On two
        cores shared with three other test workers, a micro-batch on the test cluster took
        over 120 s while its stages advanced: slow is not stuck."""
        start = last_change = time.monotonic()
        size = -1
        while True:
            result = predicate()
            if result:
                return result
            now = time.monotonic()
            grown = sum(p.stat().st_size for p in self.paths)
            if grown != size:
                size, last_change = grown, now
            if now - last_change > quiet or now - start > limit:
                raise AssertionError(
                    f"timed out waiting for {what}: {now - start:.0f} s in all, "
                    f"the process silent for {now - last_change:.0f} s"
                )
            time.sleep(0.1)
