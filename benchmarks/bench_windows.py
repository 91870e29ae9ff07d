"""Windowed aggregations against the same aggregation without windows, in one run (issue 33):
2,000,000 events over 50,000 keys (``--quick``: 200,000 over 5,000) on SQLite, ten minutes of
event time with a few seconds of disorder (some inputs late), each catch-up in a process of
its own:

* declarative ``{"sum", "n"}``: no window (the SQLite pushdown), tumbling 1 minute, hopping
  1 hour every 10 minutes (target 0.8x and 0.6x of no window);
* a Python fold ``{"sum", "n"}``: keyed, tumbling 1 minute (target 0.7x of keyed);
* sessions (a 5 s gap, both kinds; no target): the row path, each input joining its key's
  sessions.

With ``--spark``, each kind is also replayed on Spark (``local[2]``, the session started
before the clock runs): a windowed replay against the same replay without a window (target
0.8x). With ``--continuous``, the keyed, tumbling and session kinds are also kept up to date by
micro-batches of a tenth of the events each (``run --engine spark``; no target).

Every windowed run's window counts and late inputs are checked equal to a plain loop's (the
rules of ``eventlanes.windows.reference``); every keyed run's states too.
``python benchmarks/run.py windows [--quick]``, or
``python -m benchmarks.bench_windows [--quick] [--rounds N] [--spark] [--continuous]``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import eventlanes as el
from eventlanes.processing.windowing.clock import recorded_us

from .common import in_child, memory, print_table

EVENTS, KEYS = 2_000_000, 50_000
QUICK_EVENTS, QUICK_KEYS = 200_000, 5_000
SPAN_MS = 600_000  # ten minutes of event time
DISORDER_MS = 3_000
LATENESS = "1s"
ROUNDS = 1
CASES = {  # name: (declarative, window, target against the same kind without a window)
    "declarative": (True, None, None),
    "declarative tumbling 1m": (True, ("tumbling", "1m"), 0.8),
    "declarative hopping 1h/10m": (True, ("hopping", "1h", "10m"), 0.6),
    "python fold": (False, None, None),
    "python fold tumbling 1m": (False, ("tumbling", "1m"), 0.7),
    "declarative session 5s": (True, ("session", "5s"), None),
    "python fold session 5s": (False, ("session", "5s"), None),
}


def window_of(spec: tuple[str, ...] | None) -> Any:
    if spec is None:
        return None
    if spec[0] == "session":
        return el.session(gap=spec[1])
    return el.tumbling(spec[1]) if spec[0] == "tumbling" else el.hopping(spec[1], every=spec[2])


def fill(url: str, events: int, keys: int) -> None:
    store = el.open_store(url)
    rng = random.Random(1)
    base = 1_764_000_000_000
    for i in range(0, events, 500):
        batch = [
            el.NewEvent("Measured", {"k": f"k{rng.randrange(keys)}", "v": rng.randrange(100),
                                     "ts": base + j * SPAN_MS // events
                                     - rng.randrange(DISORDER_MS)})
            for j in range(i, i + 500)
        ]  # fmt: skip
        store.append(f"sensor-{i // 500 % 1000}", batch)
    store.close()


def define(app: el.App, name: str, case: str) -> el.Aggregation:
    declarative, spec, _ = CASES[case]
    windowing: dict[str, Any] = {}
    if spec is not None:
        windowing = {"window": window_of(spec), "time": el.event_time("ts", unit="ms"),
                     "lateness": LATENESS}  # fmt: skip
    if declarative:
        fields = {"sum": el.sum("v"), "n": el.count()}
        return app.aggregation(name, key="k", on="Measured", fields=fields, **windowing)
    agg = app.aggregation(name, key="k", initial=lambda: {"sum": 0, "n": 0}, **windowing)

    @agg.on("Measured")
    def add(state: dict, event: el.Event) -> None:
        state["sum"] += event.data["v"]
        state["n"] += 1

    if spec is not None and spec[0] == "session":

        @agg.on_merge
        def merge(into: dict, other: dict) -> None:
            into["sum"] += other["sum"]
            into["n"] += other["n"]

    return agg


def _child(conn: Any, url: str, name: str, case: str) -> None:
    app = el.App(url)
    define(app, name, case)
    app.store.head()
    start = time.perf_counter()
    app.start([name])
    app.wait_until_caught_up(7200, [name])
    seconds = time.perf_counter() - start
    app.stop()
    app.close()
    conn.send((seconds, memory()["VmHWM"]))


#: a Spark replay of a case: its name -> the case it replays
SPARK_CASES = {
    "declarative, Spark replay": "declarative",
    "declarative tumbling 1m, Spark replay": "declarative tumbling 1m",
    "python fold, Spark replay": "python fold",
    "python fold tumbling 1m, Spark replay": "python fold tumbling 1m",
    "python fold session 5s, Spark replay": "python fold session 5s",
}


#: a continuous run of a case on Spark (micro-batches of a tenth of the events): its name ->
#: the case it runs
CONTINUOUS_CASES = {
    "declarative, Spark micro-batches": "declarative",
    "declarative tumbling 1m, Spark micro-batches": "declarative tumbling 1m",
    "python fold, Spark micro-batches": "python fold",
    "python fold tumbling 1m, Spark micro-batches": "python fold tumbling 1m",
    "python fold session 5s, Spark micro-batches": "python fold session 5s",
}


def _spark_child(conn: Any, url: str, name: str, case: str, continuous: bool) -> None:
    """A replay of ``case`` on Spark, or (``continuous``) its micro-batches until caught up."""
    from eventlanes.spark import get_session
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all

    app = el.App(url)
    define(app, name, case)
    spark = get_session("local[2]")
    spark.range(1).count()  # the JVM and a Python worker up before the clock runs
    start = time.perf_counter()
    if continuous:
        runner = ContinuousAggregation(app, name, spark=spark,
                                       max_rows=app.store.head() // 10 + 1)  # fmt: skip
        app.initialize(name)
        runner.records = claim_all(app.tokens, name, runner.owner)
        try:
            while runner.run_batch():
                pass
        finally:
            runner.stop()
    else:
        el.spark.replay(app, name, spark=spark)
    seconds = time.perf_counter() - start
    spark.stop()
    app.close()
    conn.send((seconds, memory()["VmHWM"]))


def plain_windows(
    events: list[el.Event], window: Any, lateness: int
) -> tuple[dict[tuple[str, int, int], int], list[int]]:
    """The windows' counts and the late inputs by the store clock, as a plain loop (the rules
    of ``eventlanes.windows.reference``, without its closing, which counts do not need)."""
    counts: dict[tuple[str, int, int], int] = {}
    late: list[int] = []
    latest: int | None = None
    for e in events:
        t = min(e.data["ts"] * 1000, recorded_us(e) + lateness)  # max_future: the lateness
        mark = None if latest is None else latest - lateness
        missed = False
        for start, end in window.windows(t):
            if mark is not None and end <= mark:
                missed = True
            else:
                counts[(e.data["k"], start, end)] = counts.get((e.data["k"], start, end), 0) + 1
        if missed:
            late.append(e.position)
        latest = t if latest is None else max(latest, t)
    return counts, late


def plain_sessions(
    events: list[el.Event], gap: int, lateness: int
) -> tuple[dict[tuple[str, int, int], int], list[int]]:
    """The sessions' counts and the late inputs by the store clock, as a plain loop (the
    rules of ``eventlanes.windows.reference``: a session the clock passed is closed)."""
    counts: dict[tuple[str, int, int], int] = {}
    late: list[int] = []
    sessions: dict[str, list[tuple[int, int]]] = {}
    latest: int | None = None
    for e in events:
        t = min(e.data["ts"] * 1000, recorded_us(e) + lateness)
        mark = None if latest is None else latest - lateness
        mine = sessions.setdefault(e.data["k"], [])
        hit = [w for w in mine if w[0] < t + gap and t < w[1]]
        closed = [w for w in hit if mark is not None and w[1] <= mark]
        if closed or (not hit and mark is not None and t + gap <= mark):
            late.append(e.position)
        else:
            start = min([t, *(w[0] for w in hit)])
            end = max([t + gap, *(w[1] for w in hit)])
            n = 1 + sum(counts.pop((e.data["k"], *w)) for w in hit)
            mine[:] = [w for w in mine if w not in hit] + [(start, end)]
            counts[(e.data["k"], start, end)] = n
        latest = t if latest is None else max(latest, t)
    return counts, late


def check(url: str, name: str, case: str, keys: set[str]) -> None:
    """The run's results equal a plain loop's (keyed) or the reference's (windowed)."""
    app = el.App(url)
    agg = define(app, name, case)
    events = list(app.store.iter_events(batch_size=20_000))
    spec = CASES[case][1]
    if spec is None:
        want: dict[str, dict[str, int]] = {}
        for e in events:
            s = want.setdefault(e.data["k"], {"sum": 0, "n": 0})
            s["sum"] += e.data["v"]
            s["n"] += 1
        got = dict(app.aggregate_states.db.query(
            app.aggregate_states.db.sql(
                f"SELECT key, value FROM {app.aggregate_states.table} WHERE aggregation = ?"),
            (name,)))  # fmt: skip
        if {k: json.loads(v) for k, v in got.items()} != want:
            raise AssertionError(f"{case}: states differ from a plain loop")
        app.close()
        return
    window = window_of(spec)
    if spec[0] == "session":
        counts, late = plain_sessions(events, window.gap, 1_000_000)
    else:
        counts, late = plain_windows(events, window, 1_000_000)
    got_counts = {(k, w.start_us, w.end_us): w.value["n"] for k in keys for w in agg.windows(k)}
    if got_counts != counts:
        raise AssertionError(f"{case}: window counts differ from a plain loop")
    if [x.position for x in agg.late_events()] != late:
        raise AssertionError(f"{case}: late inputs differ from the reference loop")
    app.close()


def run(
    backends: list[str],
    quick: bool = False,
    rounds: int = ROUNDS,
    spark: bool = False,
    continuous: bool = False,
) -> None:
    if "sqlite" not in backends:
        print("windows: SQLite only (the store the pushdown baseline runs on)")
        return
    events, keys = (QUICK_EVENTS, QUICK_KEYS) if quick else (EVENTS, KEYS)
    on_spark = (SPARK_CASES if spark else {}) | (CONTINUOUS_CASES if continuous else {})
    here = Path(tempfile.mkdtemp(prefix="eventlanes-windows-"))
    try:
        url = f"sqlite:///{here / uuid.uuid4().hex}.db"
        fill(url, events, keys)
        names = {f"k{i}" for i in range(keys)}
        cases = {c: c for c in CASES} | on_spark
        runs: dict[str, list[tuple[float, int]]] = {c: [] for c in cases}
        for r in range(rounds):
            for case, local in cases.items():  # alternating: the machine's load changes
                name = f"{case.replace(' ', '-').replace('/', '-').replace(',', '')}-{r}"
                if case == local:
                    runs[case].append(in_child(_child, url, name, local))
                else:
                    runs[case].append(in_child(_spark_child, url, name, local,
                                               case in CONTINUOUS_CASES))  # fmt: skip
                check(url, name, local, names)
                print(f"{case}, run {r + 1}: {events / runs[case][-1][0]:,.0f} ev/s", flush=True)
    finally:
        shutil.rmtree(here, ignore_errors=True)
    rate = {c: statistics.median(events / s for s, _ in runs[c]) for c in cases}
    rows = []
    for case, (declarative, _, target) in CASES.items():
        base = rate["declarative" if declarative else "python fold"]
        ratio = rate[case] / base
        peak = statistics.median(p for _, p in runs[case])
        rows.append([case, rate[case], f"{peak / 2**20:,.0f} MB", f"{ratio:.2f}x",
                     f">= {target}x" if target else "",
                     ("met" if ratio >= target else "NOT MET") if target else ""])  # fmt: skip
    for case, local in on_spark.items():
        declarative, window, _ = CASES[local]
        how = "Spark micro-batches" if case in CONTINUOUS_CASES else "Spark replay"
        base = rate[f"{'declarative' if declarative else 'python fold'}, {how}"]
        ratio = rate[case] / base
        peak = statistics.median(p for _, p in runs[case])
        # a windowed replay's target (micro-batches and sessions have none)
        replayed = case in SPARK_CASES and window is not None and window[0] != "session"
        target = 0.8 if replayed else None
        met = "" if target is None else ("met" if ratio >= target else "NOT MET")
        rows.append([case, rate[case], f"{peak / 2**20:,.0f} MB (driver)", f"{ratio:.2f}x",
                     "" if target is None else f">= {target}x", met])  # fmt: skip
    print_table(
        f"catching up on {events:,} events over {keys:,} keys, SQLite (median of {rounds} "
        "run(s), one process each; results checked against plain loops)",
        ["aggregation", "events/s", "peak RSS", "vs no window", "target", ""],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--spark", action="store_true", help="also replay on Spark")
    parser.add_argument("--continuous", action="store_true",
                        help="also run on Spark in micro-batches (run --engine spark)")  # fmt: skip
    args = parser.parse_args()
    # by its module's name: the processes it spawns (and Spark's executors) import the
    # functions of the aggregations from there, not from __main__
    from benchmarks import bench_windows

    bench_windows.run(["sqlite"], args.quick, args.rounds, args.spark, args.continuous)
