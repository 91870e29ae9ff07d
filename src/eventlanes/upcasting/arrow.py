"""Upcasting events held as Arrow columns (the Spark readers, the PostgreSQL Arrow fold).

A batch without an event of an upcast type is returned as it is, after one test in C (the
usual batch, once history has been upcast). Otherwise the old rows alone become events, run
through their upcasters in Python (the user's functions) and go back as their new ``type`` and
``data`` text; the other rows, and every other column, are not touched. A failure raises
:class:`~eventlanes.errors.UpcastError` naming the event: a bulk job fails on it, a fold in
Arrow leaves the range to the row path (which parks or retries the event's key).
"""

from __future__ import annotations

from typing import Any

from ..events import Event, stored_data
from .registry import Upcasters

#: the columns an upcaster's event is built from, in ``Event``'s order
EVENT_COLUMNS = ("position", "stream_id", "version", "type", "data", "metadata", "recorded_at",
                 "routing_hash")  # fmt: skip


def upcast_batch(upcasters: Upcasters, batch: Any) -> Any:
    """``batch`` (a ``pyarrow.RecordBatch`` holding :data:`EVENT_COLUMNS`) with the rows of
    upcast types in their current shape."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return batch
    kinds = batch.column("type")
    old = pc.is_in(kinds, value_set=pa.array(sorted(upcasters.sources()), kinds.type))
    if not pc.any(old).as_py():
        return batch
    rows = batch.filter(old)
    columns = [rows.column(name).to_pylist() for name in EVENT_COLUMNS]
    new_types: list[str] = []
    new_data: list[str] = []
    for row in zip(*columns, strict=True):
        event = upcasters.upcast_strict(Event(*row))
        new_types.append(event.type)
        text = stored_data(event)  # the checked JSON text
        assert isinstance(text, str)
        new_data.append(text)
    data = batch.column("data")
    replaced = {
        "type": pc.replace_with_mask(kinds, old, pa.array(new_types, kinds.type)),
        "data": pc.replace_with_mask(data, old, pa.array(new_data, data.type)),
    }
    names = batch.schema.names
    arrays = [replaced.get(name, batch.column(name)) for name in names]
    return pa.RecordBatch.from_arrays(arrays, names=names)
