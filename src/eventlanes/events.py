"""Events: what is appended (:class:`NewEvent`) and what is read back (:class:`Event`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .errors import InvalidInputError

_EMPTY_JSON = "{}"

try:  # orjson (the spark extra) decodes several times faster; Spark folds decode every event
    from orjson import JSONDecodeError as _FastError
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the installed extras
    _fast_loads = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: its type, data (a JSON object) and metadata (a JSON object)."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def encode_object(value: Any, what: str) -> str:
    """Serialise a JSON object, or raise InvalidInputError naming ``what`` was wrong."""
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object (dict), got {type(value).__name__}")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not JSON-serialisable: {exc}") from exc


def _decode(raw: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if not raw or raw == _EMPTY_JSON:  # None: a missing column value (e.g. from Parquet)
        return {}
    if _fast_loads is not None:
        try:
            return _fast_loads(raw)
        except _FastError:  # e.g. integers beyond 64 bits, which json handles
            pass
    return json.loads(raw)


class Event:
    """A stored event. Immutable; ``data`` and ``metadata`` are decoded on first access.

    Decoding lazily keeps reads cheap for consumers that only route on ``stream_id``. The fields
    are read-only properties over private slots (private by convention): construction is plain
    slot stores, several times cheaper than a ``__setattr__`` guard (bulk folds build one Event
    per row). The decoded ``data``/``metadata`` dicts are shared: handlers must not mutate them.
    """

    __slots__ = (
        "_position",
        "_stream_id",
        "_version",
        "_type",
        "_data",
        "_metadata",
        "_recorded_at",
        "_routing_hash",
        "_source",
    )

    def __init__(
        self,
        position: int,
        stream_id: str,
        version: int,
        type: str,
        data: str | dict[str, Any],
        metadata: str | dict[str, Any],
        recorded_at: datetime | int,
        routing_hash: int,
        source: str = "",
    ) -> None:
        self._position = position
        self._stream_id = stream_id
        self._version = version
        self._type = type
        self._data = data
        self._metadata = metadata
        self._recorded_at = recorded_at
        self._routing_hash = routing_hash
        self._source = source

    @property
    def position(self) -> int:
        return self._position

    @property
    def stream_id(self) -> str:
        return self._stream_id

    @property
    def version(self) -> int:
        return self._version

    @property
    def type(self) -> str:
        return self._type

    @property
    def routing_hash(self) -> int:
        return self._routing_hash

    @property
    def source(self) -> str:
        """ "" for the app's own store; a source's name for multi-source processors."""
        return self._source

    @property
    def data(self) -> dict[str, Any]:
        raw = self._data
        if raw.__class__ is not dict:  # decoded once, on first access
            raw = self._data = _decode(raw)
        return raw  # type: ignore[return-value]

    @property
    def metadata(self) -> dict[str, Any]:
        raw = self._metadata
        if raw.__class__ is not dict:
            raw = self._metadata = _decode(raw)
        return raw  # type: ignore[return-value]

    @property
    def recorded_at(self) -> datetime:
        value = self._recorded_at
        if isinstance(value, int):
            # SQLite stores microseconds since the epoch (UTC).
            value = datetime.fromtimestamp(value / 1_000_000, UTC)
            self._recorded_at = value
        return value

    @property
    def idempotency_key(self) -> tuple[str, int]:
        """``(stream_id, version)``: unique per event, for handlers with external side effects."""
        return (self.stream_id, self.version)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (
            self.position == other.position
            and self.source == other.source
            and self.stream_id == other.stream_id
            and self.version == other.version
            and self.type == other.type
            and self.data == other.data
            and self.metadata == other.metadata
        )

    def __hash__(self) -> int:
        return hash((self.position, self.stream_id, self.version))

    def __repr__(self) -> str:
        where = f"source={self.source!r}, " if self.source else ""
        return (
            f"Event({where}position={self.position}, stream_id={self.stream_id!r}, "
            f"version={self.version}, type={self.type!r}, data={self.data!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle support: worker processes and Spark executors receive events.
        return (
            Event,
            (
                self.position,
                self.stream_id,
                self.version,
                self.type,
                self._data,
                self._metadata,
                self._recorded_at,
                self.routing_hash,
                self.source,
            ),
        )
