"""The database a store, a token store and transactional projections share.

Both backends expose the same small surface so the components above them are written once:
``transaction()`` yields a DB-API connection inside a write transaction, ``connection()`` one
for standalone statements, ``param`` is the driver's placeholder (``?`` or ``%s``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from ..errors import EventlanesError, StoreConnectionError
from .url import DatabaseURL

# What a schema statement creates, so a read-only open can check that it exists instead.
_CREATES = re.compile(
    r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|SEQUENCE|FUNCTION)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"([A-Za-z0-9_]+)",
    re.IGNORECASE,
)


def first_line(exc: BaseException) -> str:
    """An exception's message on one line (drivers add DETAIL/HINT lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Database(ABC):
    backend: str
    param: str
    #: SQL expression for "now" in epoch milliseconds on the database's clock (nodes' clocks
    #: drift; deadlines compared on one clock stay meaningful).
    now_ms: str
    #: Suffix that locks selected rows for the rest of the transaction.
    for_update: str = ""

    def __init__(self, url: DatabaseURL, create: bool = True) -> None:
        self.url = url
        self.prefix = url.prefix
        #: False: opened read-only; nothing (file, schema, table, row) is ever created or written
        self.create = create
        #: Parts of eventlanes' schema found usable on this database (eventlanes.schema.require
        #: checks each once per open database).
        self.schema_checked: set[str] = set()

    def table(self, name: str) -> str:
        """Full name of one of eventlanes' tables (the prefix was validated at parse time)."""
        return f"{self.prefix}{name}"

    @abstractmethod
    def transaction(self, pipeline: bool = False) -> AbstractContextManager[Any]:
        """A connection inside a write transaction: committed on success, rolled back on error.

        ``pipeline=True`` (PostgreSQL; ignored by SQLite, which has no round trips): BEGIN and
        the statements inside are sent without waiting for each result, so a transaction of
        N statements costs about two round trips instead of N + 2. Statements whose result is
        fetched (``fetchone()``...) or a :meth:`sync` wait for the results so far. Errors of
        queued statements surface at the next sync or at the commit, not at ``execute``: code
        that must check a statement's effect before committing (a fenced token update) calls
        ``sync(conn)`` first."""

    @abstractmethod
    def connection(self) -> AbstractContextManager[Any]:
        """A connection in autocommit mode, for reads and single-statement writes."""

    @abstractmethod
    def ddl_transaction(self) -> AbstractContextManager[Any]:
        """A transaction for schema changes, serialised with every other process's schema
        changes on this store (PostgreSQL: an advisory lock; SQLite: its write lock). On
        SQLite, inside this thread's open transaction: that one."""

    def run_ddl(self, statements: Sequence[str]) -> None:
        """Run schema statements of your own tables (eventlanes' are versioned migrations:
        :mod:`eventlanes.schema`) in one transaction, safely when many processes start at the
        same time.

        Opened with ``create=False``: run nothing, only check that every table, sequence and
        function the statements would create exists (StoreConnectionError naming the first
        one missing)."""
        if self.create:
            with self.ddl_transaction() as conn:
                for statement in statements:
                    conn.execute(statement)
            return
        for statement in statements:
            found = _CREATES.match(statement)
            if found and not self._exists(found.group(1).lower(), found.group(2)):
                raise StoreConnectionError(
                    f"store {self.url.redacted!r} (opened with create=False) has no "
                    f"{found.group(1).lower()} {found.group(2)!r}: not an eventlanes store, "
                    "another table prefix, or not initialised yet"
                )

    @abstractmethod
    def _exists(self, kind: str, name: str) -> bool:
        """Whether a table, sequence or function of that name exists."""

    @abstractmethod
    def close(self) -> None: ...

    @contextmanager
    def guard(self, operation: str) -> Iterator[None]:
        """Raise driver and pool errors inside as eventlanes errors naming ``operation``
        (e.g. ``"append to stream 'x'"``), chained to the original: DatabaseUnavailableError
        when retrying later may cure it, StoreConnectionError or InvalidInputError otherwise.
        Other exceptions (eventlanes' own, a handler's) pass through unchanged."""
        try:
            yield
        except EventlanesError:
            raise
        except Exception as exc:
            translated = self.translate(exc, operation)
            if translated is None:
                raise
            raise translated from exc

    @abstractmethod
    def translate(self, exc: BaseException, operation: str) -> EventlanesError | None:
        """The eventlanes error for a driver or pool error (None: not a database error)."""

    def sync(self, conn: Any) -> None:  # noqa: B027 - nothing to wait for by default
        """Wait for the results of every statement sent on ``conn`` (pipeline mode); then
        their cursors' ``rowcount`` and errors are known. A no-op outside pipeline mode."""

    def lock(self, conn: Any, key: str) -> None:  # noqa: B027 - a no-op by default
        """Serialise transactions on ``key`` until commit (no-op where writers are serialised)."""

    def sql(self, statement: str) -> str:
        """Translate ``?`` placeholders to the driver's style (our SQL has no literal '?')."""
        return statement if self.param == "?" else statement.replace("?", self.param)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall()
