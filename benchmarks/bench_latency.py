"""Append -> handled latency of a running pooled processor (p50/p99), SQLite and PostgreSQL.
The processor runs in this process, so both ends read the same clock."""

from __future__ import annotations

import threading
import time

import eventlanes as el

from .common import databases, print_table


def _measure(url: str, samples: int) -> list[float]:
    app = el.App(url)
    proc = app.processor("latency", segments=4)
    handled: dict[int, float] = {}
    ready = threading.Condition()

    @proc.on_any
    def note(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"SELECT {ctx.param}", (event.position,))  # a query in the transaction
        handled[event.position] = time.perf_counter()

    app.start()
    try:
        app.store.append("warm-up", [el.NewEvent("Ping")])
        app.wait_until_caught_up(30)
        latencies = []
        for i in range(samples):
            start = time.perf_counter()
            [position] = app.store.append(f"stream-{i % 50}", [el.NewEvent("Ping")])
            deadline = start + 5
            while position not in handled and time.perf_counter() < deadline:
                with ready:
                    ready.wait(0.0005)
            latencies.append(handled.get(position, deadline) - start)
            time.sleep(0.01)  # an idle processor between events: the case the wake-up serves
    finally:
        app.stop()
        app.close()
    return sorted(latencies)


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(backends: list[str], quick: bool = False) -> None:
    samples = 100 if quick else 400
    rows = []
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            lat = _measure(new_url(), samples)
            target = 50 if name == "postgres" else 100
            p50, p99 = (_quantile(lat, q) for q in (0.5, 0.99))
            rows.append([name, samples, f"{p50:.1f}", f"{p99:.1f}", f"<= {target}"])
    print_table(
        "append -> handled latency (ms)", ["backend", "samples", "p50", "p99", "target p99"], rows
    )
