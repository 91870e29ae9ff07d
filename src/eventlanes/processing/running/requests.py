"""Split, merge and release requests that other nodes leave in the token store for the owner
of a segment; carried out by the owner between batches, or refused with the reason (which the
asking command reads at once)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from ...errors import ClaimLostError, InvalidInputError, ProcessorBusyError
from ...segments import Segment
from ...tokens import SegmentStatus, Token, TokenRecord, TokenStore
from ...tokens.claims import node_name
from ..processor import Processor
from ..runtime import Runtime
from ..segment import SegmentState

log = logging.getLogger("eventlanes.processing")

#: called before a held segment changes or goes (tracking mode stops its thread)
Drop = Callable[[SegmentState], None]
#: stores a held segment's token (and what the executor holds for it) before it changes or goes
Persist = Callable[[SegmentState], None]


class Holder(Protocol):
    """What carrying out a request needs from the node holding the segments."""

    name: str
    owner: str
    tokens: TokenStore
    persist: Persist
    claimed: dict[int, SegmentState]

    def claim(self, seg_id: int) -> TokenRecord | None: ...

    def acquire(self, segment: Segment, token: Token) -> SegmentState: ...

    def release(self, st: SegmentState, drop: Drop, hold_off: float) -> None: ...

    def forget(self, seg_id: int) -> None: ...


def carry_out(c: Holder, status: dict[int, SegmentStatus], drop: Drop) -> None:
    for seg_id, st in list(c.claimed.items()):
        request = status[seg_id].request if seg_id in status else None
        if request is None:
            continue
        try:
            if request == "release":
                c.tokens.request(c.name, seg_id, None)
                c.release(st, drop, hold_off=c.tokens.claim_timeout)
            elif request == "split":
                drop(st)
                c.persist(st)
                keep, new = c.tokens.split(c.name, seg_id, c.owner)
                st.segment = keep
                st.token = st.token.for_segment(keep)
                log.info("%s: split %s into %s and %s", c.name, seg_id, keep, new)
            elif request == "merge":
                _merge(c, st, status, drop)
        except (ClaimLostError, InvalidInputError) as exc:
            log.warning("%s: %s request on %s refused: %s", c.name, request, seg_id, exc)
            c.tokens.refuse(c.name, seg_id, str(exc), what=request)


def _merge(c: Holder, st: SegmentState, status: dict[int, SegmentStatus], drop: Drop) -> None:
    sibling = st.segment.sibling()
    row = status.get(sibling.id)
    if row is None or row.segment != sibling:
        raise InvalidInputError(f"sibling {sibling} of {st.segment} is split further")
    if sibling.id not in c.claimed:
        record = c.claim(sibling.id)
        if record is None:
            # Ask the sibling's owner to let go; merge on a later round.
            c.tokens.request(c.name, sibling.id, "release")
            return
        c.acquire(record.segment, record.token)
    other = c.claimed[sibling.id]
    for s in (st, other):
        drop(s)
        c.persist(s)
    merged = c.tokens.merge(c.name, st.segment.id, c.owner)
    c.forget(st.segment.id)
    c.forget(sibling.id)
    token = c.tokens.token(c.name, merged.id)
    assert token is not None
    c.acquire(merged, token)
    log.info("%s: merged %s and %s into %s", c.name, st.segment, sibling, merged)


def steer(rt: Runtime, proc: Processor, segment_id: int, what: str, timeout: float = 15.0) -> str:
    """Split, merge or release a segment: directly when no live node holds what is needed,
    otherwise by asking the owner through the token store and waiting for it to act."""
    tokens = rt.tokens
    rt.initialize(*proc.token_spec())
    rows = {s.segment.id: s for s in tokens.status(proc.name)}
    if segment_id not in rows:
        raise InvalidInputError(f"processor {proc.name!r} has no segment {segment_id}")
    before = {s.segment for s in rows.values()}
    segment = rows[segment_id].segment
    owner = f"cli:{node_name()}"
    if what == "release":
        if rows[segment_id].owner is None:
            return f"{segment} is not claimed"
        tokens.request(proc.name, segment_id, "release")
        holder = rows[segment_id].owner
        return _await(
            rt, proc, timeout,
            lambda st: st[segment_id].owner is None or st[segment_id].owner != holder,
            f"released {segment}",
        )  # fmt: skip
    needed = [segment_id]
    if what == "merge":
        if segment.mask == 0:
            raise InvalidInputError(f"segment {segment} is the root: nothing to merge")
        sibling = segment.sibling()
        row = rows.get(sibling.id)
        if row is None or row.segment != sibling:
            raise InvalidInputError(
                f"cannot merge {segment}: its sibling {sibling} is split further (merge those "
                "first)"
            )
        needed.append(sibling.id)
    got = []
    for seg_id in needed:
        if seg_id in rows and tokens.claim(proc.name, seg_id, owner, ignore_pause=True):
            got.append(seg_id)
    try:
        if len(got) == len(needed):
            if what == "split":
                a, b = tokens.split(proc.name, segment_id, owner)
                return f"split {segment} into {a} and {b}"
            merged = tokens.merge(proc.name, segment_id, owner)
            return f"merged {segment} and {segment.sibling()} into {merged}"
    finally:
        for seg_id in got:
            if seg_id in {s.segment.id for s in tokens.status(proc.name)}:
                tokens.release(proc.name, seg_id, owner)
    # A live node holds it: ask the owner.
    target = needed[0] if rows[needed[0]].owner else needed[-1]
    tokens.request(proc.name, segment_id if what == "split" else target, what)
    return _await(
        rt,
        proc,
        timeout,
        lambda st: {s.segment for s in st.values()} != before,
        f"{what} of {segment} done by its owner",
    )


def _await(
    rt: Runtime,
    proc: Processor,
    timeout: float,
    done: Callable[[dict[int, SegmentStatus]], bool],
    message: str,
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {s.segment.id: s for s in rt.tokens.status(proc.name)}
        if done(rows):
            return message
        refused = [s.request_refused for s in rows.values() if s.request_refused]
        if refused:
            raise InvalidInputError(f"the owner of {proc.name!r} refused: {refused[0]}")
        time.sleep(0.2)
    raise ProcessorBusyError(
        f"asked the owner of processor {proc.name!r}; it did not act within {timeout:.0f} s "
        "(the request stays pending until it does)"
    )
