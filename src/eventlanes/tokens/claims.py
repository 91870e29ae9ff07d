"""Holding claims: the heartbeat that extends them, each node's fair share of them, and
claiming every segment at once.

One heartbeat serves the runners, the Spark replay and the continuous Spark runner. It survives
database errors (a restart, a network blip): it logs, waits and tries again, and reports which
segments it still holds, so the owner learns of a claim it lost instead of committing blindly
(every token write is fenced anyway). A watchdog beside it notices a beat that does not return
(a frozen server answers no error, it just does not answer): outages and freezes are logged
once when they start and once when they end.

The fair share is one rule for every kind of claimed row: a processor's segments (the
coordinator) and an ingestor's partitions (the Kafka ingest runner).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable

from ..db.weather import Outage
from ..errors import ProcessorBusyError
from ..signals import join
from . import SegmentStatus, TokenRecord, TokenStore

log = logging.getLogger("eventlanes.processing")

#: a node lets its surplus go with a hold-off of this many coordination rounds, so that the
#: nodes short of their share claim it first
HOLD_OFF_ROUNDS = 3

#: seconds a beat may take before the database counts as not answering (a beat is two small
#: writes: milliseconds when the database is well)
HANG_AFTER = 5.0


def node_name() -> str:
    """A unique owner name: host, process and a random suffix (one per runner start)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Heartbeat:
    """A daemon thread that extends ``owner``'s claims every ``interval`` seconds and calls
    ``on_held(segment ids still held, when the extension began)`` after each successful
    extension: a claim taken after it began may be missing from the ids, and is judged by the
    next one."""

    def __init__(
        self,
        tokens: TokenStore,
        processor: str,
        owner: str,
        interval: float | None = None,
        on_held: Callable[[set[int], float], None] | None = None,
        announce: bool = True,
    ) -> None:
        self.tokens = tokens
        self.processor = processor
        self.owner = owner
        self.interval = interval if interval is not None else tokens.claim_timeout / 3
        self.on_held = on_held
        self.announce = announce  # also mark this node live (runners; not one-off commands)
        self.failures = 0
        db = getattr(tokens, "db", None)  # SQLite: a beat that waits, waits for a lock
        lock_file = getattr(db, "path", None) if getattr(db, "backend", None) == "sqlite" else None
        self.outage = Outage(
            f"{processor}: heartbeat", lock_file=lock_file, warn_after=tokens.claim_timeout
        )
        self._busy_since: float | None = None  # monotonic start of the beat in progress
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"eventlanes-{processor}-heartbeat", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch, name=f"eventlanes-{processor}-watchdog", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        self._watchdog.start()
        return self

    def beat(self) -> set[int] | None:
        """One extension; None when the database failed (logged once per outage, retried
        next time)."""
        self._busy_since = started = time.monotonic()
        try:
            held = set(self.tokens.extend_all(self.processor, self.owner))
            if self.announce:
                self.tokens.heartbeat(self.processor, self.owner)
            self.outage.ok()
            if self.on_held is not None:
                self.on_held(held, started)
        except Exception as exc:  # noqa: BLE001 - the database may come back: keep beating
            self.failures += 1
            self.outage.failed(exc, self.interval)
            return None
        finally:
            self._busy_since = None
        self.failures = 0
        return held

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def _watch(self) -> None:
        """A beat that has not returned for ``HANG_AFTER`` seconds: the database does not
        answer. Logged once; the beat's return logs the end."""
        while not self._stop.wait(min(1.0, HANG_AFTER / 2)):
            since = self._busy_since
            if since is not None and time.monotonic() - since >= HANG_AFTER:
                self.outage.hangs(time.monotonic() - since)

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._watchdog):
            if thread.is_alive() and thread is not threading.current_thread():
                join(thread)  # in slices: a second signal acts at once


def fair_share(
    total: int, live: int, cap: int | None, held: Collection[int]
) -> tuple[int, list[int]]:
    """How many of ``total`` rows (segments, partitions) a node may hold among ``live`` nodes
    (the ceiling of an even split, at most ``cap``), and which of the ``held`` row ids it lets
    go to get there, the highest first (released with a hold-off: :data:`HOLD_OFF_ROUNDS`)."""
    limit = math.ceil(total / max(1, live))
    if cap is not None:
        limit = min(limit, cap)
    surplus = sorted(held, reverse=True)[: max(0, len(held) - limit)]
    return limit, surplus


def claimable(row: SegmentStatus, owner: str) -> bool:
    """Whether ``owner`` may try to claim ``row`` now: not backing off after a failure, and not
    held by another node whose claim still runs."""
    if row.retry_in:
        return False
    return row.owner in (None, owner) or (row.claim_expires_in or 0) <= 0


def gives_way(rows: Iterable[SegmentStatus], live: list[str], owner: str, held: int) -> bool:
    """Whether ``owner``, holding ``held`` rows, lets one go for a live node that holds less
    than the floor of the fair share while every row is held: the cap alone (the ceiling) lets
    two nodes hold 2 + 2 of 4 segments and a third none, for as long as they run. Only the node
    holding the most gives (ties: the name that sorts first), one row at a time."""
    if len(live) < 2:
        return False
    rows = list(rows)
    floor = len(rows) // len(live)
    if held <= floor:
        return False
    holds: Counter[str] = Counter()
    for row in rows:
        if row.owner is None or (row.claim_expires_in or 0) <= 0:
            return False  # one is free: the node short of its share takes that one
        holds[row.owner] += 1
    if all(holds[node] >= floor for node in live):
        return False
    return min([*live, owner], key=lambda node: (-holds[node], node)) == owner


def claim_all(
    tokens: TokenStore,
    processor: str,
    owner: str,
    wait: bool = False,
    timeout: float | None = None,
) -> list[TokenRecord]:
    """Claim every segment of ``processor`` (which must be stopped everywhere), ignoring
    back-off; refuses with :class:`ProcessorBusyError` while a live node holds one (or waits
    for it with ``wait``). The caller creates the processor's rows first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    records: list[TokenRecord] = []
    try:
        while True:
            busy = []
            for s in tokens.status(processor):
                if any(r.segment.id == s.segment.id for r in records):
                    continue
                record = tokens.claim(
                    processor, s.segment.id, owner, ignore_backoff=True, ignore_pause=True
                )
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
                    f"processor {processor!r} is running: {held}. Stop it everywhere first"
                    + ("" if wait else " or wait for it (--wait)")
                )
            time.sleep(0.2)
    except BaseException:
        release_all(tokens, processor, owner, records)
        raise


def release_all(tokens: TokenStore, processor: str, owner: str, records: list[TokenRecord]) -> None:
    for record in records:
        try:
            tokens.release(processor, record.segment.id, owner)
        except Exception as exc:  # noqa: BLE001 - the claim times out by itself
            log.warning("%s: could not release %s: %s", processor, record.segment, exc)
