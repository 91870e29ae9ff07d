"""Blue/green across real processes, while events keep arriving: version 1 serves throughout,
version 2 (run --processes 2, a worker SIGKILLed mid-warm-up) builds its own tables and states
from history, its disallow_replay side effect runs exactly once for every event version 1 had
not handled when it started and never for the others, promote is refused until it has caught
up and then switches readers, retire drops version 1; and nodes that start version 2 at once
agree on where it starts."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import eventlanes as el
from eventlanes.schema import roles
from tests.apps.versions_app import create_schema, make_app
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.versions_app:app"


def _env(url: str, delay: float = 0.0) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"EVENTLANES_TEST_VERSIONS_URL": url, "EVENTLANES_TEST_V2_DELAY": str(delay)})
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress", *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _place(store: el.EventStore, rng: random.Random) -> None:
    customer, amount = f"c{rng.randrange(8)}", rng.randrange(1, 100)
    store.append(f"order-{rng.randrange(10**9)}",
                 [el.NewEvent("Placed", {"customer": customer, "amount": amount})])  # fmt: skip


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)
        assert p.returncode == 0, p.stderr.read() if p.stderr else ""


def test_blue_green_while_events_keep_arriving(store_url: str) -> None:
    app = make_app(store_url)
    create_schema(app)
    rng = random.Random(7)
    for _ in range(900):  # history before version 2 exists
        _place(app.store, rng)
    env = _env(store_url, delay=0.02)  # version 2's warm-up: 900 events x 20 ms over 3 lanes
    v1 = _run(env, "--processor", "orders", "--processor", "totals")
    v2 = None
    arriving, reading = threading.Event(), threading.Event()
    arriving.set()
    reading.set()

    def append() -> None:
        feed = random.Random(8)
        while arriving.is_set():
            _place(app.store, feed)
            time.sleep(0.02)

    seen: list[tuple[str, int]] = []  # what a reader got: (table, rows)
    failures: list[BaseException] = []

    def read() -> None:  # a reader of its own (another App), as a web request would be
        reader = make_app(store_url)
        while reading.is_set():
            try:
                table = reader.table("orders")
                seen.append((table, reader.db.query(f"SELECT count(*) FROM {table}")[0][0]))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)
            time.sleep(0.05)
        reader.close()

    threads = [threading.Thread(target=f, daemon=True) for f in (append, read)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: app.status("orders").position >= 900, 60, what="version 1 to catch up")
        v2 = _run(env, "--processes", "2", "--processor", "orders@v2", "--processor", "totals@v2")
        nodes = wait_for(
            lambda: len(live := app.tokens.live_nodes("orders@v2")) == 2 and live,
            60, what="two workers of version 2",
        )  # fmt: skip
        # A worker of version 2 is killed while it warms up.
        assert app.status("orders@v2").lag > 300, "version 2 warmed up too fast for this test"
        os.kill(int(nodes[0].split(":")[1]), signal.SIGKILL)
        refused = _cli(env, "promote", APP, "orders@v2")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "error: cannot promote 'orders@v2': not caught up: " in refused.stdout
        assert seen and {t for t, _ in seen} == {app.get("orders").table("orders")}
        time.sleep(1.0)
        arriving.clear()
        threads[0].join()
        wait_for(lambda: app.status("orders@v2").caught_up, 120, what="version 2 to catch up")
        done = _cli(env, "promote", APP, "orders@v2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "now see version 2 (was version 1)" in done.stdout
        wait_for(lambda: app.status("totals@v2").caught_up, 60, what="totals@v2 to catch up")
        app.promote("totals@v2")
        v2_table = app.get("orders@v2").table("orders")
        wait_for(lambda: seen[-1][0] == v2_table, 10, what="the reader to see version 2")
    finally:
        arriving.clear()
        reading.clear()
        for t in threads:
            t.join(30)
        _stop(v1, *([v2] if v2 is not None else []))
    assert not failures, failures

    # Readers saw version 1 (growing) until the promotion, then version 2, never back.
    tables = [t for t, _ in seen]
    switch = tables.index(v2_table)
    assert set(tables[:switch]) == {app.get("orders").table("orders")}
    assert set(tables[switch:]) == {v2_table}
    assert seen[switch - 1][1] > seen[0][1]
    events = list(app.store.iter_events())
    positions = {e.position for e in events}
    assert app.db.query(f"SELECT count(*) FROM {v2_table}")[0][0] == len(events) == seen[-1][1]
    # The side effect: once per version and event; version 2 never for what version 1 had
    # handled when version 2 started, and for every other event.
    rows = app.db.query(f"SELECT version, position, after_v2 FROM {app.db.table('mails')}")
    counts = Counter((v, p) for v, p, _ in rows)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:5]
    assert {p for v, p, _ in rows if v == 1} == positions  # version 1 served throughout
    before = {p for v, p, after in rows if v == 1 and not after}
    mailed = {p for v, p, _ in rows if v == 2}
    assert mailed == positions - before
    assert len(before) >= 900 and len(mailed) > 20  # history replayed, and new events mailed
    # Each version's own states; readers of totals see version 2's.
    expected: dict[str, dict[str, int]] = {}
    for e in events:
        state = expected.setdefault(e.data["customer"], {"n": 0, "amount": 0})
        state["n"] += 1
        state["amount"] += e.data["amount"]
    for customer, state in expected.items():
        assert app.serving("totals").get(customer) == state
        assert app.get("totals").get(customer) == {"n": state["n"]}

    # Retire version 1: asked for, never by itself; then no node runs it again.
    v1_table = app.get("orders").table("orders")
    unasked = _cli(env, "retire", APP, "orders")
    assert unasked.returncode == 2 and "confirm with --yes" in unasked.stdout
    assert roles.tables_present(app.db, [v1_table]) == [v1_table]
    retired = _cli(env, "retire", APP, "orders", "--yes")
    assert retired.returncode == 0, retired.stdout + retired.stderr
    assert f"and tables {v1_table}" in retired.stdout and "orders: retired" in retired.stdout
    assert roles.tables_present(app.db, [v1_table, v2_table]) == [v2_table]
    again = _cli(env, "run", APP, "--processor", "orders", "--no-progress")
    assert again.returncode == 2 and "'orders' was retired" in again.stdout + again.stderr
    app.close()


def _start_v2(url: str, barrier: object, results: object) -> None:
    app = make_app(url)
    spec = app.get("orders@v2").token_spec()
    barrier.wait()  # type: ignore[attr-defined]
    created = app.tokens.initialize(spec[0], spec[1], spec[2], app.store, after=spec[3],
                                    per_part=spec[4], context={"version": 2})  # fmt: skip
    rows = [(str(s.segment), s.token.detail()) for s in app.tokens.status("orders@v2")]
    results.put((created, rows))  # type: ignore[attr-defined]
    app.close()


def test_nodes_starting_a_version_at_once_agree_on_where_it_starts(store_url: str) -> None:
    app = make_app(store_url)
    create_schema(app)
    rng = random.Random(1)
    for _ in range(300):
        _place(app.store, rng)
    arriving = threading.Event()
    arriving.set()

    def append() -> None:
        while arriving.is_set():
            _place(app.store, rng)
            time.sleep(0.005)

    loader = threading.Thread(target=append, daemon=True)
    app.start(["orders"])  # version 1 moves on while version 2 is started
    loader.start()
    try:
        wait_for(lambda: app.status("orders").position >= 100, 60, what="version 1 to run")
        low = {s.segment: s.position for s in app.tokens.status("orders")}
        ctx = multiprocessing.get_context("spawn")
        n = 4
        barrier, results = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_start_v2, args=(store_url, barrier, results))
                 for _ in range(n)]  # fmt: skip
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        high = {s.segment: s.position for s in app.tokens.status("orders")}
    finally:
        arriving.clear()
        loader.join()
        app.stop()
    assert sorted(created for created, _ in outcomes) == [False, False, False, True]
    assert all(rows == outcomes[0][1] for _, rows in outcomes)  # one start, seen by all
    start = {s.segment: s.token for s in app.tokens.status("orders@v2")}
    assert [str(s) for s in start] == ["0/1", "1/3", "3/3"]
    # Version 1's segments are 0/1 (even hashes) and 1/1; version 2's 1/3 and 3/3 halve 1/1.
    ends = {s: tok.replay_until for s, tok in start.items()}
    one = el.Segment(1, 1)
    assert ends[el.Segment(1, 3)] == ends[el.Segment(3, 3)]  # one snapshot of segment 1/1
    for v2_segment, v1_segment in ((el.Segment(0, 1), el.Segment(0, 1)), (el.Segment(1, 3), one)):
        assert low[v1_segment] <= (ends[v2_segment] or 0) <= high[v1_segment]
    app.close()
