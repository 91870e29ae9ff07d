"""PostgreSQL: full scan and segment commits, each beside its baseline in the same run.

* Full scan of the store (``iter_events``, Event objects; ``scan``, raw rows) against raw
  psycopg reading the same rows in the same chunks (binary cursor). Target: 250k rows/s.
* A projection-like loop: read 500 events, one INSERT per event plus the fenced token update,
  commit; in a plain transaction, in a pipelined one (``db.transaction(pipeline=True)``), and
  with the inserts batched into one ``executemany`` (what an ``on_batch`` handler can do).

Every variant's result is checked against the others (row counts and position sums).
``python -m benchmarks.bench_postgres [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import eventlanes as el

from .common import databases, print_table, run_processes

SCAN_EVENTS = 1_000_000
PROJECTION_EVENTS = 100_000
CHUNK = 10_000
BATCH = 500


def _fill_worker(ready: Any, url: str, writer: int, events: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent(f"T{i % 10}", {"writer": writer, "i": i}) for i in range(500)]
    ready.wait()
    for k in range(events // 500):
        store.append(f"fill-{writer}-{k % 1000}", batch)
    store.close()


def fill(url: str, events: int) -> None:
    el.open_store(url).close()
    run_processes(_fill_worker, [(url, w, events // 2) for w in range(2)])


def _best_of(rounds: int, fn: Callable[[], tuple[int, int]]) -> tuple[float, tuple[int, int]]:
    """Median rows/s over ``rounds`` runs (the machine is shared: one run says little)."""
    rates, result = [], (0, 0)
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        rates.append(result[0] / (time.perf_counter() - start))
    return statistics.median(rates), result


def scan_rows(url: str, rounds: int) -> list[list[Any]]:
    import psycopg

    store = el.open_store(url)
    head = store.head()
    table = store.events_table
    raw_conn = psycopg.connect(store.db.url.target, autocommit=True)
    raw_sql = (
        "SELECT position, stream_id, version, type, data::text, metadata::text, recorded_at, "
        f"routing_hash FROM {table} WHERE position > %s ORDER BY position LIMIT %s"
    )

    def raw() -> tuple[int, int]:
        count = total = after = 0
        while True:
            rows = raw_conn.cursor(binary=True).execute(raw_sql, (after, CHUNK)).fetchall()
            if not rows:
                return count, total
            count += len(rows)
            total += sum(r[0] for r in rows)
            after = rows[-1][0]

    def events() -> tuple[int, int]:
        count = total = 0
        for event in store.iter_events(batch_size=CHUNK):
            count += 1
            total += event.position
        return count, total

    def rows() -> tuple[int, int]:
        count = total = 0
        for chunk in store.scan(0, head, chunk=CHUNK):
            count += len(chunk)
            total += sum(r[0] for r in chunk)
        return count, total

    results = {}
    for name, fn in [("raw psycopg (binary)", raw), ("iter_events", events), ("scan", rows)]:
        results[name] = _best_of(rounds, fn)
    baseline_rate, baseline = results["raw psycopg (binary)"]
    out = []
    for name, (rate, result) in results.items():
        if result != baseline:
            raise AssertionError(f"{name} read {result}, raw psycopg {baseline}")
        out.append(["full scan", name, result[0], rate, f"{rate / baseline_rate:.2f}x"])
    raw_conn.close()
    store.close()
    return out


VARIANTS = {
    "plain transaction": {"pipeline": False, "many": False},
    "pipeline=True": {"pipeline": True, "many": False},
    "executemany (batch)": {"pipeline": False, "many": True},
}


def projection(url: str, events: int) -> dict[str, tuple[float, tuple[int, int]]]:
    """One INSERT per event and the fenced token update per 500 events, one commit each, per
    variant. The variants take turns batch by batch (the machine is shared: load changes
    from second to second), each into its own view with its own token."""
    store = el.open_store(url)
    db = store.db
    tokens = el.open_token_store(db)
    names = {}
    for k, variant in enumerate(VARIANTS):
        name = names[variant] = f"proj_{k}"
        db.run_ddl([f"CREATE TABLE IF NOT EXISTS {name} (position bigint PRIMARY KEY, n int)"])
        tokens.initialize(name, segments=1, initial="tail")
        tokens.claim(name, 0, "bench")
    seconds = dict.fromkeys(VARIANTS, 0.0)
    after = done = 0
    while done < events:
        batch, upto = store.read_upto(after, BATCH)
        if not batch:
            break
        for variant, how in VARIANTS.items():
            name = names[variant]
            insert = f"INSERT INTO {name} (position, n) VALUES (%s, %s)"
            start = time.perf_counter()
            with db.transaction(pipeline=how["pipeline"]) as conn:
                if how["many"]:
                    rows = [(event.position, event.version) for event in batch]
                    conn.cursor().executemany(insert, rows)
                else:
                    for event in batch:
                        conn.execute(insert, (event.position, event.version))
                tokens.store(name, 0, upto, "bench", conn=conn)
            seconds[variant] += time.perf_counter() - start
        done += len(batch)
        after = upto
    out = {}
    for variant, name in names.items():
        count, total = db.query(f"SELECT count(*), coalesce(sum(position), 0) FROM {name}")[0]
        out[variant] = (done / seconds[variant], (int(count), int(total)))
    store.close()
    return out


def run(backends: list[str], quick: bool = False) -> None:
    if "postgres" not in backends:
        return
    scale = 0.2 if quick else 1.0
    rows: list[list[Any]] = []
    with databases(["postgres"]) as dbs:
        url = dbs["postgres"]()
        fill(url, int(SCAN_EVENTS * scale))
        rows += scan_rows(url, rounds=3)
        results = projection(url, int(PROJECTION_EVENTS * scale))
        plain_rate, plain = results["plain transaction"]
        for variant, (rate, result) in results.items():
            if result != plain:
                raise AssertionError(f"{variant} wrote {result}, the plain transaction {plain}")
            rows.append(
                ["projection commit", variant, result[0], rate, f"{rate / plain_rate:.2f}x"]
            )
    print_table(
        "PostgreSQL: full scan (rows/s) and projection commits (events/s)",
        ["what", "variant", "rows", "per second", "ratio"],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(["postgres"], quick=parser.parse_args().quick)
