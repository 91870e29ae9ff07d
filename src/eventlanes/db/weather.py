"""Database errors that pass: a restart, a lost connection, a lock held too long, a full disk;
and the database's other moods: not answering at all (a frozen server), readers held back by
an open transaction.

The runners treat them as weather, not death: they log, wait (1 s doubling to 30 s) and carry
on, and processing resumes by itself when the database is back. Fencing is untouched: nothing
commits without its claim, so waiting never costs exactness. An outage is logged once when it
starts and once when it ends (:class:`Outage`), not once per retry.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import DatabaseUnavailableError
from .sqlite import TRANSIENT as SQLITE_TRANSIENT

if TYPE_CHECKING:
    pass

log = logging.getLogger("eventlanes.processing")

MAX_DELAY = 30.0


def is_transient(exc: BaseException) -> bool:
    """Whether retrying later may cure ``exc``: a lost or refused connection, a restart, a lock
    held past the busy timeout, a full disk. A bad password, a read-only store, a missing
    table or an SQL error is not: it stops the runner with its error instead of being retried
    forever."""
    if isinstance(exc, DatabaseUnavailableError):
        return True
    if isinstance(exc, sqlite3.OperationalError):  # locked, busy, I/O error, full
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in SQLITE_TRANSIENT
    module = type(exc).__module__
    if module.startswith("psycopg_pool"):  # PoolTimeout, TooManyRequests
        return True
    if module.startswith("psycopg"):
        import psycopg

        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return False


class Backoff:
    """Delays for consecutive failures: 1 s doubling to 30 s; ``reset`` after a success (which
    calls ``on_recovery`` when there were failures: the end of an outage)."""

    def __init__(self, first: float = 1.0, limit: float = MAX_DELAY) -> None:
        self.first = first
        self.limit = limit
        self.failures = 0
        self.on_recovery: Callable[[], None] | None = None

    def next(self) -> float:
        self.failures += 1
        return min(self.limit, self.first * 2 ** (self.failures - 1))

    def reset(self) -> None:
        if self.failures and self.on_recovery is not None:
            self.on_recovery()
        self.failures = 0


class Outage:
    """Logs a database outage once when it starts and once when it ends, however many retries
    (or threads) it takes. ``who``: what noticed it (a processor, its heartbeat). Thread-safe:
    a tracking runner's segment threads share one."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.since: float | None = None  # monotonic start of the outage, None while healthy
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException, retry_in: float) -> None:
        """A call failed with a passing database error; the caller retries in ``retry_in``."""
        with self._lock:
            self.failures += 1
            if self.since is not None:
                log.debug("%s: database still unavailable (%s); retry %d in %.0f s", self.who,
                          exc, self.failures, retry_in)  # fmt: skip
                return
            self.since = time.monotonic()
        log.warning(
            "%s: database unavailable (%s: %s); retrying until it is back (logged then)",
            self.who, type(exc).__name__, exc,
        )  # fmt: skip

    def hangs(self, seconds: float) -> None:
        """A call has not returned for ``seconds``: the database does not answer (a frozen
        server, a network that drops packets, a lock held on SQLite)."""
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic() - seconds
        log.warning(
            "%s: the database has not answered for %.0f s (server frozen, network or a lock?); "
            "waiting for it", self.who, seconds,
        )  # fmt: skip

    def ok(self) -> None:
        """A call succeeded: the end of the outage, if there was one."""
        if self.since is None:  # the usual case, without taking the lock
            return
        with self._lock:
            if self.since is None:
                return
            seconds, failures = time.monotonic() - self.since, self.failures
            self.since, self.failures = None, 0
        log.warning(
            "%s: database back after %.1f s%s", self.who, seconds,
            f" ({failures} failed attempt(s))" if failures else "",
        )  # fmt: skip
