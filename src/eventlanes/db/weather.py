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

from ..errors import DatabaseUnavailableError
from .postgres import is_permanent
from .sqlite import LOCK_WAIT
from .sqlite import TRANSIENT as SQLITE_TRANSIENT

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

        if is_permanent(exc):  # an index row too large is an OperationalError to psycopg
            return False
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


#: seconds between warnings that SQLite lock waits are long (one wait at most per period)
LOCK_WARN_EVERY = 300.0


def is_lock_wait(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's busy timeout passing while another connection holds the
    write lock ("database is locked"), raw or translated (:meth:`SQLiteDatabase.translate`)."""
    if isinstance(exc, DatabaseUnavailableError):
        return exc.cause.startswith(LOCK_WAIT)
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in (5, 6)  # BUSY, LOCKED
    return False


class Outage:
    """Logs a database outage once when it starts and once when it ends, however many retries
    (or threads) it takes. ``who``: what noticed it (a processor, its heartbeat). Thread-safe:
    a tracking runner's segment threads share one.

    ``lock_file``: the SQLite file when the database is one. There a call that does not
    return waits for another writer's lock (another worker's batch): normal contention,
    logged at DEBUG as such, and once per :data:`LOCK_WARN_EVERY` at WARNING when a wait
    reaches ``warn_after`` seconds (claims start to expire then)."""

    def __init__(self, who: str, lock_file: str | None = None, warn_after: float = 30.0) -> None:
        self.who = who
        self.lock_file = lock_file
        self.warn_after = warn_after
        self.since: float | None = None  # monotonic start of the outage, None while healthy
        self.failures = 0
        self.locked = False  # the outage in progress is a wait for SQLite's write lock
        self._warned_at: float | None = None  # monotonic time of the last long-wait warning
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
        if is_lock_wait(exc):  # the busy timeout passed: long, but a lock, not an outage
            log.warning("%s: %s; retrying in %.0f s", self.who, exc, retry_in)
            return
        log.warning(
            "%s: database unavailable (%s: %s); retrying until it is back (logged then)",
            self.who, type(exc).__name__, exc,
        )  # fmt: skip

    def hangs(self, seconds: float) -> None:
        """A call has not returned for ``seconds``: the database does not answer (a frozen
        server, a network that drops packets), or on SQLite another writer holds the lock.
        Called again while the call waits (a long lock wait is then warned of)."""
        if self.lock_file is not None:
            self._waits_for_lock(seconds)
            return
        with self._lock:
            if self.since is not None:
                return
            self.since = time.monotonic() - seconds
        log.warning(
            "%s: the database has not answered for %.0f s (server frozen, network or a lock?); "
            "waiting for it", self.who, seconds,
        )  # fmt: skip

    def _waits_for_lock(self, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            first = self.since is None
            if first:
                self.since, self.locked = now - seconds, True
            warn = (
                self.locked
                and seconds >= self.warn_after
                and (self._warned_at is None or now - self._warned_at >= LOCK_WARN_EVERY)
            )
            if warn:
                self._warned_at = now
        if first:
            log.debug("%s: waiting for another writer's lock on %s (%.1f s so far)", self.who,
                      self.lock_file, seconds)  # fmt: skip
        if warn:
            log.warning(
                "%s: waiting for another writer's lock on %s for %.0f s: another process "
                "holds a long write transaction (claims may expire meanwhile; said at most "
                "every %.0f s)", self.who, self.lock_file, seconds, LOCK_WARN_EVERY,
            )  # fmt: skip

    def ok(self) -> None:
        """A call succeeded: the end of the outage, if there was one."""
        if self.since is None:  # the usual case, without taking the lock
            return
        with self._lock:
            if self.since is None:
                return
            seconds, failures, locked = time.monotonic() - self.since, self.failures, self.locked
            self.since, self.failures, self.locked = None, 0, False
        if locked and not failures:
            log.debug("%s: got the write lock on %s after %.1f s", self.who, self.lock_file,
                      seconds)  # fmt: skip
            return
        log.warning(
            "%s: database back after %.1f s%s", self.who, seconds,
            f" ({failures} failed attempt(s))" if failures else "",
        )  # fmt: skip
