"""What a handler gets besides the event: the transaction, the segment, replay information."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from decimal import Decimal
from itertools import chain
from typing import TYPE_CHECKING, Any

from ...db.placeholders import for_psycopg, translated
from ...errors import InvalidInputError
from ...names import check_table_name, table_suffix
from ...segments import Segment
from ...tokens import Token

if TYPE_CHECKING:
    from ...db import Database


class _Opener:
    """Wraps the function that opens a batch's transaction on first use."""

    __slots__ = ("open",)

    def __init__(self, open: Any) -> None:
        self.open = open

    def __call__(self) -> Any:
        return self.open()


def lazy(open: Any) -> _Opener:
    return _Opener(open)


#: a table (optionally schema-qualified) or column name given to insert_rows
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")


class Context:
    """Handler context. ``execute``/``connection`` run in the transaction that also stores the
    segment's token, so writes to the token store's database are exactly-once.

    ``execute`` and ``executemany`` take ``?`` placeholders on both backends (translated for
    PostgreSQL: :mod:`eventlanes.db.placeholders`); psycopg's own ``%s`` style (``ctx.param``)
    works there too. ``ctx.connection`` is the driver's connection, with the driver's style.
    """

    __slots__ = (
        "processor", "segment", "token", "_connection", "backend", "param", "is_replay", "prefix",
        "_cursor", "_suffix",
    )  # fmt: skip

    def __init__(
        self,
        processor: str,
        segment: Segment | None,
        token: Token | None,
        connection: Any,
        backend: str,
        param: str,
        prefix: str = "",
    ) -> None:
        self.processor = processor
        self.segment = segment
        self.token = token  # the segment's token when the batch started
        # A connection, or a callable that opens the transaction on first use: CPU work a
        # handler does before its first query then runs outside SQLite's write lock.
        self._connection = connection
        self.backend = backend
        self.param = param
        self.is_replay = False
        self.prefix = prefix
        self._cursor: Any = None
        self._suffix = table_suffix(processor)  # a version's own tables: ``__vN``

    @classmethod
    def for_batch(
        cls,
        db: Database,
        processor: str,
        segment: Segment | None = None,
        token: Token | None = None,
        connection: Any = None,
    ) -> Context:
        """The context of a batch (or a reset) of ``processor`` in ``db``, the database its
        handlers write to: its backend, placeholder style and table prefix."""
        return cls(processor, segment, token, connection, db.backend, db.param, db.prefix)

    def table(self, name: str) -> str:
        """``name`` under the store's table prefix: projections live beside the tokens. In a
        new version of a processor (``version=N``, N >= 2) the version's own table:
        ``{prefix}{name}__vN`` (version 1's are ``{prefix}{name}``, as they always were)."""
        return f"{self.prefix}{check_table_name(name)}{self._suffix}"

    @property
    def replay_context(self) -> Any:
        """What the reset that started this replay was given (None outside replays)."""
        if self.token is None or not self.is_replay:
            return None
        return self.token.replay_context

    @property
    def connection(self) -> Any:
        """The DB-API connection of the batch's transaction (the token commits with it)."""
        conn = self._connection
        if conn.__class__ is _Opener:
            conn = self._connection = conn()
        elif conn is None:
            raise RuntimeError(
                f"processor {self.processor!r} runs handlers in lanes, outside the token's "
                "transaction (at-least-once): use event.position or event.idempotency_key to "
                "make effects idempotent"
            )
        return conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql`` in the batch's transaction; returns the cursor (to fetch from)."""
        if self.backend != "postgresql":
            return self.connection.execute(sql, params)
        sql, params = for_psycopg(sql, params)
        cur = self._cursor
        # One statement per event spent a third of its driver time making and freeing a
        # cursor: the last one is used again, but only if it is open and nothing but this
        # context holds it (CPython's reference count is exact), so a cursor a handler kept
        # is never reset under it.
        if cur is None or cur.closed or sys.getrefcount(cur) > 3:  # slot, `cur`, argument
            cur = self._cursor = self.connection.cursor()
        return cur.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement, many parameter rows (a cursor's executemany on both drivers)."""
        if self.backend == "postgresql":
            sql = translated(sql)
        cur = self.connection.cursor()
        try:
            cur.executemany(sql, rows)
        finally:
            cur.close()

    def insert_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` (one value per column) into ``table`` in the batch's transaction,
        storing what ``INSERT ... VALUES`` stores, the fastest way the driver has: on
        PostgreSQL a ``COPY`` (no statement per row) when every value is a ``str``, ``int``,
        ``Decimal``, ``bytes`` or ``None`` (their text is parsed by the column's type as an
        INSERT's parameter would be), else, or in a pipelined transaction, ``executemany``;
        ``executemany`` on SQLite. Every row is checked before anything is sent. Returns how
        many rows were inserted. COPY is more lenient in one way: an ``int`` goes to a
        ``boolean`` or ``jsonb`` column as its text (``1`` is true), where an INSERT refuses
        it."""
        names = [table, *columns] if not isinstance(columns, str) else []
        if len(names) < 2 or not all(
            isinstance(n, str) and _IDENTIFIER.fullmatch(n) for n in names
        ):
            raise InvalidInputError(
                f"insert_rows: table and columns must be names (letters, digits, _; a table "
                f"may be schema.name), got table={table!r}, columns={columns!r}"
            )
        checked = rows if isinstance(rows, list) else list(rows)
        width = len(columns)
        if list(map(len, checked)).count(width) != len(checked):
            i = next(i for i, row in enumerate(checked) if len(row) != width)
            raise InvalidInputError(
                f"insert_rows: row {i} has {len(checked[i])} values for {width} columns: "
                f"{checked[i]!r}"
            )
        conn, cols = self.connection, ", ".join(columns)
        if self.backend == "postgresql" and _copy_exact(conn, checked):
            with conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in checked:
                    copy.write_row(row)
            return len(checked)
        marks = ", ".join([self.param] * width)
        self.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", checked)
        return len(checked)

    def __repr__(self) -> str:
        return f"Context({self.processor!r}, segment={self.segment}, replay={self.is_replay})"


#: value types COPY's text stores as an INSERT parameter would be stored (others, e.g. an
#: aware datetime into a ``timestamp`` column or ``True`` into ``text``, would differ)
_COPY_TYPES = frozenset({str, int, Decimal, bytes, type(None)})


def _copy_exact(conn: Any, rows: list[Sequence[Any]]) -> bool:
    """Whether ``rows`` can go by COPY: values of exact types only, and no pipeline (COPY
    cannot run in one)."""
    if conn.pgconn.pipeline_status:
        return False
    kinds = set(map(type, chain.from_iterable(rows)))
    return kinds <= _COPY_TYPES
