"""Peak memory of an aggregation over many keys: its cached states are bounded by bytes
(``state_cache_bytes``), so peak memory stays flat as keys grow, far below a plain loop's.

1,000,000 events over 400,000 uniform keys, with the default budget and a smaller and a larger
one (the default's reason), and 4,000,000 events over 4,000,000 keys (every event a new key)
with the default budget; states written every 5 s (or earlier, when the changed states fill
the budget). Each run is a process of its own: its peak RSS is the kernel's high-water mark
(VmHWM), its growth that peak less the RSS once connected. A plain Python loop over the store
(a dict of sums) is the floor it is compared with; every run's stored states are checked
equal to the loop's (by a digest of every key's sum and count, so the check holds no dict of
millions of keys either).

``python benchmarks/run.py memory [--backend sqlite|postgres] [--quick]`` (quick: 200,000
events over 80,000 keys, and 400,000 over 400,000)
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import eventlanes as el
from eventlanes.processing.options import STATE_CACHE_BYTES

from .bench_spark import fill, plain_fold
from .common import StateWrites, databases, in_child, memory, print_table

MB = 2**20
#: (events, keys, budgets): the usual case with budgets around the default, then every event
#: a new key with the default
CASES = [(1_000_000, 400_000, (16 * MB, STATE_CACHE_BYTES, 256 * MB)),
         (4_000_000, 4_000_000, (STATE_CACHE_BYTES,))]  # fmt: skip
QUICK = [(200_000, 80_000, (16 * MB, STATE_CACHE_BYTES)),
         (400_000, 400_000, (STATE_CACHE_BYTES,))]  # fmt: skip
PERSIST_EVERY = 5.0


def _add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def _digest(totals: Any) -> tuple[int, int]:
    """How many keys, and a sum of a CRC of each (key, sum, count): equal for equal totals
    in any order, in every process (``hash`` of a string is not)."""
    crc = 0
    count = 0
    for key, (total, n) in totals:
        crc += zlib.crc32(f"{key}\0{total}\0{n}".encode())
        count += 1
    return count, crc


def _aggregate(conn: Any, url: str, name: str, budget: int) -> None:
    """In a child process: run aggregation ``name`` to the head; report memory and times."""
    app = el.App(url)
    app.aggregation(name, key="k", initial=lambda: {"sum": 0, "n": 0}, segments=1,
                    batch_size=5000, persist_every=PERSIST_EVERY,
                    state_cache_bytes=budget).on("Measured")(_add)  # fmt: skip
    app.store.head()  # connected: the baseline includes the driver and the pool
    before = memory()["VmRSS"]
    writes = StateWrites()
    start = time.perf_counter()
    app.start([name], observer=writes)
    app.wait_until_caught_up(7200, [name])
    seconds = time.perf_counter() - start
    app.stop()
    peak = memory()["VmHWM"]
    app.close()
    conn.send((before, peak, seconds, writes.writes))


def _plain(conn: Any, url: str) -> None:
    before = memory()["VmRSS"]
    start = time.perf_counter()
    totals = plain_fold(url)
    seconds = time.perf_counter() - start
    conn.send((before, memory()["VmHWM"], seconds, _digest(totals.items())))


def _stored(url: str, name: str) -> tuple[int, int]:
    """The digest of the states written, read row by row."""
    db = el.open_store(url).db
    try:
        sql = db.sql(f"SELECT key, value FROM {db.table('aggregates')} WHERE aggregation = ?")
        with db.connection() as conn:
            rows = conn.execute(sql, (name,))
            return _digest((k, (v["sum"], v["n"])) for k, raw in rows if (v := json.loads(raw)))
    finally:
        db.close()


def _mb(n: float) -> str:
    return f"{n / MB:,.0f} MB"


def run(backends: list[str], quick: bool = False) -> None:
    rows: list[list[Any]] = []
    with databases(backends) as dbs:
        for backend, new_url in dbs.items():
            for events, keys, budgets in QUICK if quick else CASES:
                url = new_url()
                fill(url, events, keys)
                before, peak, seconds, want = in_child(_plain, url)
                floor = peak - before
                label = f"{backend} {events / 1e6:g}M events, {keys / 1e3:,.0f}k keys"
                rows.append([label, "plain loop (floor)", _mb(peak), _mb(floor), "1.00x",
                             events / seconds, "", ""])  # fmt: skip
                for budget in budgets:
                    name = f"budget-{budget // MB}"
                    before, peak, seconds, writes = in_child(_aggregate, url, name, budget)
                    if _stored(url, name) != want:
                        raise AssertionError(f"{backend} {name}: states differ from a loop")
                    default = " (default)" if budget == STATE_CACHE_BYTES else ""
                    rows.append([label, f"state_cache_bytes {_mb(budget)}{default}", _mb(peak),
                                 _mb(peak - before), f"{(peak - before) / floor:.2f}x",
                                 events / seconds, writes, "equal"])  # fmt: skip
    print_table(
        f"aggregation of uniform keys, states written every {PERSIST_EVERY:g} s or when the "
        "changed ones fill the budget: peak RSS and its growth from the start (one process "
        "each), against a plain loop's",
        ["store", "run", "peak RSS", "growth", "growth vs loop", "events/s", "writes",
         "states"],
        rows,
    )  # fmt: skip
