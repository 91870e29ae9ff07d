"""Waking consumers when new events arrive.

PostgreSQL: one LISTEN connection per process; every append NOTIFYs after it commits. The
listener only speeds things up: waiters always wake after ``poll_interval`` too, so a lost
notification (dropped connection, server restart) delays processing but can never hang it.
SQLite has no notifications: consumers poll with a short interval.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("eventlanes.store.notify")


class Wakeup:
    """``wait(seen)`` returns when the generation moved past ``seen`` or after a timeout."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        self._cond = threading.Condition()
        self._generation = 0
        self._closed = False

    @property
    def generation(self) -> int:
        return self._generation

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float | None = None) -> None:
        limit = self.poll_interval if timeout is None else min(timeout, self.poll_interval)
        with self._cond:
            if self._generation == seen and not self._closed:
                self._cond.wait(limit)

    def close(self) -> None:
        self._closed = True
        self.notify()


class PostgresListener(Wakeup):
    """LISTENs on the store's channel in a daemon thread, reconnecting after failures."""

    def __init__(self, store: Any, poll_interval: float = 1.0) -> None:
        super().__init__(poll_interval)
        self._store = store
        self._channel = store.notify_channel
        self._thread = threading.Thread(target=self._run, name="eventlanes-listen", daemon=True)
        self._conn: Any = None
        self._thread.start()

    def _run(self) -> None:
        delay = 0.1
        failing_since: float | None = None  # logged once when it fails, once when it is back
        while not self._closed:
            try:
                conn = self._store.db.connect(autocommit=True)
                self._conn = conn
                conn.execute(f'LISTEN "{self._channel}"')
                delay = 0.1
                if failing_since is not None:
                    log.warning("LISTEN connection back after %.1f s",
                                time.monotonic() - failing_since)  # fmt: skip
                    failing_since = None
                self.notify()  # events may have arrived while we were not listening
                while not self._closed:
                    for _ in conn.notifies(timeout=1.0, stop_after=64):
                        self.notify()
            except Exception as exc:  # noqa: BLE001 - keep listening whatever happened
                if self._closed:
                    return
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning("LISTEN connection failed (%s); polling until it is back", exc)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                try:
                    if self._conn is not None:
                        self._conn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._conn = None

    def close(self) -> None:
        super().close()
        self._thread.join(timeout=3)


def wakeup_for(store: Any, poll_interval: float | None = None) -> Wakeup:
    """The best wake-up source the store offers."""
    if getattr(store, "notify_channel", None):
        return PostgresListener(store, poll_interval or 1.0)
    return Wakeup(poll_interval or 0.02)
