"""`make demo`: the seed scenario and a generated load on the embedded default (SQLite).

Creates a fresh store under demo-data/, appends three users built from their parts in order,
then 100,000 generated events over 10,000 streams from 4 writer processes, and verifies what
it can prove: every event is there once, positions are gap-free, and every stream reads back
in version order with its parts in the order they were added.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import eventlanes as el

console = Console()
DATA = Path(__file__).resolve().parent.parent / "demo-data"
SEED = {
    "user-carlo": ["front-wheel", "back-wheel", "car", "carlo"],
    "user-rolanda": ["roller", "rolanda", "helmet"],
    "user-bikey": ["bike", "bikey"],
}
STREAMS, EVENTS, WRITERS = 10_000, 100_000, 4


def seed_events(parts: list[str]) -> list[el.NewEvent]:
    return [el.NewEvent("PartAdded", {"part": part, "step": i}) for i, part in enumerate(parts, 1)]


def load_writer(url: str, writer: int) -> None:
    """Each writer owns every WRITERS-th stream and appends its events in batches of 10."""
    store = el.open_store(url)
    per_stream = EVENTS // STREAMS
    for s in range(writer, STREAMS, WRITERS):
        events = [el.NewEvent("Counted", {"stream": s, "n": n}) for n in range(1, per_stream + 1)]
        store.append(f"load-{s}", events, expected_version=0)
    store.close()


def check(ok: bool, what: str) -> bool:
    console.print(f"  {'[green]✓[/green]' if ok else '[red]✗[/red]'} {what}")
    return ok


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir()
    url = f"sqlite:///{DATA / 'demo.db'}"
    store = el.open_store(url)
    console.rule("[bold]eventlanes demo: the event store")
    for stream, parts in SEED.items():
        store.append(stream, seed_events(parts), expected_version=0)
    try:
        store.append("user-carlo", seed_events(["extra"]), expected_version=0)
        conflict = False
    except el.ConcurrencyError as exc:
        conflict = True
        console.print(f"  optimistic concurrency refused a stale append: [italic]{exc}[/italic]")

    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=load_writer, args=(url, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    append_s = time.perf_counter() - start

    start = time.perf_counter()
    events = list(store.iter_events(batch_size=10_000))
    read_s = time.perf_counter() - start

    table = Table(title="what was written")
    for col in ("streams", "events", "writer processes", "append time", "full read"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{STREAMS + len(SEED):,}",
        f"{len(events):,}",
        str(WRITERS),
        f"{append_s:.2f} s ({EVENTS / append_s:,.0f} ev/s)",
        f"{read_s:.2f} s ({len(events) / read_s:,.0f} ev/s)",
    )
    console.print(table)

    versions: dict[str, list[int]] = {}
    parts: dict[str, list[str]] = {}
    for e in events:
        versions.setdefault(e.stream_id, []).append(e.version)
        if e.stream_id in SEED:
            parts.setdefault(e.stream_id, []).append(e.data["part"])
    expected_total = EVENTS + sum(len(p) for p in SEED.values())
    results = [
        check(conflict, "a stale expected_version raised ConcurrencyError and wrote nothing"),
        check(len(events) == expected_total, f"{expected_total:,} events stored, each once"),
        check(
            [e.position for e in events] == list(range(1, len(events) + 1)),
            "global positions are 1..N with no gap and no duplicate",
        ),
        check(
            all(v == list(range(1, len(v) + 1)) for v in versions.values()),
            f"all {len(versions):,} streams read back in version order",
        ),
        check(parts == SEED, "Carlo, Rolanda and Bikey were built from their parts in order"),
    ]
    for stream, p in parts.items():
        console.print(f"    {stream}: {' → '.join(p)}")
    store.close()
    console.rule("[bold green]all checks passed" if all(results) else "[bold red]checks failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
