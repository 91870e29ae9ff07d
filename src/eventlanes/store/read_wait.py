"""Watching the store's read waits: a reader held back by a late commit is logged once, not per
poll.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from .base import READ_WAIT_WARNING

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from . import EventStore


class ReadWaitWatch:
    """Warns once when the store's readers have waited ``READ_WAIT_WARNING`` seconds behind one
    open transaction (PostgreSQL), and says when they go on. :meth:`check` is called often
    (every heartbeat of every runner of a process) and reads at most every ``every`` seconds."""

    def __init__(self, store: EventStore, every: float = 2.0) -> None:
        self.store = store
        self.every = every
        self._next = 0.0
        self._warned: tuple[int | None, int] | None = None  # (pid, readable position)
        self._lock = threading.Lock()

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next or not self._lock.acquire(blocking=False):
            return
        try:
            self._next = now + self.every
            wait = self.store.read_wait()
            key = (wait.pid, wait.readable) if wait is not None else None
            if self._warned is not None and key != self._warned:
                log.warning("event store: readers go on (the transaction at position %s that "
                            "held them back has ended)", f"{self._warned[1]:,}")  # fmt: skip
                self._warned = None
            if wait is not None and wait.age >= READ_WAIT_WARNING and key != self._warned:
                self._warned = key
                log.warning("event store: %s (warning after %.0f s)", wait.describe(),
                            READ_WAIT_WARNING)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - only a warning: the next check tries again
            log.debug("event store: checking for waiting readers failed: %s", exc)
        finally:
            self._lock.release()
