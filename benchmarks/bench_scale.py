"""Many keys cost what their writes cost: a declarative aggregation catching up on 2,000,000
events over 20,000 keys and over 1,000,000 uniform keys (``--quick``: 200,000 events, 2,000
and 100,000 keys), in one run, alternating, each catch-up in a process of its own (its peak
RSS is the kernel's high-water mark). Target: many keys at least half the events/s of few.
Every run's stored states are checked equal to a plain Python loop's.

``python benchmarks/run.py scale [--backend sqlite|postgres] [--quick]``, or
``python -m benchmarks.bench_scale [--backend sqlite|postgres] [--quick] [--rounds N]``.

Not :func:`.common.databases`: it empties ``bench-data`` at its start and end, other runs'
stores among them; this one keeps its SQLite stores in a temporary folder of its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import eventlanes as el

from .bench_spark import fill, plain_fold
from .common import StateWrites, in_child, memory, print_table

EVENTS, KEYS = 2_000_000, (20_000, 1_000_000)
QUICK_EVENTS, QUICK_KEYS = 200_000, (2_000, 100_000)
ROUNDS = 2  # catch-ups of each size, alternating
TARGET = 0.5


def define(app: el.App, name: str) -> None:
    """The aggregation of issue 31, with the library's defaults."""
    app.aggregation(name, key="k", on="Measured", fields={"sum": el.sum("v"), "n": el.count()})


def catch_up(url: str, name: str) -> tuple[float, float, float]:
    """Run ``name`` to the head: (seconds, of which state writes, events handled)."""
    app = el.App(url)
    define(app, name)
    app.store.head()  # connected: the pool's start is not timed
    writes = StateWrites()
    start = time.perf_counter()
    app.start([name], observer=writes)
    app.wait_until_caught_up(7200, [name])
    seconds = time.perf_counter() - start
    app.stop()
    events = app.store.count()
    app.close()
    return seconds, writes.seconds, events


def _child_main(conn: Any, url: str, name: str) -> None:
    conn.send((*catch_up(url, name), memory()["VmHWM"]))


def stored(url: str, name: str) -> dict[str, tuple[int, int]]:
    db = el.open_store(url).db
    try:
        sql = db.sql(f"SELECT key, value FROM {db.table('aggregates')} WHERE aggregation = ?")
        return {
            k: (v["sum"], v["n"]) for k, raw in db.query(sql, (name,)) if (v := json.loads(raw))
        }
    finally:
        db.close()


def _forget(url: str, name: str) -> None:
    """Delete a checked run's states, so every run writes into a table of the same size."""
    db = el.open_store(url).db
    try:
        table = db.table("aggregates")
        with db.transaction() as conn:
            conn.execute(db.sql(f"DELETE FROM {table} WHERE aggregation = ?"), (name,))
        if db.backend == "postgresql":
            with db.connection() as conn:
                conn.execute(f"VACUUM ANALYZE {table}")
    finally:
        db.close()


@contextmanager
def stores(backend: str) -> Iterator[Callable[[], str]]:
    """Fresh store URLs on ``backend`` (PostgreSQL: $EVENTLANES_TEST_POSTGRES_URL or an
    embedded server, fsync on, as :func:`.common.databases`)."""
    here = Path(tempfile.mkdtemp(prefix="eventlanes-scale-"))
    server = None
    try:
        if backend == "sqlite":
            yield lambda: f"sqlite:///{here / uuid.uuid4().hex}.db"
        else:
            from eventlanes.testing.postgres import server_url

            base, server = server_url(fsync=True)
            sep = "&" if "?" in base else "?"
            yield lambda: f"{base}{sep}prefix=s{uuid.uuid4().hex[:10]}_"
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(here, ignore_errors=True)


def _measure(backend: str, events: int, sizes: tuple[int, ...], rounds: int) -> list[list[Any]]:
    runs: dict[int, list[tuple[float, float, float, int]]] = {k: [] for k in sizes}
    with stores(backend) as new_url:
        urls = {keys: new_url() for keys in sizes}
        wants = {}
        for keys, url in urls.items():
            fill(url, events, keys)
            wants[keys] = plain_fold(url)
        for i in range(rounds):  # alternating: the machine's load changes
            for keys, url in urls.items():
                name = f"scale-{i}"
                got = in_child(_child_main, url, name)
                if got[2] != events:
                    raise AssertionError(f"{backend}: {got[2]} events in the store, not {events}")
                if stored(url, name) != wants[keys]:
                    raise AssertionError(f"{backend} {keys:,} keys: states differ from a loop")
                runs[keys].append(got)
                _forget(url, name)
                print(f"{backend} {keys:,} keys, run {i + 1}: {events / got[0]:,.0f} ev/s",
                      flush=True)  # fmt: skip
    few = statistics.median(events / r[0] for r in runs[sizes[0]])
    rows = []
    for keys in sizes:
        rate = statistics.median(events / r[0] for r in runs[keys])
        writing = statistics.median(r[1] for r in runs[keys])
        peak = statistics.median(r[3] for r in runs[keys])
        many = keys == sizes[-1]
        rows.append([backend, f"{keys:,}", rate, f"{writing:.1f}", f"{peak / 2**20:,.0f} MB",
                     f"{rate / few:.2f}x", f">= {TARGET}x" if many else "",
                     ("met" if rate / few >= TARGET else "NOT MET") if many else ""])  # fmt: skip
    return rows


def run(backends: list[str], quick: bool = False, rounds: int = ROUNDS) -> None:
    events = QUICK_EVENTS if quick else EVENTS
    sizes = QUICK_KEYS if quick else KEYS
    rows = [row for backend in backends for row in _measure(backend, events, sizes, rounds)]
    print_table(
        f"declarative aggregation catching up on {events:,} events (median of {rounds} runs "
        "each, alternating, one process each; states checked equal to a plain loop)",
        ["backend", "keys", "events/s", "writing s", "peak RSS", "vs fewest keys", "target",
         ""],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    run(args.backend or ["sqlite", "postgres"], quick=args.quick, rounds=args.rounds)
