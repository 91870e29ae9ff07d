"""Split, merge and release requests that other nodes leave in the token store for the owner
of a segment; carried out by the owner between batches, or refused with the reason (which the
asking command reads at once)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from ..errors import ClaimLostError, InvalidInputError
from ..segments import Segment
from ..tokens import SegmentStatus, Token, TokenStore
from .state import SegmentState
from .worker import SegmentWorker

log = logging.getLogger("eventlanes.processing")

Drop = Callable[[SegmentState], None]


class Holder(Protocol):
    """What carrying out a request needs from the node holding the segments."""

    name: str
    owner: str
    tokens: TokenStore
    worker: SegmentWorker
    claimed: dict[int, SegmentState]

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
                c.worker.persist(st)
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
        record = c.tokens.claim(c.name, sibling.id, c.owner)
        if record is None:
            # Ask the sibling's owner to let go; merge on a later round.
            c.tokens.request(c.name, sibling.id, "release")
            return
        c.acquire(record.segment, record.token)
    other = c.claimed[sibling.id]
    for s in (st, other):
        drop(s)
        c.worker.persist(s)
    merged = c.tokens.merge(c.name, st.segment.id, c.owner)
    c.forget(st.segment.id)
    c.forget(sibling.id)
    token = c.tokens.token(c.name, merged.id)
    assert token is not None
    c.acquire(merged, token)
    log.info("%s: merged %s and %s into %s", c.name, st.segment, sibling, merged)
