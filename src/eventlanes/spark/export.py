"""``eventlanes export --parquet DIR``: the store as Parquet files, for Spark replays that
should not hit the database (or run elsewhere).

Beside the files, ``_eventlanes.json`` records the position exported up to, the events table,
and every file with its row count. It is written last (atomically): without it a directory is
not an export. A replay from an export reads exactly the files listed, after checking their row
counts and that the store holds the same count of events up to the export's end; it sets the
tokens to that end, so the live processor folds what came later. Spark ignores files whose
names start with ``_``.

The export also stores what makes declarative replays cheap: the top-level properties of
``data`` as typed columns (``data_<name>``: long, double, string or boolean), for each property
whose values have one such type in the whole export (a property with mixed types, integers
beyond 64 bits, nested values, or any row whose data is not a JSON object: JSON only), and the
event types whose metadata mention a source chain. The manifest lists both (``columns``,
``chained_types``); a replay uses a column only where its type is the declared one and parses
the JSON otherwise, so strict types hold either way.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..columnar.json import inferred
from ..errors import InvalidInputError
from ..processing.tables.states import decode
from ..store import EventStore
from .source import FIELDS, PREFIX

MANIFEST = "_eventlanes.json"
_OURS = re.compile(r"events-\d{5}\.parquet")  # the files an export writes, and only those
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # the property names declarations accept
_MAX_COLUMNS = 32  # typed columns per file; further properties stay JSON only
_MAX_SEEN = 1000  # property names listed per file; beyond, the file types none
_INT64 = (-(2**63), 2**63 - 1)
_KINDS = {int: "long", float: "double", str: "string", bool: "boolean"}


def _decode(text: Any) -> Any:
    try:
        return decode(text)
    except (ValueError, TypeError):  # orjson refuses what the stdlib may read (NaN, surrogates)
        try:
            return json.loads(text)
        except (ValueError, TypeError):
            return None


def _kind(values: list[Any]) -> str | None:
    """The one Spark type of a property's values (None: null or absent), "" when every value
    is null (any type holds), or None."""
    classes = {v.__class__ for v in values}
    classes.discard(type(None))
    if not classes:
        return ""
    if len(classes) != 1:
        return None
    [cls] = classes
    kind = _KINDS.get(cls)
    if kind == "long":
        ints = [v for v in values if v is not None]
        if min(ints) < _INT64[0] or max(ints) > _INT64[1]:
            return None
    return kind


def typed_columns(rows: list[tuple]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reference (and the fallback of :func:`typed_arrays`): the typed columns of one
    file's rows (name -> Arrow array) and what the manifest records
    of them: ``columns`` (property -> type), ``untyped`` (other properties seen; None when too
    many to list, or when a row's data is not a JSON object: then no column can be trusted) and
    ``chained`` (event types with a source chain in their metadata)."""
    import pyarrow as pa

    chained = sorted({r[3] for r in rows if r[5] and '"source_chain"' in r[5]})
    datas = [_decode(r[4]) for r in rows]
    if not all(d.__class__ is dict for d in datas):
        return {}, {"columns": {}, "untyped": None, "chained": chained}
    names: set[str] = set().union(*datas) if datas else set()
    if len(names) > _MAX_SEEN:
        return {}, {"columns": {}, "untyped": None, "chained": chained}
    arrays: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    for name in sorted(names):
        if not _NAME.fullmatch(name) or len(arrays) >= _MAX_COLUMNS:
            continue
        values = [d.get(name) for d in datas]
        kind = _kind(values)
        if kind == "":  # null wherever present: a file without the column reads the same
            names.discard(name)
            continue
        if kind is None:
            continue
        try:
            arrays[PREFIX + name] = pa.array(values, type=getattr(pa, _ARROW[kind])())
        except (pa.ArrowException, UnicodeError, OverflowError):  # e.g. lone surrogates
            continue
        kinds[name] = kind
    untyped = sorted(names - set(kinds))
    return arrays, {"columns": kinds, "untyped": untyped, "chained": chained}


_ARROW = {"long": "int64", "double": "float64", "string": "string", "boolean": "bool_"}


def merge_typed(files: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The columns usable over the whole export: a property typed alike in every file that has
    it, and untyped in none (a file without the property reads it as null, as its JSON does)."""
    if any(f["untyped"] is None for f in files):
        columns: dict[str, str] = {}
    else:
        untyped = {n for f in files for n in f["untyped"]}
        kinds: dict[str, set[str]] = {}
        for f in files:
            for name, kind in f["columns"].items():
                kinds.setdefault(name, set()).add(kind)
        columns = {n: k.pop() for n, k in sorted(kinds.items()) if len(k) == 1 and n not in untyped}
    return columns, sorted({t for f in files for t in f["chained"]})


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


#: rows per Parquet row group: DuckDB's own row-group size (each of its threads takes whole
#: groups) and a few per file, so Spark's and DuckDB's readers skip groups by their position
#: statistics and split large files at group boundaries
ROW_GROUP = 122_880


def export_parquet(store: EventStore, directory: str, rows_per_file: int = 500_000) -> int:
    """Write every event up to the store's head; returns the position exported up to.

    ``directory``: a path, or a ``file://``, ``hdfs://`` or ``s3a://`` URI. A directory
    holding an earlier export (complete or not) is overwritten; a directory with anything
    else in it is refused, and nothing in it is deleted.

    The events are read straight into Arrow (``scan_arrow``) and each file is written by a
    second thread while the next one is read."""
    from concurrent.futures import Future, ThreadPoolExecutor

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
    files: dict[str, int] = {}
    typed: list[dict[str, Any]] = []
    pending: Future[None] | None = None
    buffer: list[Any] = []
    rows = 0

    def write(name: str, batches: list[Any]) -> None:
        table = _with_typed(batches, typed)
        _write_file(table, f"{out}/{name}", filesystem)

    with ThreadPoolExecutor(1, thread_name_prefix="eventlanes-export") as writer:

        def flush(batches: list[Any], count: int) -> None:
            nonlocal pending
            if pending is not None:
                pending.result()  # one file written at a time: memory stays two files
            name = f"events-{len(files):05d}.parquet"
            files[name] = count
            pending = writer.submit(write, name, batches)

        for batch in store.scan_arrow(0, end):
            while batch.num_rows:
                take = min(batch.num_rows, rows_per_file - rows)
                buffer.append(batch.slice(0, take))
                rows += take
                batch = batch.slice(take)
                if rows == rows_per_file:
                    flush(buffer, rows)
                    buffer, rows = [], 0
        if rows:
            flush(buffer, rows)
        if pending is not None:
            pending.result()
    columns, chained = merge_typed(typed)
    manifest = {"end": end, "events": sum(files.values()), "table": store.events_table,
                "files": files, "columns": columns, "chained_types": chained}  # fmt: skip
    _write_atomically(filesystem, f"{out}/{MANIFEST}", json.dumps(manifest).encode())
    return end


def _with_typed(batches: list[Any], typed: list[dict[str, Any]]) -> Any:
    """One file's events with their typed data columns (and what the manifest records of
    them appended to ``typed``)."""
    import pyarrow as pa

    table = pa.Table.from_batches(batches)  # chunks as read: the writer cuts row groups
    arrays, info = typed_arrays(table)
    typed.append(info)
    for name, array in arrays.items():
        table = table.append_column(name, array)
    return table


def _write_file(table: Any, path: str, filesystem: Any) -> None:
    import pyarrow.parquet as pq

    # Dictionaries only where values repeat (a dictionary tried on every data text and given
    # up doubled the write); statistics of the numbers (readers skip groups by position).
    pq.write_table(
        table,
        path,
        filesystem=filesystem,
        row_group_size=ROW_GROUP,
        use_dictionary=["stream_id", "type", "metadata"],
        write_statistics=["position", "version", "recorded_at", "routing_hash"],
    )


def typed_arrays(table: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`typed_columns` of a table of ``FIELDS``, parsed in C where that is exact (see
    :mod:`eventlanes.columnar.json`), else by :func:`typed_columns` in Python."""
    import pyarrow.compute as pc

    data, meta, types = table.column("data"), table.column("metadata"), table.column("type")
    found = inferred(data.combine_chunks())
    if found is None:
        columns = [table.column(i).to_pylist() for i in range(len(FIELDS))]
        return typed_columns(list(zip(*columns, strict=True)))
    mentions = pc.match_substring(meta, '"source_chain"')
    chained = sorted(pc.unique(pc.filter(types, mentions)).to_pylist())
    names = set(found)
    if len(names) > _MAX_SEEN:
        return {}, {"columns": {}, "untyped": None, "chained": chained}
    arrays: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    for name in sorted(names):
        if not _NAME.fullmatch(name) or len(arrays) >= _MAX_COLUMNS:
            continue
        kind, array = found[name]
        if kind == "":  # null wherever present: a file without the column reads the same
            names.discard(name)
            continue
        if kind is None:
            continue
        arrays[PREFIX + name] = array
        kinds[name] = kind
    untyped = sorted(names - set(kinds))
    return arrays, {"columns": kinds, "untyped": untyped, "chained": chained}


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
    manifest = load_manifest(directory, store)
    check_store(directory, manifest, store)
    return manifest


def check_store(directory: str, manifest: dict[str, Any], store: EventStore) -> None:
    """The store holds as many events up to the export's end as the export (a replay may run
    this while Spark reads the files: it only reads the store)."""
    end, events = int(manifest["end"]), int(manifest["events"])
    if end > store.head() or store.count(until=end) != events:
        raise InvalidInputError(
            f"the export in {directory!r} ({events:,} events up to position {end:,}) does not "
            f"match this store: export it again"
        )


def load_manifest(directory: str, store: EventStore) -> dict[str, Any]:
    """:func:`read_manifest` without the store's count (:func:`check_store`)."""
    import pyarrow.parquet as pq

    filesystem, base, uri = _filesystem(directory)
    path = f"{base}/{MANIFEST}"
    try:
        with filesystem.open_input_stream(path) as f:
            manifest = json.loads(f.read())
        manifest["end"], manifest["events"] = int(manifest["end"]), int(manifest["events"])
        events = manifest["events"]
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
    columns = manifest.get("columns")  # older exports have none: JSON only
    chained = manifest.get("chained_types")  # older exports: unknown (None)
    if not isinstance(columns, dict) or not all(
        isinstance(n, str) and _NAME.fullmatch(n) and k in _ARROW for n, k in columns.items()
    ):
        columns = {}
    if not (isinstance(chained, list) and all(isinstance(t, str) for t in chained)):
        chained = None
    return {**manifest, "columns": columns, "chained_types": chained,
            "paths": [f"{uri}/{name}" for name in files]}  # fmt: skip
