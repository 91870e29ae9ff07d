"""``eventlanes export --parquet DIR``: the store as Parquet files, for Spark replays that
should not hit the database (or run elsewhere).

Beside the files, ``_eventlanes.json`` records the position exported up to, the events table,
and every file with its row count. It is written last (atomically): without it a directory is
not an export. A replay from an export reads exactly the files listed, after checking their row
counts and that the store holds the same count of events up to the export's end; it sets the
tokens to that end, so the live processor folds what came later. Spark ignores files whose
names start with ``_``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..store import EventStore
from .source import arrow_batch

MANIFEST = "_eventlanes.json"
_OURS = re.compile(r"events-\d{5}\.parquet")  # the files an export writes, and only those


def export_parquet(store: EventStore, directory: str, rows_per_file: int = 500_000) -> int:
    """Write every event up to the store's head; returns the position exported up to.

    A directory holding an earlier export (complete or not) is overwritten; a directory with
    anything else in it is refused, and nothing in it is deleted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"export directory {directory!r} is a file")
    out.mkdir(parents=True, exist_ok=True)
    ours = [p for p in out.iterdir() if p.is_file() and _OURS.fullmatch(p.name)]
    others = sorted(p.name for p in out.iterdir() if p not in ours and p.name != MANIFEST)
    if others:
        raise InvalidInputError(
            f"export directory {directory!r} holds other files ({', '.join(others[:3])}): "
            "choose an empty directory"
        )
    (out / MANIFEST).unlink(missing_ok=True)  # no manifest: not a usable export until the end
    for old in ours:
        old.unlink()
    end = store.head()
    buffer: list[tuple] = []
    files: dict[str, int] = {}

    def write(rows: list[tuple]) -> None:
        name = f"events-{len(files):05d}.parquet"
        pq.write_table(pa.Table.from_batches([arrow_batch(rows)]), out / name)
        files[name] = len(rows)

    for rows in store.scan(0, end, chunk=50_000):
        buffer.extend(rows)
        while len(buffer) >= rows_per_file:
            write(buffer[:rows_per_file])
            del buffer[:rows_per_file]
    if buffer:
        write(buffer)
    manifest = {"end": end, "events": sum(files.values()), "table": store.events_table,
                "files": files}  # fmt: skip
    temp = out / f"{MANIFEST}.tmp"
    with open(temp, "w") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, out / MANIFEST)
    return end


def read_manifest(directory: str, store: EventStore) -> dict[str, Any]:
    """The export's manifest, checked: every listed file is there with its row count, it was
    exported from a table of this name, and the store holds as many events up to the export's
    end. Otherwise a replay would miss or repeat events."""
    import pyarrow.parquet as pq

    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        end, events = int(manifest["end"]), int(manifest["events"])
        files = {str(name): int(rows) for name, rows in manifest["files"].items()}
        table = str(manifest["table"])
    except FileNotFoundError:
        raise InvalidInputError(
            f"{directory!r} is not a complete eventlanes export (no {MANIFEST}): "
            "run `eventlanes export --parquet` again"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"{path}: unreadable export manifest ({exc})") from None
    for name, rows in files.items():
        try:
            found = pq.read_metadata(Path(directory) / name).num_rows
        except (OSError, ValueError) as exc:  # missing, truncated, not Parquet
            raise InvalidInputError(f"export {directory!r}: {name} unreadable ({exc})") from None
        if found != rows:
            raise InvalidInputError(
                f"export {directory!r}: {name} has {found:,} rows, the manifest says {rows:,}"
            )
    if table != store.events_table or sum(files.values()) != events:
        raise InvalidInputError(f"export {directory!r} is of table {table!r}, not this store's")
    if end > store.head() or store.count(until=end) != events:
        raise InvalidInputError(
            f"the export in {directory!r} ({events:,} events up to position {end:,}) does not "
            f"match this store: export it again"
        )
    return {**manifest, "paths": [str(Path(directory) / name) for name in files]}
