"""A declarative aggregation's partial results over a range of events held as Arrow columns:
per key, the events, first and last position and a partial per field, in the shape the SQLite
pushdown's statement returns (``[key, events, first position, last position, partial...]``,
first and last values as ``(position, value)``), so that the same merge folds them into the
states. Computed in C (pyarrow's hash aggregates), no Python object per event.

Exact, or None (the caller folds the range by rows, which raises the errors naming the
event): every event must have empty metadata (the dedupe's fast rule, as the SQLite pushdown),
a key that is a JSON string, and declared properties of their declared type or null
(:func:`.json.declared` decides that); integer sums must fit in 64 bits per range (checked
from the largest value: Python's integers would not overflow).
"""

from __future__ import annotations

from typing import Any

_INT64_MAX = 2**63 - 1
_AGGREGATE = {"count": "count", "sum": "sum", "min": "min", "max": "max", "first": "first",
              "last": "last"}  # fmt: skip


#: one state field: (kind, data property or None for count(), ((property, value), ...) where)
Field = tuple[str, str | None, tuple[tuple[str, Any], ...]]


def groups(
    table: Any, key: str, kinds: dict[str, str], fields: list[Field]
) -> list[list[Any]] | None:
    """The partials of ``table`` (columns ``position``, ``data``, ``metadata``: the events
    folded, in position order) per key (the string property ``key``), or None when not
    exact. ``kinds``: every property read (``key`` included) -> its Spark type name."""
    import pyarrow.compute as pc

    from .json import declared

    n = table.num_rows
    if n == 0:
        return []
    if not pc.all(pc.equal(table.column("metadata"), "{}")).as_py():
        return None
    found = declared(table.column("data").combine_chunks(), kinds)
    if found is None:
        return None
    keys = found[key]
    if keys.null_count:  # the row path names the event without a key
        return None
    result = partials(keys, table.column("position").combine_chunks(), found, fields)
    if result is None:
        return None
    located = [4 + j for j, (kind, _, _) in enumerate(fields) if kind in ("first", "last")]
    out = [result.column(c).to_pylist() for c in ["key", "events", "first", "last"]]
    out += [result.column(f"f{j}").to_pylist() for j in range(len(fields))]
    rows = [list(row) for row in zip(*out, strict=True)]
    for row in rows:
        for i in located:
            if row[i] is not None:
                row[i] = (None, row[i])  # the merge takes the value (ranges come in order)
    return rows


def partials(keys: Any, positions: Any, found: dict[str, Any], fields: list[Field]) -> Any:
    """Per key (``keys``: a string array without nulls), over events in position order: a
    table of ``key``, ``events``, ``first`` and ``last`` position, ``f<j>`` the partial of
    field j and, for first/last fields, ``at<j>`` the position of that value; or None when
    not exact (a sum that may pass 64 bits, an aggregate pyarrow lacks for a type).
    ``found``: the properties read, as :func:`.json.declared` gives them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(keys)
    columns: dict[str, Any] = {"k": keys, "p": positions}
    aggregates: list[tuple[Any, ...]] = [([], "count_all"), ("p", "min"), ("p", "max")]
    names = ["key", "events", "first", "last"]
    for j, (kind, prop, where) in enumerate(fields):
        cond = None
        for name, value in where:
            test = pc.fill_null(pc.equal(found[name], pa.scalar(value, found[name].type)), False)
            cond = test if cond is None else pc.and_(cond, test)
        name = f"f{j}"
        names.append(name)
        if prop is None:  # count() of events (that match)
            columns[name] = pc.cast(cond, pa.int64()) if cond is not None else pa.repeat(1, n)
            aggregates.append((name, "sum"))
            continue
        values = found[prop]
        if cond is not None:
            values = pc.if_else(cond, values, pa.scalar(None, values.type))
        if kind == "sum" and values.null_count < n:
            largest = pc.max(pc.abs_checked(values)).as_py()
            if largest * (n - values.null_count) > _INT64_MAX:
                return None
        columns[name] = values
        aggregates.append((name, _AGGREGATE[kind]))
        if kind in ("first", "last"):  # where that value is: merges need not come in order
            columns[f"a{j}"] = pc.if_else(pc.is_valid(values), positions,
                                          pa.scalar(None, pa.int64()))  # fmt: skip
            aggregates.append((f"a{j}", "min" if kind == "first" else "max"))
            names.append(f"at{j}")
    try:
        result = (
            pa.table(columns)
            .group_by("k", use_threads=False)  # in order: first and last need it
            .aggregate(aggregates)
        )
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    # aggregate() names its outputs "<column>_<function>", in the order asked, then the key
    ordered = [result.column("k")]
    ordered += [result.column(f"{c}_{f}" if c else f) for c, f in aggregates]
    return pa.Table.from_arrays(ordered, names=names)
