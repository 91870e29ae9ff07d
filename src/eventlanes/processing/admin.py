"""Inspecting and steering processors: status, reset/replay, split/merge/release, dead letters."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import EventlanesError, InvalidInputError
from ..segments import Segment
from ..tokens import Token
from ..tokens.base import resolve_initial
from .context import Context
from .runner import node_name

if TYPE_CHECKING:
    from ..app import App
    from .processor import Processor


class ProcessorBusyError(EventlanesError):
    """The operation needs every segment, and a live node holds one."""


@dataclass(frozen=True)
class SegmentView:
    segment: Segment
    position: int
    lag: int
    owner: str | None
    claim_age: float | None
    caught_up: bool
    replaying: bool
    last_error: str | None
    errors: int
    retry_in: float | None
    request: str | None
    token: Token


@dataclass(frozen=True)
class ProcessorView:
    name: str
    head: int
    segments: list[SegmentView]
    live_nodes: list[str]
    dead_letters: int

    @property
    def position(self) -> int:
        return min((s.position for s in self.segments), default=0)

    @property
    def caught_up(self) -> bool:
        return all(s.caught_up for s in self.segments)

    @property
    def lag(self) -> int:
        return max((s.lag for s in self.segments), default=0)


def status(app: App, proc: Processor) -> ProcessorView:
    head = app.store.head()
    views = []
    for s in app.tokens.status(proc.name):
        position = s.token.position
        views.append(
            SegmentView(
                s.segment,
                position,
                max(0, head - position),
                s.owner,
                s.claim_age,
                position >= head,
                s.token.replaying,
                s.last_error,
                s.errors,
                s.retry_in,
                s.request,
                s.token,
            )
        )
    parked = app.dead_letters.count(proc.name) if proc.on_error == "dead_letter" else 0
    return ProcessorView(proc.name, head, views, app.tokens.live_nodes(proc.name), parked)


def claim_all(app: App, proc: Processor, owner: str, wait: bool, timeout: float | None) -> list:
    """Claim every segment of ``proc`` (the processor must be stopped everywhere)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    app.initialize(proc.name)
    records = []
    try:
        while True:
            busy = []
            for s in app.tokens.status(proc.name):
                if any(r.segment.id == s.segment.id for r in records):
                    continue
                record = app.tokens.claim(proc.name, s.segment.id, owner, ignore_backoff=True)
                if record is None:
                    busy.append(s)
                else:
                    records.append(record)
            if not busy:
                return records
            if not wait or (deadline is not None and time.monotonic() > deadline):
                held = ", ".join(
                    f"{s.segment} by {s.owner} (claim expires in {s.claim_expires_in or 0:.1f} s)"
                    for s in busy
                )
                raise ProcessorBusyError(
                    f"processor {proc.name!r} is running: {held}. Stop it everywhere first"
                    + ("" if wait else " or wait for it (--wait)")
                )
            time.sleep(0.2)
    except BaseException:
        for r in records:
            app.tokens.release(proc.name, r.segment.id, owner)
        raise


def reset(
    app: App,
    proc: Processor,
    to: str | int | datetime = "tail",
    wait: bool = False,
    timeout: float | None = None,
    context: Any = None,
) -> int:
    """Reset a stopped processor to ``to``; returns the position it restarts from.

    Runs the ``on_reset`` handlers and writes replay tokens in one transaction: events up to
    where each segment had got are replays (``ctx.is_replay``; ``disallow_replay`` handlers
    skip them). Parked dead letters of the processor are dropped: the replay delivers them again.
    """
    target = resolve_initial(to, app.store)
    # Other sources restart from the same moment: a position is turned into its time.
    when: Any = to
    if isinstance(to, int) and proc.sources:
        at = app.store.read(after=max(0, to - 1), limit=1) if to else []
        when = at[0].recorded_at if at else ("tail" if not to else "head")
    targets = {name: resolve_initial(when, app.source_store(t)) for name, t in proc.sources.items()}
    owner = f"reset:{node_name()}"
    records = claim_all(app, proc, owner, wait, timeout)
    try:
        db = app.db
        with db.transaction() as conn:
            ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
            for handler in proc.handlers.reset_handlers:
                handler(ctx)
            for record in records:
                token = Token.reset(record.token, target, context)
                for name, position in targets.items():
                    before = record.token.source(name)
                    token = token.with_source(name, Token.reset(before, position, context))
                app.tokens.store(proc.name, record.segment.id, token, owner, conn=conn)
            app.dead_letters.clear(conn, proc.name)
    finally:
        for record in records:
            app.tokens.release(proc.name, record.segment.id, owner)
    return target


def steer(app: App, proc: Processor, segment_id: int, what: str, timeout: float = 15.0) -> str:
    """Split, merge or release a segment: directly when no live node holds what is needed,
    otherwise by asking the owner through the token store and waiting for it to act."""
    rows = {s.segment.id: s for s in app.tokens.status(proc.name)}
    if segment_id not in rows:
        raise InvalidInputError(f"processor {proc.name!r} has no segment {segment_id}")
    before = {s.segment for s in rows.values()}
    segment = rows[segment_id].segment
    owner = f"cli:{node_name()}"
    if what == "release":
        if rows[segment_id].owner is None:
            return f"{segment} is not claimed"
        app.tokens.request(proc.name, segment_id, "release")
        return _await(app, proc, timeout, lambda st: st[segment_id].owner is None or
                      st[segment_id].owner != rows[segment_id].owner,
                      f"released {segment}")  # fmt: skip
    needed = [segment_id]
    if what == "merge":
        if segment.mask == 0:
            raise InvalidInputError(f"segment {segment} is the root: nothing to merge")
        needed.append(segment.sibling().id)
    got = []
    for seg_id in needed:
        if seg_id in rows and app.tokens.claim(proc.name, seg_id, owner) is not None:
            got.append(seg_id)
    try:
        if len(got) == len(needed):
            if what == "split":
                a, b = app.tokens.split(proc.name, segment_id, owner)
                return f"split {segment} into {a} and {b}"
            merged = app.tokens.merge(proc.name, segment_id, owner)
            return f"merged {segment} and {segment.sibling()} into {merged}"
    finally:
        for seg_id in got:
            if seg_id in {s.segment.id for s in app.tokens.status(proc.name)}:
                app.tokens.release(proc.name, seg_id, owner)
    # A live node holds it: ask the owner.
    target = needed[0] if rows[needed[0]].owner else needed[-1]
    app.tokens.request(proc.name, segment_id if what == "split" else target, what)
    return _await(
        app,
        proc,
        timeout,
        lambda st: {s.segment for s in st.values()} != before,
        f"{what} of {segment} done by its owner",
    )


def _await(app: App, proc: Processor, timeout: float, done: Any, message: str) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {s.segment.id: s for s in app.tokens.status(proc.name)}
        if done(rows):
            return message
        time.sleep(0.2)
    raise ProcessorBusyError(
        f"asked the owner of processor {proc.name!r}; it did not act within {timeout:.0f} s "
        "(the request stays pending until it does)"
    )


def retry_dead_letters(
    app: App, proc: Processor, key: str | None = None, position: int | None = None
) -> tuple[int, int]:
    """Re-run parked events, in order per key, each key in one transaction with the deletion of
    its dead letters (only ``key``'s, or the one at ``position``, when given). Returns (events
    handled, events of the selection still parked)."""
    letters = app.dead_letters.list(proc.name, key=key, position=position)
    if position is not None and letters and letters[0].seq_key is not None:
        # Retrying a later event of a key before its earlier parked ones breaks per-key order.
        first = app.dead_letters.list(proc.name, key=letters[0].seq_key)[0]
        if first.position < position:
            raise InvalidInputError(
                f"dead letter at position {position} waits behind position {first.position} "
                f"of the same key {first.seq_key!r}: retry that one first, or the whole key"
            )
    groups: dict[Any, list] = {}
    for letter in letters:  # ordered by position
        groups.setdefault(letter.seq_key or f"#{letter.position}", []).append(letter)
    handled = 0
    db = app.db
    for group in groups.values():
        events = [app.store.read(after=d.position - 1, limit=1)[0] for d in group]
        done: list[int] = []
        try:
            with db.transaction() as conn:
                ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
                for event in events:
                    for handler in proc.handlers.for_type(event.type):
                        handler(event, ctx)
                    done.append(event.position)
                app.dead_letters.delete(conn, proc.name, done)
            handled += len(done)
        except Exception as exc:  # noqa: BLE001 - recorded on the dead letter, key stays parked
            failed = events[len(done)] if len(done) < len(events) else events[-1]
            app.dead_letters.record_failure(
                proc.name, failed.position, f"{type(exc).__name__}: {exc}"
            )
    return handled, len(letters) - handled


def discard_dead_letters(
    app: App, proc: Processor, key: str | None = None, position: int | None = None
) -> int:
    letters = app.dead_letters.list(proc.name, key=key, position=position)
    with app.db.transaction() as conn:
        app.dead_letters.delete(conn, proc.name, [d.position for d in letters])
    return len(letters)


__all__ = [
    "ProcessorBusyError",
    "ProcessorView",
    "SegmentView",
    "discard_dead_letters",
    "reset",
    "retry_dead_letters",
    "status",
    "steer",
]
