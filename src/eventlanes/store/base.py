"""The event store contract, written once; the backends supply the SQL."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..db import Database
from ..errors import InvalidInputError, StoreConnectionError
from ..events import Event, NewEvent, check_text, encode_fast, encode_object
from ..hashing import stable_hash
from ..tracing import propagation, spans

SegmentSpec = Any  # an el.Segment or an (id, mask) pair


#: an event ready to store: (type, data as JSON text, metadata as JSON text)
EncodedEvent = tuple[str, str, str]


def segment_pairs(segments: Iterable[SegmentSpec] | None) -> list[tuple[int, int]] | None:
    """Normalise a segment filter to validated (id, mask) pairs."""
    if segments is None:
        return None
    pairs = []
    for seg in segments:
        seg_id, mask = (seg.id, seg.mask) if hasattr(seg, "mask") else tuple(seg)
        if not isinstance(mask, int) or mask < 0 or mask & (mask + 1) or mask > 0xFFFFFFFF:
            raise InvalidInputError(f"invalid segment mask {mask!r}: must be 2^k - 1 (k <= 32)")
        if not isinstance(seg_id, int) or not 0 <= seg_id <= mask:
            raise InvalidInputError(
                f"invalid segment id {seg_id!r} for mask {mask}: need 0 <= id <= mask"
            )
        pairs.append((seg_id, mask))
    if not pairs:
        raise InvalidInputError("empty segment filter: pass None to read every segment")
    return pairs


#: the longest stream id and event type, in UTF-8 bytes, on both backends: PostgreSQL's index
#: entries stop near 2,700 bytes, SQLite has no such limit; one documented bound keeps the two
#: stores in agreement (and a 10 MB id an input error, not an outage)
MAX_ID_BYTES = 1024

_MAX = 2**63 - 1  # positions and versions are signed 64-bit integers in both databases

#: seconds readers may wait behind one open transaction before it is a problem (``status``)
#: and a logged warning
READ_WAIT_WARNING = 10.0


@dataclass(frozen=True)
class ReadWait:
    """Why readers stop short of the committed head: a transaction that appended events (its
    positions reserved) and has neither committed nor aborted. Events committed after it are
    not read until it ends (no reader may skip a position that could still commit)."""

    readable: int  # the highest position readers can read now
    committed: int  # the highest committed position
    pid: int | None  # the backend process of the open transaction
    application_name: str | None  # as the client set it ("" when it did not)
    transaction_age: float | None  # seconds it has been open; None when this role may not see it
    waited: float  # seconds the first committed event beyond it has waited (a lower bound)

    @property
    def age(self) -> float:
        """The transaction's age, or the lower bound when this role may not see it."""
        return self.transaction_age if self.transaction_age is not None else self.waited

    def describe(self) -> str:
        who = []
        if self.pid is not None:
            who.append(f"pid {self.pid}")
        if self.application_name:
            who.append(f"application_name {self.application_name!r}")
        open_for = (
            f"open for {self.transaction_age:.1f} s"
            if self.transaction_age is not None
            else f"open for at least {self.waited:.1f} s"
        )
        return (
            f"readers wait at position {self.readable:,} behind a transaction {open_for}"
            + (f" ({', '.join(who)})" if who else "")
            + f": the events committed up to position {self.committed:,} are read once it "
            "commits or aborts"
        )

    def document(self) -> dict[str, Any]:
        return {
            "readable_head": self.readable,
            "pid": self.pid,
            "application_name": self.application_name,
            "transaction_age_seconds": _round(self.transaction_age),
            "waited_seconds": _round(self.waited),
            "description": self.describe(),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _check_positive(value: Any, what: str, allow_zero: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        bound = "a non-negative" if allow_zero else "a positive"
        raise InvalidInputError(f"{what} must be {bound} integer, got {value!r}")
    if value > _MAX:
        raise InvalidInputError(f"{what} must be below 2**63 (a 64-bit integer), got {value!r}")
    return value


def _check_length(value: str, what: str) -> None:
    size = len(value.encode())
    if size > MAX_ID_BYTES:
        raise InvalidInputError(
            f"{what} {value[:40]!r}... is {size:,} bytes in UTF-8: at most {MAX_ID_BYTES:,} "
            "bytes are stored (nothing was written)"
        )


class EventStore(ABC):
    """Append-only event log with a global position and per-stream versions."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.events_table = db.table("events")
        self._checked_types: set[str] = set()  # event types already validated
        #: appends under a sampled span record its context in the events' metadata, unless
        #: the URL says ``trace=off`` (checked by parse_url)
        self.trace_context = db.url.options.get("trace", "on").lower() == "on"

    # -- writing ---------------------------------------------------------------------------
    def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent],
        expected_version: int | None = None,
        *,
        conn: Any = None,
    ) -> list[int]:
        """Append ``events`` to ``stream_id`` atomically; return their positions.

        ``expected_version``: 0 means the stream must be new, N means its last version must be
        N, ``None`` accepts any. A mismatch raises :class:`ConcurrencyError` and writes nothing.
        ``conn``: an open transaction of the caller's (from the same database) to append in.
        """
        encoded = self._encoded(stream_id, events, expected_version)
        # After validation: the trace keys are added to the checked text (tracing/); with no
        # sampled span this costs one context lookup.
        if self.trace_context and propagation.sampled() is not None:
            listed = [events] if isinstance(events, NewEvent) else events
            return spans.append(
                stream_id, [e.metadata for e in listed], encoded,
                lambda: self._guarded_append(stream_id, encoded, expected_version, conn),
            )  # fmt: skip
        return self._guarded_append(stream_id, encoded, expected_version, conn)

    def append_runs(self, runs: Sequence[tuple[str, Sequence[NewEvent]]], *, conn: Any) -> int:
        """Append each ``(stream_id, events)`` run, in order, in the caller's open transaction
        ``conn`` (any expected version); return how many events were appended.

        What a Kafka ingest appends: a topic of many keys is a run per record. Every run is
        checked before any is sent; PostgreSQL then sends them together and waits once, where
        one ``append`` per run waits for each (the positions are not returned for that).
        """
        return sum(len(self.append(stream_id, events, conn=conn)) for stream_id, events in runs)

    def _encoded(
        self, stream_id: str, events: Sequence[NewEvent], expected_version: int | None = None
    ) -> list[EncodedEvent]:
        """``events`` checked and encoded for ``stream_id``, or a clear error (nothing sent)."""
        if not self.db.create:
            raise StoreConnectionError(
                f"cannot append to stream {stream_id!r}: store {self.db.url.redacted!r} was "
                "opened read-only (create=False)"
            )
        if not isinstance(stream_id, str) or not stream_id.strip():
            raise InvalidInputError(f"stream id must be a non-empty string, got {stream_id!r}")
        check_text(stream_id, "stream id")
        _check_length(stream_id, "stream id")
        if expected_version is not None:
            _check_positive(expected_version, "expected_version")
        if isinstance(events, NewEvent):
            events = [events]
        if not events:
            raise InvalidInputError(
                f"append to stream {stream_id!r} needs at least one event: got an empty list "
                "(nothing was written)"
            )
        encoded: list[EncodedEvent] = []
        checked = self._checked_types
        for event in events:
            if event.__class__ is not NewEvent or event.type not in checked:
                self._check_event(event, len(encoded))
            try:
                encoded.append((event.type, encode_fast(event.data), encode_fast(event.metadata)))
            except (TypeError, ValueError, RecursionError):
                i = len(encoded)  # the careful path, for the message
                encode_object(event.data, f"event #{i} ({event.type}) data")
                encode_object(event.metadata, f"event #{i} ({event.type}) metadata")
                raise
        return encoded

    def _guarded_append(
        self, stream_id: str, encoded: list[EncodedEvent], expected_version: int | None, conn: Any
    ) -> list[int]:
        with self.db.guard(f"append to stream {stream_id!r}"):
            return self._append(stream_id, stable_hash(stream_id), encoded, expected_version, conn)

    def _check_event(self, event: Any, i: int) -> None:
        if not isinstance(event, NewEvent):
            raise InvalidInputError(
                f"event #{i} must be an el.NewEvent, got {type(event).__name__}"
            )
        if not isinstance(event.type, str) or not event.type:
            raise InvalidInputError(f"event #{i}: type must be a non-empty string")
        check_text(event.type, f"event #{i}: type")
        _check_length(event.type, f"event #{i}: type")
        if len(self._checked_types) > 10_000:  # bounded: types are few, but who knows
            self._checked_types.clear()
        self._checked_types.add(event.type)

    @abstractmethod
    def _append(
        self,
        stream_id: str,
        routing_hash: int,
        events: list[EncodedEvent],
        expected_version: int | None,
        conn: Any,
    ) -> list[int]: ...

    # -- reading ---------------------------------------------------------------------------
    def read(
        self,
        after: int = 0,
        limit: int = 1000,
        segments: Iterable[SegmentSpec] | None = None,
        types: Iterable[str] | None = None,
    ) -> list[Event]:
        """Events with position > ``after`` in store order, at most ``limit``.

        ``segments``: only events whose stored routing hash matches one of the (id, mask)
        segments; ``types``: only events of these types (both evaluated in SQL, the types by
        an index). Never returns an event past one that a concurrent writer may still commit
        below it (no skipped events).
        """
        _check_positive(after, "after")
        _check_positive(limit, "limit", allow_zero=False)
        cond, params = self._filter(segment_pairs(segments), types)
        with self.db.guard(f"read after position {after}"):
            return self._read(after, limit, cond, params)

    def read_upto(
        self,
        after: int,
        limit: int,
        segments: list[tuple[int, int]] | None = None,
        types: Iterable[str] | None = None,
    ) -> tuple[list[Event], int]:
        """Like :meth:`read`, also returning the position the read is complete up to: the last
        event's when the batch is full, else the horizon the read saw. Events filtered out
        (other segments, other types) are passed over too: a consumer at the head is not
        lagging because the last events were not for it."""
        _check_positive(after, "after")
        _check_positive(limit, "limit", allow_zero=False)
        cond, params = self._filter(segments, types)
        with self.db.guard(f"read after position {after}"):
            return self._read_upto(after, limit, cond, params)

    @abstractmethod
    def _read_upto(
        self, after: int, limit: int, cond: str, params: list[Any]
    ) -> tuple[list[Event], int]: ...

    def _filter(
        self, pairs: list[tuple[int, int]] | None, types: Iterable[str] | None
    ) -> tuple[str, list[Any]]:
        cond, by_segment = segment_sql(pairs, self.db.param)
        params: list[Any] = list(by_segment)
        if types is not None:
            if isinstance(types, str):
                raise InvalidInputError(f"types must be a list of event types, got {types!r}")
            names = list(dict.fromkeys(types))
            if not names or not all(isinstance(t, str) and t for t in names):
                raise InvalidInputError(
                    f"types must be a non-empty list of non-empty strings, got {names!r} "
                    "(pass None to read every type)"
                )
            cond += f" AND type IN ({', '.join([self.db.param] * len(names))})"
            params = [*params, *names]
        return cond, params

    #: the channel that wakes up consumers (PostgreSQL NOTIFY), if the backend has one
    notify_channel: str | None = None

    def iter_events(
        self,
        after: int = 0,
        batch_size: int = 5000,
        segments: Iterable[SegmentSpec] | None = None,
        until: int | None = None,
        types: Iterable[str] | None = None,
    ) -> Iterator[Event]:
        """Every event after ``after`` (up to ``until`` when given), read in batches."""
        cond, params = self._filter(segment_pairs(segments), types)
        while True:
            with self.db.guard(f"read after position {after}"):
                batch = self._read(after, batch_size, cond, params)
            for event in batch:
                if until is not None and event.position > until:
                    return
                yield event
            if len(batch) < batch_size:
                return
            after = batch[-1].position

    @abstractmethod
    def _read(self, after: int, limit: int, cond: str, params: list[Any]) -> list[Event]: ...

    #: the SELECT list that ``Event(*row)`` takes, per backend
    columns_sql: str = ""

    def scan(
        self,
        after: int,
        until: int,
        segments: Iterable[SegmentSpec] | None = None,
        chunk: int = 10_000,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """Raw rows (the columns of :class:`Event`) with ``after < position <= until`` in store
        order, in chunks; for bulk readers (Spark, exports) that need no Event objects.
        ``until`` must not pass :meth:`head` (what a reader may safely see)."""
        pairs = segment_pairs(segments)
        cond, params = segment_sql(pairs, self.db.param)
        p = self.db.param
        sql = (
            f"SELECT {self.columns_sql} FROM {self.events_table} "
            f"WHERE position > {p} AND position <= {p}{cond} ORDER BY position LIMIT {p}"
        )
        return self._chunks(sql, after, until, params, chunk)

    def _chunks(
        self, sql: str, after: int, until: int, params: Sequence[Any], chunk: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of ``sql`` (position first; parameters after, until, ``params``, the
        limit) a chunk at a time, each read after the last position of the one before."""
        while True:
            with self.db.guard(f"scan after position {after}"), self.db.connection() as conn:
                rows = self._raw_rows(conn, sql, (after, until, *params, chunk))
            if rows:
                yield rows
            if len(rows) < chunk:
                return
            after = rows[-1][0]

    #: position, type, the data as text and ``recorded_at`` in microseconds, per backend
    times_sql: str = ""

    def scan_times(
        self, after: int, until: int, data: bool, chunk: int = 10_000
    ) -> Iterator[list[tuple[Any, ...]]]:
        """(position, type, data text or None, recorded_at in microseconds) of the events with
        ``after < position <= until``, in store order and in chunks: what a clock of event
        times reads, without the rest of each row (``data``: whether to read the data).
        ``until`` must not pass :meth:`head`."""
        columns = self.times_sql if data else self.times_sql.replace(", data", ", NULL", 1)
        p = self.db.param
        sql = (
            f"SELECT {columns} FROM {self.events_table} WHERE position > {p} AND "
            f"position <= {p} ORDER BY position LIMIT {p}"
        )
        return self._chunks(sql, after, until, (), chunk)

    def _raw_rows(self, conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Rows for :meth:`scan`; CorruptEventError where a row cannot even be read."""
        return conn.execute(sql, params).fetchall()

    def scan_arrow(
        self,
        after: int,
        until: int,
        segments: Iterable[SegmentSpec] | None = None,
        types: Iterable[str] | None = None,
        columns: list[str] | None = None,
    ) -> Iterator[Any]:
        """:meth:`scan` as Arrow record batches (``pyarrow.RecordBatch`` of the same columns,
        :data:`eventlanes.store.arrow.FIELDS`), read in one read-only statement (PostgreSQL's
        in C by its ADBC driver) (the ``arrow`` extra); ``types``: only events of these types;
        ``columns``: only these columns (``position`` always).
        ``until`` must not pass :meth:`head` (PostgreSQL checks it against the visibility
        horizon). CorruptEventError for a row whose text is not valid UTF-8, as
        :meth:`scan`."""
        _check_positive(after, "after")
        _check_positive(until, "until")
        pairs = segment_pairs(segments)
        names = None
        if types is not None:
            self._filter(None, types)  # validated as read() validates them
            names = list(dict.fromkeys(types))
        from .arrow import projection

        return self._scan_arrow(after, until, pairs, names, projection(columns))

    def _scan_arrow(
        self,
        after: int,
        until: int,
        pairs: list[tuple[int, int]] | None,
        types: list[str] | None,
        columns: list[str],
    ) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} has no Arrow reads")

    def read_stream(
        self,
        stream_id: str,
        after_version: int = 0,
        limit: int | None = None,
        *,
        backwards: bool = False,
        until_version: int | None = None,
    ) -> list[Event]:
        """Events of one stream with ``after_version < version <= until_version``, in version
        order; ``backwards=True``: newest first (``limit=1``: the stream's last event; page
        back with ``until_version`` = the oldest version seen - 1)."""
        _check_positive(after_version, "after_version")
        if limit is not None:
            _check_positive(limit, "limit", allow_zero=False)
        if until_version is not None:
            _check_positive(until_version, "until_version")
        with self.db.guard(f"read stream {stream_id!r}"):
            return self._read_stream(stream_id, after_version, until_version, limit, backwards)

    def _stream_sql(self, until_version: int | None, backwards: bool) -> str:
        p = self.db.param
        until = "" if until_version is None else f" AND version <= {p}"
        return (
            f"SELECT {self.columns_sql} FROM {self.events_table} WHERE stream_id = {p} "
            f"AND version > {p}{until} ORDER BY version{' DESC' if backwards else ''} LIMIT {p}"
        )

    @abstractmethod
    def _read_stream(
        self,
        stream_id: str,
        after_version: int,
        until_version: int | None,
        limit: int | None,
        backwards: bool,
    ) -> list[Event]: ...

    def head(self) -> int:
        """Highest position a reader can safely read now (0 if the store is empty)."""
        with self.db.guard("head"):
            return self._head()

    @abstractmethod
    def _head(self) -> int: ...

    def committed_head(self) -> int:
        """Highest committed position. On PostgreSQL it may be above :meth:`head` while an
        append is in flight below it: those events wait for it (see :meth:`read_wait`)."""
        with self.db.guard("committed head"):
            return committed_head(self.db, self.events_table)

    def read_wait(self) -> ReadWait | None:
        """Why readers stop short of the committed head now, or None when they do not.
        Only PostgreSQL readers wait (SQLite writers commit one at a time, in order)."""
        return None

    def stream_version(self, stream_id: str) -> int:
        """Current version of a stream (0 if it does not exist)."""
        with self.db.guard(f"version of stream {stream_id!r}"):
            return self._stream_version(stream_id)

    @abstractmethod
    def _stream_version(self, stream_id: str) -> int: ...

    def position_at(self, when: datetime) -> int | None:
        """First position recorded at or after ``when`` (timezone-aware); None if none yet."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidInputError(f"position_at needs a timezone-aware datetime, got {when!r}")
        with self.db.guard(f"position at {when.isoformat()}"):
            return self._position_at(when)

    @abstractmethod
    def _position_at(self, when: datetime) -> int | None: ...

    def count(self, until: int | None = None) -> int:
        """Events stored (with ``until``: those at or below that position)."""
        if until is not None:
            _check_positive(until, "until")
        with self.db.guard("count"):
            if until is None:
                return self.db.query(f"SELECT count(*) FROM {self.events_table}")[0][0]
            sql = self.db.sql(f"SELECT count(*) FROM {self.events_table} WHERE position <= ?")
            return self.db.query(sql, (until,))[0][0]

    def close(self) -> None:
        """Close the store's connections (the store is also a context manager)."""
        self.db.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def committed_head(db: Database, events_table: str) -> int:
    """The highest committed position (plain SELECT: the read-only status uses it too)."""
    return int(db.query(f"SELECT coalesce(max(position), 0) FROM {events_table}")[0][0])


def recorded_after(db: Database, events_table: str, position: int) -> datetime | None:
    """``recorded_at`` of the first committed event after ``position``, past the readers'
    horizon too (the age of the oldest event a consumer at ``position`` has not handled)."""
    sql = db.sql(
        f"SELECT recorded_at FROM {events_table} WHERE position > ? ORDER BY position LIMIT 1"
    )
    rows = db.query(sql, (position,))
    if not rows:
        return None
    value = rows[0][0]
    if isinstance(value, datetime):  # PostgreSQL: timestamptz
        return value
    return datetime.fromtimestamp(value / 1_000_000, UTC)  # SQLite: epoch microseconds


def segment_sql(pairs: list[tuple[int, int]] | None, param: str) -> tuple[str, list[int]]:
    """SQL condition on the stored routing hash for a segment filter."""
    if pairs is None:
        return "", []
    conds = " OR ".join(f"(routing_hash & {param}) = {param}" for _ in pairs)
    params: list[int] = []
    for seg_id, mask in pairs:
        params += [mask, seg_id]
    return f" AND ({conds})", params
