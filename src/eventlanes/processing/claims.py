"""Holding claims: the heartbeat that extends them, and claiming every segment at once.

One heartbeat serves the runners, the Spark replay and the continuous Spark runner. It survives
database errors (a restart, a network blip): it logs, waits and tries again, and reports which
segments it still holds, so the owner learns of a claim it lost instead of committing blindly
(every token write is fenced anyway).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from ..errors import ProcessorBusyError
from ..tokens import TokenRecord, TokenStore

log = logging.getLogger("eventlanes.processing")


def node_name() -> str:
    """A unique owner name: host, process and a random suffix (one per runner start)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Heartbeat:
    """A daemon thread that extends ``owner``'s claims every ``interval`` seconds and calls
    ``on_held(segment ids still held)`` after each successful extension."""

    def __init__(
        self,
        tokens: TokenStore,
        processor: str,
        owner: str,
        interval: float | None = None,
        on_held: Callable[[set[int]], None] | None = None,
        announce: bool = True,
    ) -> None:
        self.tokens = tokens
        self.processor = processor
        self.owner = owner
        self.interval = interval if interval is not None else tokens.claim_timeout / 3
        self.on_held = on_held
        self.announce = announce  # also mark this node live (runners; not one-off commands)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"eventlanes-{processor}-heartbeat", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> set[int] | None:
        """One extension; None when the database failed (logged, retried next time)."""
        try:
            held = set(self.tokens.extend_all(self.processor, self.owner))
            if self.announce:
                self.tokens.heartbeat(self.processor, self.owner)
            if self.on_held is not None:
                self.on_held(held)
        except Exception as exc:  # noqa: BLE001 - the database may come back: keep beating
            self.failures += 1
            log.warning(
                "%s: heartbeat failed (%d in a row): %s", self.processor, self.failures, exc
            )
            return None
        if self.failures:
            log.info("%s: heartbeat works again after %d failure(s)", self.processor, self.failures)
        self.failures = 0
        return held

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


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
