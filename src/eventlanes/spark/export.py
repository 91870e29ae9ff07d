"""``eventlanes export --parquet DIR``: the store as Parquet files, for Spark replays that
should not hit the database (or run elsewhere).

Beside the files, ``_eventlanes.json`` records the position exported up to and the count of
events: a replay from the export sets the tokens to that position (the live processor folds
what came later) and refuses an export that does not match the store. Spark ignores files
whose names start with ``_``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..store import EventStore
from .source import arrow_batch

MANIFEST = "_eventlanes.json"
_PATTERN = "events-*.parquet"


def export_parquet(store: EventStore, directory: str, rows_per_file: int = 500_000) -> int:
    """Write every event up to the store's head; returns the position exported up to.

    A directory holding an earlier export is overwritten; any other non-empty directory is
    refused (nothing is deleted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"export directory {directory!r} is a file")
    out.mkdir(parents=True, exist_ok=True)
    ours = {*out.glob(_PATTERN), out / MANIFEST}
    others = sorted(p.name for p in out.iterdir() if p not in ours)
    if others:
        raise InvalidInputError(
            f"export directory {directory!r} holds other files ({', '.join(others[:3])}): "
            "choose an empty directory"
        )
    (out / MANIFEST).unlink(missing_ok=True)  # no manifest: not a usable export until the end
    for old in out.glob(_PATTERN):
        old.unlink()
    end = store.head()
    buffer: list[tuple] = []
    part = written = 0

    def write(rows: list[tuple]) -> None:
        nonlocal part, written
        table = pa.Table.from_batches([arrow_batch(rows)])
        pq.write_table(table, out / f"events-{part:05d}.parquet")
        part += 1
        written += len(rows)

    for rows in store.scan(0, end, chunk=50_000):
        buffer.extend(rows)
        while len(buffer) >= rows_per_file:
            write(buffer[:rows_per_file])
            del buffer[:rows_per_file]
    if buffer:
        write(buffer)
    manifest = {"end": end, "events": written, "table": store.events_table}
    (out / MANIFEST).write_text(json.dumps(manifest))
    return end


def read_manifest(directory: str, store: EventStore) -> dict[str, Any]:
    """The export's manifest, checked against ``store``: its events up to the export's end
    must be those exported (same count), or the replay would miss or invent events."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        end, events = int(manifest["end"]), int(manifest["events"])
    except FileNotFoundError:
        raise InvalidInputError(
            f"{directory!r} is not a complete eventlanes export (no {MANIFEST}): "
            "run `eventlanes export --parquet` again"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInputError(f"{path}: unreadable export manifest ({exc})") from None
    if end > store.head() or store.count(until=end) != events:
        raise InvalidInputError(
            f"the export in {directory!r} ({events:,} events up to position {end:,}) does not "
            f"match this store: export it again"
        )
    return manifest
