"""Peak memory of an aggregation whose state writes cover many keys: 1,000,000 events over
100,000 and 400,000 uniform keys, states written every 5 s (so each write covers most keys),
each run in a process of its own (its peak RSS is the kernel's high-water mark, VmHWM).

Two ways of writing the same states in one run, alternating: the state writes of the previous
release (every changed state encoded at once, then sent: ``OneShotStates`` below, kept here as
the comparison) and today's (encoded, checked and sent ``CHUNK`` states at a time, in the same
transaction). A plain Python loop over the store (a dict of sums) is the memory floor. Every
run's stored states are checked equal to the plain loop's.

``python benchmarks/run.py memory [--backend sqlite|postgres] [--quick]``
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time
from itertools import repeat
from typing import Any

import eventlanes as el
from eventlanes.observe import Observer
from eventlanes.processing.tables.states import CHUNK, StateTable, encode_all

from .bench_spark import fill, plain_fold
from .common import databases, print_table

EVENTS = 1_000_000
KEYS = (100_000, 400_000)
PERSIST_EVERY = 5.0
ROUNDS = 3  # runs of each way, alternating


class OneShotStates(StateTable):
    """The state write of the previous release: every state of the write encoded at once."""

    def save(self, conn: Any, name: str, entries: Any, keys: Any = None,
             encode_offsets: Any = None) -> None:  # fmt: skip
        chosen = sorted(entries) if keys is None else sorted(keys)
        picked = [entries[k] for k in chosen]
        values = encode_all([e.value for e in picked])
        if encode_offsets is not None:
            offsets = encode_offsets(chosen, picked)
        else:
            offsets = encode_all([e.offsets for e in picked])
        dropped = [e.dropped for e in picked]
        self._upsert_all(conn, zip(repeat(name), chosen, values, offsets, dropped, strict=False))


class _Writes(Observer):
    """Sums the state writes' seconds (the commits of an aggregation are its state writes)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.writes = 0

    def committed(self, processor: str, segment: str, seconds: float) -> None:
        self.seconds += seconds
        self.writes += 1


def _add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def _memory() -> dict[str, int]:
    """Current and peak resident memory of this process, in bytes."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found


def _aggregate(conn: Any, url: str, name: str, one_shot: bool) -> None:
    """In a child process: run aggregation ``name`` to the head; report memory and times."""
    app = el.App(url)
    app.aggregation(name, key="k", initial=lambda: {"sum": 0, "n": 0}, segments=1,
                    batch_size=5000, persist_every=PERSIST_EVERY).on("Measured")(_add)  # fmt: skip
    if one_shot:
        app.runtime.__dict__["states"] = OneShotStates(app.db)  # what the workers write with
    app.store.head()  # connected: the baseline includes the driver and the pool
    before = _memory()["VmRSS"]
    writes = _Writes()
    start = time.perf_counter()
    app.start([name], observer=writes)
    app.wait_until_caught_up(3600, [name])
    seconds = time.perf_counter() - start
    app.stop()
    peak = _memory()["VmHWM"]
    app.close()
    conn.send((before, peak, seconds, writes.seconds, writes.writes))


def _plain(conn: Any, url: str) -> None:
    before = _memory()["VmRSS"]
    start = time.perf_counter()
    totals = plain_fold(url)
    conn.send((before, _memory()["VmHWM"], time.perf_counter() - start, len(totals)))


def _child(target: Any, *args: Any) -> Any:
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs, *args))
    proc.start()
    result = mine.recv()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"benchmark child failed with exit code {proc.exitcode}")
    return result


def _stored(url: str, name: str) -> dict[str, tuple[int, int]]:
    db = el.open_store(url).db
    try:
        sql = db.sql(f"SELECT key, value FROM {db.table('aggregates')} WHERE aggregation = ?")
        rows = db.query(sql, (name,))
        return {k: (v["sum"], v["n"]) for k, raw in rows if (v := json.loads(raw))}
    finally:
        db.close()


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


def run(backends: list[str], quick: bool = False) -> None:
    events = 200_000 if quick else EVENTS
    key_counts = [k // 5 for k in KEYS] if quick else list(KEYS)
    rows: list[list[Any]] = []
    with databases(backends) as dbs:
        for backend, new_url in dbs.items():
            for keys in key_counts:
                url = new_url()
                fill(url, events, keys)
                want = plain_fold(url)
                floor = _child(_plain, url)
                runs: dict[bool, list[tuple[Any, ...]]] = {True: [], False: []}
                for i in range(ROUNDS):  # alternate: the machine's load changes
                    for one_shot in (True, False):
                        name = f"{'oneshot' if one_shot else 'chunked'}-{i}"
                        runs[one_shot].append(_child(_aggregate, url, name, one_shot))
                        if _stored(url, name) != want:
                            raise AssertionError(f"{backend} {name}: states differ from a loop")
                label = f"{backend} {keys // 1000}k keys"
                rows.append([label, "plain loop (floor)", _mb(floor[1]),
                             _mb(floor[1] - floor[0]), "", "", "", "", ""])  # fmt: skip
                base_growth = None
                for one_shot, how in ((True, "before: all at once"),
                                      (False, f"now: {CHUNK:,} at a time")):  # fmt: skip
                    got = runs[one_shot]
                    peak = statistics.median(r[1] for r in got)
                    growth = statistics.median(r[1] - r[0] for r in got)
                    rate = statistics.median(events / r[2] for r in got)
                    writing = statistics.median(r[3] for r in got)
                    if base_growth is None:
                        base_growth, base_rate, base_writing = growth, rate, writing
                    rows.append([label, how, _mb(peak), _mb(growth), rate, f"{writing:.2f}",
                                 f"{growth / base_growth:.2f}x", f"{rate / base_rate:.2f}x",
                                 f"{writing / base_writing:.2f}x"])  # fmt: skip
    print_table(
        f"aggregation of {events:,} events, states written every {PERSIST_EVERY:g} s: peak "
        f"memory, and growth from the start (median of {ROUNDS} runs each, alternating, one "
        "process each; writing s: the state writes' total)",
        ["store", "state writes", "peak RSS", "growth", "events/s", "writing s",
         "growth vs before", "events/s vs before", "writing vs before"],
        rows,
    )  # fmt: skip
