"""``eventlanes export --parquet DIR``: the store as Parquet files, for Spark replays that
should not hit the database (or run elsewhere)."""

from __future__ import annotations

from pathlib import Path

from ..store import EventStore
from .source import FIELDS


def export_parquet(store: EventStore, directory: str, rows_per_file: int = 500_000) -> int:
    """Write every event up to the store's head; returns the position exported up to."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    end = store.head()
    buffer: list[tuple] = []
    part = 0

    def write() -> None:
        nonlocal part
        cols = list(zip(*buffer, strict=True))
        table = pa.Table.from_arrays([pa.array(c) for c in cols], names=FIELDS)
        pq.write_table(table, out / f"events-{part:05d}.parquet")
        part += 1
        buffer.clear()

    for rows in store.scan(0, end, chunk=50_000):
        buffer.extend(rows)
        if len(buffer) >= rows_per_file:
            write()
    if buffer:
        write()
    return end
