"""Projection replays on Spark: the executors run handlers per segment and commit with their
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..admin.reset import rewind
from ..processing.handling.context import Context
from ..processing.handling.dispatch import Dispatch
from ..processing.runtime import Runtime
from ..tokens import Token
from .input import ReplayInput, check_read


@dataclass
class _ProjectionSpec:
    name: str
    url: str
    owner: str
    dispatch: Dispatch
    policy: Any
    segments: list[tuple[int, int]]
    claim_timeout: float
    chunk: int


def _route(spec: _ProjectionSpec, batches: Any) -> Any:
    import pyarrow as pa

    from ..events import Event

    by_mask: dict[int, set[int]] = {}
    for seg_id, mask in spec.segments:
        by_mask.setdefault(mask, set()).add(seg_id)
    for batch in batches:
        cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        seg_col = []
        for row in zip(*cols, strict=True):
            h = spec.policy.routing_hash(Event(*row))
            seg_col.append(next(h & m for m, ids in by_mask.items() if h & m in ids))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(seg_col, pa.int64())], names=[*batch.schema.names, "seg"]
        )


def _handle(spec: _ProjectionSpec, batches: Any) -> Any:
    """One segment per partition, in position order: handlers and the segment's token commit
    together every ``chunk`` events (fenced by the replay's claim)."""
    import pyarrow as pa

    from ..db import open_database
    from ..events import Event
    from ..segments import Segment
    from ..tokens import SQLTokenStore
    from .ship import open_readonly

    open_readonly(spec.url).close()  # never create a database the driver does not use
    db = open_database(spec.url)
    tokens = SQLTokenStore(db, spec.claim_timeout)
    masks = dict(spec.segments)
    counts: dict[int, int] = {}
    pending: list[Event] = []
    current: int | None = None

    def commit(seg_id: int) -> None:
        # A retried (or re-run) task starts its partition again: what an earlier attempt
        # committed is behind the segment's stored token, and is not handled twice.
        # The stored token is the reset's (see _run_projection): it says which events were
        # handled before (replays, skipped by disallow_replay handlers) and which are new.
        stored = tokens.token(spec.name, seg_id) or Token(0)
        todo = [e for e in pending if e.position > stored.position]
        if todo:
            with db.transaction() as conn:
                ctx = Context.for_batch(db, spec.name, Segment(seg_id, masks[seg_id]), stored, conn)
                spec.dispatch.run(todo, ctx, stored)  # per-event and on_batch handlers
                done = stored.advance(todo[-1].position)
                tokens.store(spec.name, seg_id, done, spec.owner, conn=conn)
        counts[seg_id] = counts.get(seg_id, 0) + len(pending)
        pending.clear()

    try:
        for batch in batches:
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            for row in zip(*cols, strict=True):
                seg_id = row[8]
                if seg_id != current and pending:
                    commit(current)  # type: ignore[arg-type]
                current = seg_id
                pending.append(Event(*row[:8]))
                if len(pending) >= spec.chunk:
                    commit(seg_id)
        if pending and current is not None:
            commit(current)
    finally:
        db.close()
    if counts:
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(counts)), pa.array(list(counts.values()))], names=["seg", "events"]
        )


def replay_projection(
    app: Any, proc: Any, source: ReplayInput, url: str, owner: str, records: list
) -> int:
    from pyspark import StorageLevel
    from pyspark.sql.types import LongType, StructField, StructType

    rt = app.runtime
    dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
    df = source.events
    segments = [(r.segment.id, r.segment.mask) for r in records]
    spec = _ProjectionSpec(proc.name, url, owner, dispatch, proc.policy, segments,
                           rt.claim_timeout, 5000)  # fmt: skip
    schema = StructType([*df.schema.fields, StructField("seg", LongType())])
    routed = df.mapInArrow(lambda it: _route(spec, it), schema)
    routed = routed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # Read (and count) everything before any handler runs: a short read writes nothing.
        routed.count()
        check_read(proc.name, "read", source.read(), source.expected)
        source.verify()
        return _run_projection(rt, proc, spec, routed, source, owner, records)
    finally:
        routed.unpersist()


def _run_projection(
    rt: Runtime,
    proc: Any,
    spec: _ProjectionSpec,
    routed: Any,
    source: ReplayInput,
    owner: str,
    records: list,
) -> int:
    # A reset to the start: what each segment (each part of it) had handled is a replay; the
    # rest is new, also for the live processor if the replay stops half-way.
    rewind(rt, proc, owner, records, {"": 0})
    n = len(spec.segments)
    ordered = routed.repartition(n, "seg").sortWithinPartitions("seg", "position")
    counts = ordered.mapInArrow(lambda it: _handle(spec, it), "seg long, events long").collect()
    # Each segment's token is at the last event its handlers committed; all move to the end
    # only if every event of the store was handled.
    handled = check_read(proc.name, "handled", sum(r["events"] for r in counts), source.expected)
    with rt.db.transaction() as conn:
        for record in records:
            done = (rt.tokens.token(proc.name, record.segment.id) or Token(0)).advance(source.end)
            rt.tokens.store(proc.name, record.segment.id, done, owner, conn=conn)
    return handled
