"""Automatic balance: split the segment with the most work while live nodes could share more,
merge the smallest siblings while segments outnumber ``max_segments``; one operation at a time,
each through the existing split / merge requests (the owner carries it out between batches).

The rule is by hash share: a segment with mask ``m`` holds 1/(m+1) of the keys. While the
largest share is more than a live node's fair part (1/nodes), that segment is split (ties go to
the one with the most lag). With 3 nodes and 2 segments this ends at 4 segments of a quarter,
held 2/1/1; with 2 nodes it leaves 2 halves alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ...signals import join
from ...tokens import SegmentStatus
from ..processor import Processor
from ..runtime import Runtime
from .requests import steer

log = logging.getLogger("eventlanes.balance")

MAX_STEPS = 64  # one call never reshapes more than this; a later call goes on


def next_step(
    rows: list[SegmentStatus], live_nodes: int, max_segments: int | None, head: int
) -> tuple[str, int] | None:
    """The one operation that brings ``rows`` closer to balance: ("split" | "merge", id)."""
    if not rows:
        return None
    if max_segments is not None and len(rows) > max_segments:
        by_segment = {r.segment: r for r in rows}
        pairs = [
            r for r in rows
            if r.segment.mask and r.segment.id < r.segment.sibling().id
            and r.segment.sibling() in by_segment
        ]  # fmt: skip
        if pairs:  # the smallest shares first, then the least work

            def smallest(r: SegmentStatus) -> tuple[int, int]:
                work = _lag(r, head) + _lag(by_segment[r.segment.sibling()], head)
                return (r.segment.mask, -work)

            return ("merge", max(pairs, key=smallest).segment.id)
        return None
    if live_nodes < 1 or (max_segments is not None and len(rows) >= max_segments):
        return None
    # The biggest hash share (the smallest mask), most lag first among equals.
    biggest = max(rows, key=lambda r: (-r.segment.mask, _lag(r, head)))
    share_too_big = biggest.segment.mask + 1 < live_nodes  # 1/(mask+1) > 1/nodes
    if share_too_big and len(rows) < 2 * live_nodes:
        return ("split", biggest.segment.id)
    return None


def _lag(row: SegmentStatus, head: int) -> int:
    return max(0, head - row.token.position)


def balance(
    rt: Runtime,
    proc: Processor,
    timeout: float = 15.0,
    report: Callable[[str], None] | None = None,
) -> list[str]:
    """Split and merge, one operation at a time, until balanced; returns what was done."""
    done: list[str] = []
    rt.initialize(*proc.token_spec())
    for _ in range(MAX_STEPS):
        rows = rt.tokens.status(proc.name)
        live = len(rt.tokens.live_nodes(proc.name))
        step = next_step(rows, live, proc.max_segments, rt.store.head())
        if step is None:
            break
        what, segment_id = step
        message = steer(rt, proc, segment_id, what, timeout)
        done.append(message)
        if report is not None:
            report(message)
    return done


class Balancer:
    """``App.start(balance=True)``: every ``interval`` seconds, the live node whose name sorts
    first among the processor's nodes does at most one balancing operation."""

    def __init__(self, rt: Runtime, proc: Processor, owner: str, interval: float = 5.0) -> None:
        self.rt = rt
        self.proc = proc
        self.owner = owner
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"eventlanes-{proc.name}-balance", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                live = sorted(self.rt.tokens.live_nodes(self.proc.name))
                if not live or live[0] != self.owner:
                    continue  # another node balances
                rows = self.rt.tokens.status(self.proc.name)
                step = next_step(rows, len(live), self.proc.max_segments, self.rt.store.head())
                if step is not None:
                    log.info("%s: %s", self.proc.name, steer(self.rt, self.proc, step[1], step[0]))
            except Exception as exc:  # noqa: BLE001 - balancing is best effort: try again later
                log.warning("%s: balancing failed: %s", self.proc.name, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            join(self._thread)  # in slices: a second signal acts at once
