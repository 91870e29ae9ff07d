"""Aggregations over uniform keys: the local engine with a Python fold and with a declarative
aggregation (one process), and a Spark replay of the declarative aggregation from a Parquet
export on local[2] (warm), against a plain Python loop over the same store, in one run.
Every engine's states are checked equal to the plain loop's.

``python -m benchmarks.bench_aggregation [EVENTS] [--local-only] [--persist-every=S]`` (default
2,000,000 events, 50,000 keys); ``--local-only`` skips the Spark replay (no JVM, for quick local
iterations); ``--persist-every`` sets how often the local engine writes its states (default 1 s:
with 50,000 keys changing every second, that write is a sixth of the time). The declarative
aggregation runs twice: folded inside SQLite where exact (the default) and by rows
(``pushdown=False``)."""

from __future__ import annotations

import json
import shutil
import sys
import time

import eventlanes as el

from .bench_spark import first_and_warm, fresh_store, plain_fold, replays_in_subprocess
from .common import DATA, print_table

EVENTS, KEYS = 2_000_000, 50_000
PERSIST_EVERY = 1.0


def define(app: el.App, persist_every: float = PERSIST_EVERY) -> None:
    app.aggregation("fold", key="k", initial=lambda: {"sum": 0, "n": 0}, segments=1,
                    batch_size=5000, persist_every=persist_every).on("Measured")(add)  # fmt: skip
    app.aggregation("declared", key="k", on="Measured", fields={"sum": el.sum("v"),
                    "n": el.count()}, segments=1, batch_size=5000,
                    persist_every=persist_every)  # fmt: skip
    # The same, folded by rows in Python (the reference path), for the pushdown's ratio.
    app.aggregation("declared_rows", key="k", on="Measured", fields={"sum": el.sum("v"),
                    "n": el.count()}, segments=1, batch_size=5000,
                    persist_every=persist_every, pushdown=False)  # fmt: skip


def add(state: dict, event: el.Event) -> None:
    state["sum"] += event.data["v"]
    state["n"] += 1


def states(app: el.App, name: str) -> dict[str, tuple[int, int]]:
    sql = app.db.sql(f"SELECT key, value FROM {app.db.table('aggregates')} WHERE aggregation = ?")
    return {
        k: (v["sum"], v["n"]) for k, raw in app.db.query(sql, (name,)) if (v := json.loads(raw))
    }


def local(url: str, name: str, persist_every: float = PERSIST_EVERY) -> float:
    app = el.App(url)
    define(app, persist_every)
    start = time.perf_counter()
    app.start([name])
    app.wait_until_caught_up(3600, [name])
    seconds = time.perf_counter() - start
    app.stop()
    if states(app, name) != plain_fold(url):
        raise AssertionError(f"{name}: the local engine's states differ from a plain loop")
    return app.store.count() / seconds


def run(
    backends: list[str] | None = None,
    quick: bool = False,
    events: int | None = None,
    local_only: bool = False,
    persist_every: float = PERSIST_EVERY,
) -> None:
    events = events or (200_000 if quick else EVENTS)
    keys = min(KEYS, events // 4)
    DATA.mkdir(exist_ok=True)
    url = fresh_store("agg-bench.db", events, keys)
    start = time.perf_counter()
    want = plain_fold(url)
    loop = events / (time.perf_counter() - start)
    fold = local(url, "fold", persist_every)
    declared = local(url, "declared", persist_every)
    by_rows = local(url, "declared_rows", persist_every)
    rows: list[list[object]] = [
        ["plain Python loop over SQLite (baseline)", loop, "1.00x", ""],
        ["local engine, Python fold, 1 process", fold, f"{fold / loop:.2f}x", ">= 100,000"],
        ["local engine, declarative, 1 process (folded in SQLite)", declared,
         f"{declared / loop:.2f}x", ">= 300,000"],
        ["local engine, declarative, 1 process, pushdown=False (rows)", by_rows,
         f"{by_rows / loop:.2f}x", ""],
    ]  # fmt: skip
    title = f"aggregation of {events:,} events over {keys:,} uniform keys (events/s), one run"
    if persist_every != PERSIST_EVERY:
        title += f"; local states written every {persist_every:g} s"
    if local_only:
        print_table(title, ["path", "events/s", "vs plain loop", "target"], rows)
        return
    directory = DATA / "agg-bench-parquet"
    shutil.rmtree(directory, ignore_errors=True)
    store = el.open_store(url)
    el.spark.export_parquet(store, str(directory))
    store.close()
    runs = replays_in_subprocess(
        url, "local[2]", str(directory), module="benchmarks.bench_aggregation", name="declared"
    )
    first, warm = first_and_warm(runs)
    app = el.App(url)
    define(app)
    if states(app, "declared") != want:
        raise AssertionError("the Spark replay's states differ from a plain loop")
    print_table(
        title,
        ["path", "events/s", "vs plain loop", "target"],
        [
            *rows,
            ["Spark replay, declarative, Parquet, local[2], first", first,
             f"{first / loop:.2f}x", ""],
            ["Spark replay, declarative, Parquet, local[2], warm (median of runs 2-4)", warm,
             f"{warm / loop:.2f}x",
             ">= 1,000,000 and >= 4x"],
        ],
    )  # fmt: skip
    print("Spark replays, events/s in order:", ", ".join(f"{r:,.0f}" for r in runs))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    every = [float(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--persist-every=")]
    run(
        events=int(args[0]) if args else None,
        local_only="--local-only" in sys.argv[1:],
        persist_every=every[0] if every else PERSIST_EVERY,
    )
