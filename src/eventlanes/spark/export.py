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


def _filesystem(directory: str) -> tuple[Any, str, str]:
    """(pyarrow filesystem, its path of ``directory``, the URI Spark reads it by). Plain
    paths are local; ``file://``, ``hdfs://``, ``s3a://`` (Hadoop's name of ``s3://``) and any
    other scheme pyarrow knows go through pyarrow's filesystem layer."""
    from pyarrow import fs

    if "://" not in directory:
        path = str(Path(directory).resolve())
        return fs.LocalFileSystem(), path, f"file://{path}"
    scheme, rest = directory.split("://", 1)
    arrow_uri = f"s3://{rest}" if scheme.lower() in ("s3a", "s3n") else directory
    try:
        filesystem, path = fs.FileSystem.from_uri(arrow_uri)
    except Exception as exc:  # noqa: BLE001 - unknown scheme, no libhdfs, no credentials
        raise InvalidInputError(f"cannot open {directory!r}: {exc}") from exc
    return filesystem, path.rstrip("/"), directory.rstrip("/")


def _info(filesystem: Any, path: str) -> Any:
    return filesystem.get_file_info(path)


def export_parquet(store: EventStore, directory: str, rows_per_file: int = 500_000) -> int:
    """Write every event up to the store's head; returns the position exported up to.

    ``directory``: a path, or a ``file://``, ``hdfs://`` or ``s3a://`` URI. A directory
    holding an earlier export (complete or not) is overwritten; a directory with anything
    else in it is refused, and nothing in it is deleted."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs

    filesystem, out, _ = _filesystem(directory)
    kind = _info(filesystem, out).type
    if kind == fs.FileType.File:
        raise InvalidInputError(f"export directory {directory!r} is a file")
    filesystem.create_dir(out, recursive=True)
    names = [
        info.base_name for info in filesystem.get_file_info(fs.FileSelector(out, recursive=False))
    ]
    ours = [n for n in names if _OURS.fullmatch(n)]
    others = sorted(n for n in names if n not in ours and n != MANIFEST)
    if others:
        raise InvalidInputError(
            f"export directory {directory!r} holds other files ({', '.join(others[:3])}): "
            "choose an empty directory"
        )
    if MANIFEST in names:  # no manifest: not a usable export until the end
        filesystem.delete_file(f"{out}/{MANIFEST}")
    for old in ours:
        filesystem.delete_file(f"{out}/{old}")
    end = store.head()
    buffer: list[tuple] = []
    files: dict[str, int] = {}

    def write(rows: list[tuple]) -> None:
        name = f"events-{len(files):05d}.parquet"
        pq.write_table(pa.Table.from_batches([arrow_batch(rows)]), f"{out}/{name}",
                       filesystem=filesystem)  # fmt: skip
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
    _write_atomically(filesystem, f"{out}/{MANIFEST}", json.dumps(manifest).encode())
    return end


def _write_atomically(filesystem: Any, path: str, data: bytes) -> None:
    """Readers see the whole manifest or none: a rename where the filesystem has one (local,
    HDFS); object stores make a single object visible whole anyway."""
    from pyarrow import fs

    if isinstance(filesystem, fs.S3FileSystem):
        with filesystem.open_output_stream(path) as f:
            f.write(data)
        return
    temp = f"{path}.tmp"
    with filesystem.open_output_stream(temp) as f:
        f.write(data)
    if isinstance(filesystem, fs.LocalFileSystem):  # the bytes on disk before the rename
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    filesystem.move(temp, path)


def read_manifest(directory: str, store: EventStore) -> dict[str, Any]:
    """The export's manifest, checked: every listed file is there with its row count, it was
    exported from a table of this name, and the store holds as many events up to the export's
    end. Otherwise a replay would miss or repeat events. ``paths``: the files as Spark reads
    them (URIs)."""
    import pyarrow.parquet as pq

    filesystem, base, uri = _filesystem(directory)
    path = f"{base}/{MANIFEST}"
    try:
        with filesystem.open_input_stream(path) as f:
            manifest = json.loads(f.read())
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
            found = pq.read_metadata(f"{base}/{name}", filesystem=filesystem).num_rows
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
    return {**manifest, "paths": [f"{uri}/{name}" for name in files]}
