"""The event store contract, written once; the backends supply the SQL."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..db import Database
from ..errors import InvalidInputError, StoreConnectionError
from ..events import Event, NewEvent, encode_object
from ..hashing import stable_hash

SegmentSpec = Any  # an el.Segment or an (id, mask) pair


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    type: str
    data: str
    metadata: str


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


def _check_positive(value: Any, what: str, allow_zero: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        bound = "a non-negative" if allow_zero else "a positive"
        raise InvalidInputError(f"{what} must be {bound} integer, got {value!r}")
    return value


class EventStore(ABC):
    """Append-only event log with a global position and per-stream versions."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.events_table = db.table("events")

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
        if not self.db.create:
            raise StoreConnectionError(
                f"cannot append to stream {stream_id!r}: store {self.db.url.redacted!r} was "
                "opened read-only (create=False)"
            )
        if not isinstance(stream_id, str) or not stream_id.strip():
            raise InvalidInputError(f"stream id must be a non-empty string, got {stream_id!r}")
        if expected_version is not None:
            _check_positive(expected_version, "expected_version")
        if isinstance(events, NewEvent):
            events = [events]
        encoded = []
        for i, event in enumerate(events):
            if not isinstance(event, NewEvent):
                raise InvalidInputError(
                    f"event #{i} must be an el.NewEvent, got {type(event).__name__}"
                )
            if not isinstance(event.type, str) or not event.type:
                raise InvalidInputError(f"event #{i}: type must be a non-empty string")
            encoded.append(
                EncodedEvent(
                    event.type,
                    encode_object(event.data, f"event #{i} ({event.type}) data"),
                    encode_object(event.metadata, f"event #{i} ({event.type}) metadata"),
                )
            )
        if not encoded:
            raise InvalidInputError("append needs at least one event")
        return self._append(stream_id, stable_hash(stream_id), encoded, expected_version, conn)

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
        self, after: int = 0, limit: int = 1000, segments: Iterable[SegmentSpec] | None = None
    ) -> list[Event]:
        """Events with position > ``after`` in store order, at most ``limit``.

        ``segments``: only events whose stored routing hash matches one of the (id, mask)
        segments (evaluated in SQL). Never returns an event past one that a concurrent
        writer may still commit below it (no skipped events).
        """
        _check_positive(after, "after")
        _check_positive(limit, "limit", allow_zero=False)
        return self._read(after, limit, segment_pairs(segments))

    def read_upto(
        self, after: int, limit: int, segments: list[tuple[int, int]] | None = None
    ) -> tuple[list[Event], int]:
        """Like :meth:`read`, also returning the position the read is complete up to: the last
        event's when the batch is full, else the horizon the read saw (so a consumer whose
        segments had no events there can still move its token on)."""
        return self._read_upto(after, limit, segments)

    @abstractmethod
    def _read_upto(
        self, after: int, limit: int, segments: list[tuple[int, int]] | None
    ) -> tuple[list[Event], int]: ...

    #: the channel that wakes up consumers (PostgreSQL NOTIFY), if the backend has one
    notify_channel: str | None = None

    def iter_events(
        self,
        after: int = 0,
        batch_size: int = 5000,
        segments: Iterable[SegmentSpec] | None = None,
        until: int | None = None,
    ) -> Iterator[Event]:
        """Every event after ``after`` (up to ``until`` when given), read in batches."""
        pairs = segment_pairs(segments)
        while True:
            batch = self._read(after, batch_size, pairs)
            for event in batch:
                if until is not None and event.position > until:
                    return
                yield event
            if len(batch) < batch_size:
                return
            after = batch[-1].position

    @abstractmethod
    def _read(
        self, after: int, limit: int, segments: list[tuple[int, int]] | None
    ) -> list[Event]: ...

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
        while True:
            with self.db.connection() as conn:
                rows = conn.execute(sql, (after, until, *params, chunk)).fetchall()
            if rows:
                yield rows
            if len(rows) < chunk:
                return
            after = rows[-1][0]

    def read_stream(
        self, stream_id: str, after_version: int = 0, limit: int | None = None
    ) -> list[Event]:
        """Events of one stream with version > ``after_version``, in version order."""
        _check_positive(after_version, "after_version")
        if limit is not None:
            _check_positive(limit, "limit", allow_zero=False)
        return self._read_stream(stream_id, after_version, limit)

    @abstractmethod
    def _read_stream(
        self, stream_id: str, after_version: int, limit: int | None
    ) -> list[Event]: ...

    @abstractmethod
    def head(self) -> int:
        """Highest position a reader can safely read now (0 if the store is empty)."""

    @abstractmethod
    def stream_version(self, stream_id: str) -> int:
        """Current version of a stream (0 if it does not exist)."""

    def position_at(self, when: datetime) -> int | None:
        """First position recorded at or after ``when`` (timezone-aware); None if none yet."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidInputError(f"position_at needs a timezone-aware datetime, got {when!r}")
        return self._position_at(when)

    @abstractmethod
    def _position_at(self, when: datetime) -> int | None: ...

    def count(self, until: int | None = None) -> int:
        """Events stored (with ``until``: those at or below that position)."""
        if until is None:
            return self.db.query(f"SELECT count(*) FROM {self.events_table}")[0][0]
        sql = self.db.sql(f"SELECT count(*) FROM {self.events_table} WHERE position <= ?")
        return self.db.query(sql, (until,))[0][0]

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def segment_sql(pairs: list[tuple[int, int]] | None, param: str) -> tuple[str, list[int]]:
    """SQL condition on the stored routing hash for a segment filter."""
    if pairs is None:
        return "", []
    conds = " OR ".join(f"(routing_hash & {param}) = {param}" for _ in pairs)
    params: list[int] = []
    for seg_id, mask in pairs:
        params += [mask, seg_id]
    return f" AND ({conds})", params
