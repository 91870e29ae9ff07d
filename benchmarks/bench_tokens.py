"""Token store: claims, extends, stores and status reads per second on SQLite and PostgreSQL,
for a single owner and for 4 processes competing for the same 16 segments; and how fast a
paused processor refuses claims (every one must be refused). Also what replay flags cost per
event in dispatch (no database): live, one replay end, ends per part (each event routed)."""

from __future__ import annotations

import time
from typing import Any

import eventlanes as el

from .common import databases, print_table, run_processes

P = "bench"


def _single(url: str, n: int) -> dict[str, float]:
    ts = el.open_token_store(url)
    ts.initialize(P, segments=16)
    rates = {}
    start = time.perf_counter()
    for i in range(n):
        ts.claim(P, i % 16, "solo")
    rates["claim"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(n):
        ts.extend(P, i % 16, "solo")
    rates["extend"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(n):
        ts.store(P, i % 16, el.Token(i), "solo")
    rates["store"] = n / (time.perf_counter() - start)
    last = {i % 16: i for i in range(n)}  # the last position stored to each segment
    assert [ts.token(P, s) for s in range(16)] == [el.Token(last[s]) for s in range(16)]
    reads = max(1, n // 10)
    start = time.perf_counter()
    for _ in range(reads):
        assert len(ts.status(P)) == 16
    rates["status (16 rows)"] = reads / (time.perf_counter() - start)
    ts.release_all(P, "solo")
    ts.pause(P)
    start = time.perf_counter()
    refused = sum(ts.claim(P, i % 16, "solo") is None for i in range(n))
    rates["claim refused (paused)"] = n / (time.perf_counter() - start)
    assert refused == n, f"{n - refused} claims succeeded on a paused processor"
    ts.db.close()
    return rates


def _competitor(ready: Any, url: str, owner: str, seconds: float, counts: Any) -> None:
    ts = el.open_token_store(url)
    ready.wait()
    attempts = wins = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for seg in range(16):
            attempts += 1
            if ts.claim(P, seg, owner) is not None:
                wins += 1
                ts.store(P, seg, el.Token(wins), owner)
                ts.release(P, seg, owner)
    with counts.get_lock():
        counts[0] += attempts
        counts[1] += wins


def _replay_flags(n: int) -> list[list[Any]]:
    """Events through Dispatch.run with a handler and a ``disallow_replay`` one, under three
    tokens; the calls of each are checked against a plain loop's count of the replays."""
    from eventlanes.hashing import stable_hash
    from eventlanes.processing.handlers import HandlerSet
    from eventlanes.processing.handling.dispatch import Dispatch

    events = []
    for p in range(1, n + 1):
        stream = f"s-{p % 1000}"
        events.append(el.Event(p, stream, 1, "Step", {}, {}, 0, stable_hash(stream)))
    calls = {"all": 0, "first-time": 0}

    def handle(event: el.Event, ctx: el.Context) -> None:
        calls["all"] += 1

    def mail(event: el.Event, ctx: el.Context) -> None:
        calls["first-time"] += 1

    handlers = HandlerSet()
    handlers.add(None, handle)
    handlers.add(None, el.disallow_replay(mail))
    dispatch = Dispatch("bench", handlers, el.per_stream())
    low, high = el.Segment(0, 1), el.Segment(1, 1)
    half = n // 2
    tokens = {
        "live (no replay)": (el.Token(0), lambda e: False),
        "one replay end": (el.Token.reset(el.Token(half), 0), lambda e: e.position <= half),
        "ends per part": (
            el.Token.reset(el.Token.merged(low, el.Token(n), high, el.Token(half)), 0),
            lambda e: e.position <= (n if e.routing_hash & 1 == 0 else half),
        ),
    }
    rows = []
    live = 0.0
    for name, (token, replayed) in tokens.items():
        expected = sum(not replayed(e) for e in events)  # the plain loop: first-time events
        ctx = el.Context("bench", None, token, None, "sqlite", "?")
        calls.update({"all": 0, "first-time": 0})
        start = time.perf_counter()
        dispatch.run(events, ctx, token)
        rate = n / (time.perf_counter() - start)
        assert calls == {"all": n, "first-time": expected}, (name, calls, expected)
        live = live or rate
        rows.append(["-", f"dispatch: {name}", 1, rate, f"{rate / live:.2f}"])
    return rows


def run(backends: list[str], quick: bool = False) -> None:
    import multiprocessing as mp

    flags = _replay_flags(50_000 if quick else 500_000)
    print_table(
        "replay flags in dispatch (events/s, one thread)",
        ["backend", "token", "processes", "events/s", "vs live"],
        flags,
    )

    rows = []
    n = 500 if quick else 3000
    seconds = 1.0 if quick else 4.0
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            rates = _single(new_url(), n)
            for op, rate in rates.items():
                rows.append([name, f"{op} (single owner)", 1, rate])
            url = new_url()
            el.open_token_store(url).initialize(P, segments=16)
            counts = mp.get_context("spawn").Array("q", 2)
            wall = run_processes(
                _competitor, [(url, f"node-{i}", seconds, counts) for i in range(4)]
            )
            rows.append([name, "claim attempts (4 competing)", 4, counts[0] / wall])
            rows.append([name, "won claim + store + release", 4, counts[1] / wall])
    print_table("token store (operations/s)", ["backend", "operation", "processes", "ops/s"], rows)
