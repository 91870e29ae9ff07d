"""The database a store, a token store and transactional projections share.

Both backends expose the same small surface so the components above them are written once:
``transaction()`` yields a DB-API connection inside a write transaction, ``connection()`` one
for standalone statements, ``param`` is the driver's placeholder (``?`` or ``%s``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..errors import StoreConnectionError
from .url import DatabaseURL

# What a schema statement creates, so a read-only open can check that it exists instead.
_CREATES = re.compile(
    r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(TABLE|SEQUENCE|FUNCTION)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"([A-Za-z0-9_]+)",
    re.IGNORECASE,
)


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

    def table(self, name: str) -> str:
        """Full name of one of eventlanes' tables (the prefix was validated at parse time)."""
        return f"{self.prefix}{name}"

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """A connection inside a write transaction: committed on success, rolled back on error."""

    @abstractmethod
    def connection(self) -> AbstractContextManager[Any]:
        """A connection in autocommit mode, for reads and single-statement writes."""

    def run_ddl(self, statements: Sequence[str]) -> None:
        """Run schema statements once, safely when many processes start at the same time.

        Opened with ``create=False``: run nothing, only check that every table, sequence and
        function the statements would create exists (StoreConnectionError naming the first
        one missing)."""
        if self.create:
            self._run_ddl(statements)
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
    def _run_ddl(self, statements: Sequence[str]) -> None: ...

    @abstractmethod
    def _exists(self, kind: str, name: str) -> bool:
        """Whether a table, sequence or function of that name exists."""

    @abstractmethod
    def close(self) -> None: ...

    def lock(self, conn: Any, key: str) -> None:  # noqa: B027 - a no-op by default
        """Serialise transactions on ``key`` until commit (no-op where writers are serialised)."""

    def sql(self, statement: str) -> str:
        """Translate ``?`` placeholders to the driver's style (our SQL has no literal '?')."""
        return statement if self.param == "?" else statement.replace("?", self.param)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall()
