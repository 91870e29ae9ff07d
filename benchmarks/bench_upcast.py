"""The cost of upcasting at read time, each figure beside its baseline, measured in turns in
one run (the machine is shared: ratios of neighbouring runs, with their spread).

The same facts (``--quick``: 20,000; else 200,000 over 5,000 keys; Spark 400,000) are stored
twice: all in the current shape (``Fastened.v2``: robot, screws), and with every second one
in the old shape (``Fastened``: robot_id, n) that one upcaster turns into the current one.

* The local engine catching up from scratch (one process): a Python fold, and a declarative
  sum and count (SQLite's pushdown, which leaves ranges with old shapes to the row path; the
  PostgreSQL Arrow fold, which upcasts the old rows in its batches): half upcast against the
  store of current shapes without upcasters.
* The same baseline (current shapes, no upcaster) on this code and on the code before
  upcasting (the merge base with ``main``, exported with ``git archive``): the path without
  upcasters at its old speed.
* Spark replays (local[2], warm, one JVM): the Python fold and the declarative plan, half
  upcast against current shapes; and the baseline replays on this code against the code
  before upcasting (one JVM each, in turns).

Every run's states are checked equal to a plain Python loop over the facts.

``python benchmarks/run.py upcast [--backend sqlite|postgres] [--quick]``.
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import eventlanes as el

from .common import databases, print_table

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 3

# One child process per run (one JVM per Spark child): the code under test comes first on its
# path (this tree's src, or the base's export), then the child defines what it measures.
CHILD = """
import json, sys, time, uuid
sys.path.insert(0, SRC)
import eventlanes as el
assert el.__file__.startswith(SRC), el.__file__

def upcaster(event):
    d = event.data
    return {"robot": d["robot_id"], "screws": d["n"]}

def fold(state, event):
    state["sum"] += event.data["screws"]
    state["n"] += 1

def define(app, name, kind):
    if kind == "fold":
        app.aggregation(name, key="robot", initial=lambda: {"sum": 0, "n": 0},
                        segments=1, batch_size=5000).on("Fastened.v2")(fold)
    else:
        app.aggregation(name, key="robot", on="Fastened.v2", segments=1, batch_size=5000,
                        fields={"sum": el.sum("screws"), "n": el.count()})

def states(app, name):
    t = app.db.table("aggregates")
    sql = app.db.sql(f"SELECT key, value FROM {t} WHERE aggregation = ?")
    rows = app.db.query(sql, (name,))
    return {k: [v["sum"], v["n"]] for k, raw in rows if (v := json.loads(raw))}

def app_for(url, upcast):
    app = el.App(url)
    if upcast:
        app.upcaster("Fastened")(upcaster)
    return app
"""

LOCAL = """
app = app_for(URL, UPCAST)
name = f"agg_{uuid.uuid4().hex[:8]}"  # from scratch: tokens and states of its own
define(app, name, KIND)
start = time.perf_counter()
app.start([name])
app.wait_until_caught_up(3600, [name])
seconds = time.perf_counter() - start
app.stop()
print(json.dumps({"seconds": seconds, "states": states(app, name)}))
"""

SPARK = """
from eventlanes import spark as els
session = els.get_session("local[2]")
runs = []  # (url, upcast, kind): one app per store, both kinds defined in it
apps = {}
for url, upcast in STORES:
    app = apps[url] = app_for(url, upcast)
    for kind in ("fold", "declared"):
        define(app, kind, kind)
out = {}
for rnd in range(ROUNDS + 1):  # the first round warms up (JIT, code generation)
    for url, upcast in STORES:
        for kind in ("fold", "declared"):
            result = els.replay(apps[url], kind, spark=session)
            key = f"{'mixed' if upcast else 'current'} {kind}"
            if rnd:
                out.setdefault(key, []).append(result.seconds)
            out[key + " states"] = states(apps[url], kind)
print(json.dumps(out))
"""


def facts(events: int, keys: int) -> list[tuple[str, int]]:
    rng = random.Random(1)
    return [(f"r{rng.randrange(keys)}", rng.randrange(100)) for _ in range(events)]


def fill(url: str, rows: list[tuple[str, int]], mixed: bool) -> None:
    """Appends of 200; with ``mixed`` every second fact in the old shape."""
    store = el.open_store(url)
    for i in range(0, len(rows), 200):
        batch = []
        for j, (robot, n) in enumerate(rows[i : i + 200]):
            if mixed and j % 2:
                batch.append(el.NewEvent("Fastened", {"robot_id": robot, "n": n}))
            else:
                batch.append(el.NewEvent("Fastened.v2", {"robot": robot, "screws": n}))
        store.append(f"cell-{(i // 200) % 1000}", batch)
    store.close()


def plain(rows: list[tuple[str, int]]) -> dict[str, list[int]]:
    want: dict[str, list[int]] = {}
    for robot, n in rows:
        s = want.setdefault(robot, [0, 0])
        s[0] += n
        s[1] += 1
    return want


def base_source() -> tuple[str, str] | None:
    """This tree's code before upcasting (the merge base with ``main``), exported with ``git
    archive``: (its src directory, the commit); None without git history."""
    try:
        commit = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, check=True,
                                 capture_output=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    target = Path(tempfile.mkdtemp(prefix="eventlanes-base-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return str(target / "src"), commit[:10]


def child(src: str, body: str, **values: Any) -> dict[str, Any]:
    preamble = "".join(f"{k} = {v!r}\n" for k, v in {"SRC": src, **values}.items())
    code = preamble + CHILD + body
    # PYTHONPATH too: Spark's Python workers import the same code (before the editable install)
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=env)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"benchmark child failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def local_rounds(
    urls: dict[str, str], src: str, base: str | None, want: dict[str, list[int]], rounds: int
) -> dict[str, list[float]]:
    """Seconds per run, in turns: half upcast, current shapes, current shapes on the base."""
    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for kind in ("fold", "declared"):
            variants = [
                ("mixed", src, urls["mixed"], True),
                ("current", src, urls["current"], False),
            ]
            if base is not None:
                variants.append(("base", base, urls["current"], False))
            for label, code, url, upcast in variants:
                got = child(code, LOCAL, URL=url, UPCAST=upcast, KIND=kind)
                if got["states"] != want:
                    raise AssertionError(f"local {kind} ({label}): states differ from a plain loop")
                out.setdefault(f"{label} {kind}", []).append(got["seconds"])
    return out


def spark_rounds(
    urls: dict[str, str], src: str, base: str | None, want: dict[str, list[int]], rounds: int
) -> dict[str, list[float]]:
    """Seconds per warm replay: this code (half upcast and current shapes, in turns, one JVM)
    and, in JVMs taken in turns with it, the base code (current shapes)."""
    out: dict[str, list[float]] = {}
    for _ in range(max(1, rounds - 1)):
        here = child(src, SPARK, STORES=[(urls["mixed"], True), (urls["current"], False)],
                     ROUNDS=rounds)  # fmt: skip
        found = [here]
        if base is not None:
            found.append(child(base, SPARK, STORES=[(urls["current"], False)], ROUNDS=rounds))
        for label, got in zip(["", "base "], found, strict=False):
            for key, value in got.items():
                if key.endswith(" states"):
                    if value != want:
                        raise AssertionError(f"Spark {label}{key}: differ from a plain loop")
                else:
                    out.setdefault(label + key, []).extend(value)
    return out


def run(backends: list[str], quick: bool = False) -> None:
    events, keys = (20_000, 1_000) if quick else (200_000, 5_000)
    spark_events = 40_000 if quick else 400_000
    rounds = 2 if quick else ROUNDS
    src = str(ROOT / "src")
    found = base_source()
    base, commit = found if found is not None else (None, "")
    rows: list[list[Any]] = []
    with databases(backends) as dbs:
        for backend, make in dbs.items():
            for what, n in (("local", events), ("spark", spark_events)):
                facts_ = facts(n, keys)
                want = plain(facts_)
                urls = {"mixed": make(), "current": make()}
                start = time.perf_counter()
                fill(urls["mixed"], facts_, mixed=True)
                fill(urls["current"], facts_, mixed=False)
                print(f"{backend}: 2 x {n:,} events in {time.perf_counter() - start:.0f} s")
                measure = local_rounds if what == "local" else spark_rounds
                got = measure(urls, src, base, want, rounds)
                print(json.dumps({"backend": backend, what: got}))
                rows += _rows(backend, what, n, got)
    print_table(
        "upcasting: seconds per run (medians of the rounds, taken in turns); ratio: median of "
        "the neighbouring runs' ratios, their range in brackets; 'base': the code before "
        f"upcasting ({commit or 'not found'}); every run's states equal a plain loop's",
        ["store", "path", "events", "seconds", "baseline", "baseline seconds", "ratio"],
        rows,
    )


def _rows(backend: str, what: str, n: int, got: dict[str, list[float]]) -> list[list[Any]]:
    med = statistics.median

    def pair(a: str, b: str) -> str:
        return spread([x / y for x, y in zip(got[a], got[b], strict=False)])

    def seconds(key: str) -> str:
        return f"{med(got[key]):.2f}"

    where = "local engine" if what == "local" else "Spark replay, local[2], warm"
    out = []
    for kind in ("fold", "declared"):
        path = "Python fold" if kind == "fold" else "declarative (pushdown/Arrow/native)"
        base_key = f"base current {kind}" if what == "spark" else f"base {kind}"
        out.append([backend, f"{where}, {path}: half upcast", n, seconds(f"mixed {kind}"),
                    "current shapes, no upcaster", seconds(f"current {kind}"),
                    pair(f"mixed {kind}", f"current {kind}")])  # fmt: skip
        if base_key in got:
            out.append([backend, f"{where}, {path}: no upcaster", n, seconds(f"current {kind}"),
                        "the code before upcasting", seconds(base_key),
                        pair(f"current {kind}", base_key)])  # fmt: skip
    return out


if __name__ == "__main__":
    run(["sqlite", "postgres"], quick="--quick" in sys.argv)
