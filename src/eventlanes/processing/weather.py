"""Database errors that pass: a restart, a lost connection, a lock held too long, a full disk.

The runners treat them as weather, not death: they log, wait (1 s doubling to 30 s) and carry
on, and processing resumes by itself when the database is back. Fencing is untouched: nothing
commits without its claim, so waiting never costs exactness.
"""

from __future__ import annotations

import sqlite3

from ..db.sqlite import TRANSIENT as SQLITE_TRANSIENT
from ..errors import DatabaseUnavailableError

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
    """Delays for consecutive failures: 1 s doubling to 30 s; ``reset`` after a success."""

    def __init__(self, first: float = 1.0, limit: float = MAX_DELAY) -> None:
        self.first = first
        self.limit = limit
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return min(self.limit, self.first * 2 ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0
