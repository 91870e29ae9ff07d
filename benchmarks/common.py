"""Shared plumbing for the benchmarks: databases to run on, process fan-out, table output."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from eventlanes.cli.base import print_table as whole
from eventlanes.observe import Observer

console = Console()
DATA = Path(__file__).resolve().parent.parent / "bench-data"


@contextmanager
def databases(want: list[str]) -> Iterator[dict[str, Callable[[], str]]]:
    """Factories of fresh store URLs per backend: a SQLite file, and PostgreSQL (the server in
    $EVENTLANES_TEST_POSTGRES_URL or an embedded one with default durability, fsync on)."""
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir()
    server = None
    factories: dict[str, Callable[[], str]] = {}
    if "sqlite" in want:
        factories["sqlite"] = lambda: f"sqlite:///{DATA / uuid.uuid4().hex}.db"
    if "postgres" in want:
        from eventlanes.testing.postgres import server_url

        base, server = server_url(fsync=True)
        factories["postgres"] = lambda: f"{base}?prefix=b{uuid.uuid4().hex[:10]}_"
    try:
        yield factories
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(DATA, ignore_errors=True)


def run_processes(target: Callable[..., Any], args_per_proc: list[tuple[Any, ...]]) -> float:
    """Start one process per args tuple, release them together, return the wall time."""
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(len(args_per_proc) + 1)
    procs = [ctx.Process(target=target, args=(ready, *a)) for a in args_per_proc]
    for p in procs:
        p.start()
    ready.wait()
    start = time.perf_counter()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"benchmark worker failed with exit code {p.exitcode}")
    return time.perf_counter() - start


def in_child(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(conn, *args)`` in a spawned process of its own (its peak RSS is its own)
    and return what it sent on ``conn``."""
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs, *args))
    proc.start()
    result = mine.recv()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"benchmark child failed with exit code {proc.exitcode}")
    return result


def memory() -> dict[str, int]:
    """This process's resident memory now (``VmRSS``) and at its peak (``VmHWM``, the
    kernel's high-water mark), in bytes."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found


class StateWrites(Observer):
    """An aggregation's state writes (its commits): how many, and their seconds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.writes = 0

    def committed(self, processor: str, segment: str, seconds: float) -> None:
        self.seconds += seconds
        self.writes += 1


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*[_cell(v) for v in row])
    # As the CLI prints its tables: whole when the output is a file or a pipe (a benchmark's
    # log), not folded to 80 columns.
    whole(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def baseline() -> Any:
    """The eventsourcing baseline module, or None when the ``bench`` extra is not installed."""
    try:
        from . import es_baseline
    except ImportError:
        console.print(
            "[yellow]eventsourcing not installed: no baseline (pip install -e '.[bench]')"
        )
        return None
    return es_baseline


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.1f}x" if ours and theirs else ""
