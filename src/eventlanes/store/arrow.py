"""Bulk reads straight into Arrow: the rows of a position range as record batches. PostgreSQL's
are read by its ADBC driver (binary ``COPY``, in C, without a Python object per row); SQLite's
by Python's own SQLite library, never a second copy of it in the process (see
:meth:`eventlanes.store.sqlite.SQLiteEventStore.arrow_connection`). For the bulk paths
(Spark's range reads, Parquet exports); the stores' ``scan_arrow`` is the entry point.

The batches have the columns of :data:`FIELDS` (``recorded_at`` as epoch microseconds, data
and metadata as their JSON text), exactly what the row reads give. The reads only ever read:
SQLite's file is opened read-only (``mode=ro``) and PostgreSQL's session is read-only, however
the store was opened. Text that is not valid UTF-8 (written behind the store's back) fails the
read with :class:`~eventlanes.errors.CorruptEventError` naming the event, as the row scan does.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import CorruptEventError, DatabaseUnavailableError, StoreConnectionError

FIELDS = ["position", "stream_id", "version", "type", "data", "metadata", "recorded_at",
          "routing_hash"]  # fmt: skip
_TEXT = ("stream_id", "type", "data", "metadata")
#: rows per batch: Spark hands each batch to the JVM whole, and a batch per 1,024 rows (the
#: SQLite driver's default) costs a round of that hand-over each
BATCH_ROWS = 65_536


def schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("position", pa.int64()), ("stream_id", pa.string()), ("version", pa.int64()),
         ("type", pa.string()), ("data", pa.string()), ("metadata", pa.string()),
         ("recorded_at", pa.int64()), ("routing_hash", pa.int64())]
    )  # fmt: skip


def driver(backend: str) -> Any:
    """The ADBC DB-API module of ``backend`` (only "postgresql": SQLite is read by Python's
    own library), or a clear error naming the extra."""
    if backend != "postgresql":
        raise ValueError(f"no ADBC reads for {backend!r}")
    name = "adbc_driver_postgresql.dbapi"
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - the arrow extra installs them
        raise StoreConnectionError(
            f"Arrow reads need the ADBC drivers ({exc.name} is missing): "
            "pip install 'eventlanes[arrow]'"
        ) from None
    return module


def segment_literal(pairs: list[tuple[int, int]] | None) -> str:
    """The segment filter with its integers written into the SQL: PostgreSQL's ``COPY`` takes
    no parameters (and a parameterised query is read about 1.6x slower). Only integers that
    :func:`~eventlanes.store.base.segment_pairs` validated reach here."""
    if pairs is None:
        return ""
    conds = " OR ".join(f"(routing_hash & {int(mask)}) = {int(seg)}" for seg, mask in pairs)
    return f" AND ({conds})"


def translate(exc: BaseException, operation: str, where: str) -> Exception:
    """An ADBC driver's error as eventlanes' (see :meth:`Database.guard`)."""
    from adbc_driver_manager import dbapi

    cause = f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
    if isinstance(exc, dbapi.OperationalError) and "read-only" not in cause.lower():
        return DatabaseUnavailableError(operation, f"{cause} ({where})")
    return StoreConnectionError(f"{operation} failed: {cause} ({where})")


def checked(batch: Any, columns: list[str] | None = None) -> Any:
    """``batch`` with the types of :func:`schema` (its ``columns``, default all of
    :data:`FIELDS`), or CorruptEventError for its first row whose text is not valid UTF-8
    (the reason worded as the row reads word it)."""
    import pyarrow as pa

    names = columns or FIELDS
    full = schema()
    out_schema = pa.schema([full.field(n) for n in names])
    arrays = []
    for field in out_schema:
        col = batch.column(field.name)
        if isinstance(col.type, pa.ExtensionType):  # PostgreSQL's jsonb: arrow.json on text
            col = col.storage
        if col.type != field.type:
            col = col.cast(field.type)  # timestamptz (microseconds since 1970) to int64
        arrays.append(col)
    out = pa.RecordBatch.from_arrays(arrays, schema=out_schema)
    try:
        out.validate(full=True)  # checks every string's UTF-8, in C
    except pa.ArrowInvalid:
        _raise_corrupt(out)
        raise
    return out


def projection(columns: list[str] | None) -> list[str]:
    """The columns to read, validated (names go into SQL): a subset of :data:`FIELDS` in
    their order, position always included."""
    from ..errors import InvalidInputError

    if columns is None:
        return list(FIELDS)
    unknown = [c for c in columns if c not in FIELDS]
    if unknown or isinstance(columns, str):
        raise InvalidInputError(f"unknown event columns {unknown or columns!r}: use {FIELDS}")
    return [c for c in FIELDS if c in columns or c == "position"]


def _raise_corrupt(batch: Any) -> None:
    import pyarrow as pa

    present = [n for n in _TEXT if n in batch.schema.names]
    texts = {n: batch.column(n).cast(pa.binary()).to_pylist() for n in present}
    for i, position in enumerate(batch.column("position").to_pylist()):
        bad = [n for n in present if not _utf8(texts[n][i])]
        if not bad:
            continue
        if bad[0] in ("stream_id", "type"):  # the event cannot be trusted at all
            reason = f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not valid UTF-8"
        else:
            reason = f"{bad[0]} is not valid UTF-8"
        raise CorruptEventError(position, reason)


def _utf8(raw: bytes | None) -> bool:
    try:
        (raw or b"").decode()
    except UnicodeDecodeError:
        return False
    return True
