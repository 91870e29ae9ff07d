"""Dead letters: list, retry through the processor's own dispatch, discard."""

from __future__ import annotations

from contextlib import ExitStack
from itertools import groupby

from ..errors import InvalidInputError
from ..events import Event
from ..processing.handling.context import Context
from ..processing.handling.dispatch import Dispatch
from ..processing.handling.failures import describe
from ..processing.processor import Processor
from ..processing.runtime import Runtime
from ..processing.tables.dead_letters import DeadLetter
from ..tracing import spans


def list_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> list[DeadLetter]:
    """Parked events of ``proc`` (of one key, or one position), in position order."""
    return rt.dead_letters.list(proc.name, key=key, position=position)


def events_at(rt: Runtime, positions: list[int]) -> list[Event]:
    """The events at ``positions``, in their current shapes (as the handlers saw them)."""
    found = []
    for position in positions:
        events = rt.store.read(after=position - 1, limit=1) if position >= 1 else []
        if not events or events[0].position != position:
            raise InvalidInputError(f"no event at position {position} in the store")
        found.append(events[0])
    return rt.upcasters.events(found)


def retry_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> tuple[int, int]:
    """Re-run parked events (all, one key's, or one position's), in order per key, each key in
    one transaction with the deletion of its dead letters. Per-event and ``on_batch`` handlers
    run as in the live processor. Returns (events handled, events of the selection still
    parked). An event parked while it was replayed (after a reset) is retried as a replay.
    Retrying one position of a key with earlier parked events is refused: it would overtake
    them."""
    letters = list_dead_letters(rt, proc, key, position)
    if position is not None and letters and letters[0].seq_key is not None:
        # Retrying a later event of a key before its earlier parked ones breaks per-key order.
        first = list_dead_letters(rt, proc, letters[0].seq_key)[0]
        if first.position < position:
            raise InvalidInputError(
                f"dead letter at position {position} waits behind position {first.position} "
                f"of the same key {first.seq_key!r}: retry that one first, or the whole key"
            )
    groups: dict[str, list[DeadLetter]] = {}
    for letter in letters:  # ordered by position
        groups.setdefault(letter.seq_key or f"#{letter.position}", []).append(letter)
    handled = 0
    db = rt.db
    dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
    tracer = spans.tracer()
    for key, group in groups.items():
        events = events_at(rt, [d.position for d in group])
        with ExitStack() as traced:
            if tracer is not None:  # a span per key, child of the caller's, linked to appends
                base = spans.base_attributes(proc.name, None, proc.guarantee.value, proc.version)
                extra = {spans.KEY: key} if group[0].seq_key is not None else None
                traced.enter_context(spans.batch(tracer, "retry", base, events, root=False,
                                                 extra=extra))  # fmt: skip
            try:
                with db.transaction() as conn:
                    ctx = Context.for_batch(db, proc.name, connection=conn)
                    # each run of replays (parked while replayed) and of first deliveries as
                    # it was then: disallow_replay handlers skip the replays
                    flagged = zip(events, (d.replay for d in group), strict=True)
                    for replay, run in groupby(flagged, key=lambda pair: pair[1]):
                        dispatch.run([e for e, _ in run], ctx, replay)
                    rt.dead_letters.delete(conn, proc.name, [e.position for e in events])
                handled += len(events)
            except Exception as exc:  # noqa: BLE001 - recorded on the dead letter, key stays
                failed = getattr(exc, "event", None) or events[0]
                rt.dead_letters.record_failure(proc.name, failed.position, describe(exc))
                spans.failed(exc, describe(exc))
    return handled, len(letters) - handled


def discard_dead_letters(
    rt: Runtime, proc: Processor, key: str | None = None, position: int | None = None
) -> int:
    letters = list_dead_letters(rt, proc, key, position)
    with rt.db.transaction() as conn:
        rt.dead_letters.delete(conn, proc.name, [d.position for d in letters])
    return len(letters)
