"""Events: what is appended (:class:`NewEvent`) and what is read back (:class:`Event`).

Corrupt stored events. ``data`` and ``metadata`` are JSON objects. A stored row whose data or
metadata is not one (an empty string, ``null``, an array, invalid JSON, invalid UTF-8: rows
written behind the store's back) does not fail the read it is part of: the read returns it
as an :class:`Event` like any other, whose routing fields (``position``, ``stream_id``,
``version``, ``type``, ``routing_hash``) stay usable, and whose ``data``/``metadata`` raise
:class:`~eventlanes.errors.CorruptEventError` (naming its position and the reason) when
accessed. ``event.corrupt`` says so without raising: the reason, or None for a sound event.
So the processing layer can fail or park just that event's key while the rest proceeds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from .errors import CorruptEventError, InvalidInputError

_EMPTY_JSON = "{}"

try:  # orjson (the spark extra) decodes several times faster; Spark folds decode every event
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the installed extras
    _orjson = None  # type: ignore[assignment]

# orjson turns integers beyond 64 bits into floats, silently: text with a run of 19 or more
# digits (which every such integer has) is decoded by the exact stdlib parser instead.
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_B = re.compile(rb"[0-9]{19}")


class Undecodable:
    """Stands in for a stored value that could not even be read as text (invalid UTF-8), or
    for an event's data that an upcaster failed to give (``eventlanes.upcasting``)."""

    __slots__ = ("reason",)
    #: what accessing the value raises
    error: type[CorruptEventError] = CorruptEventError

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: its type, data (a JSON object) and metadata (a JSON object)."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def _not_serialisable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The stdlib's C encoder, built once: json.dumps with options builds a new encoder per call,
# which cost more than the encoding itself for small events.
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_c_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_encoder is not None:
    _encode_c = _c_encoder(
        None, _not_serialisable, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
else:  # pragma: no cover - CPython has the C encoder

    def _encode_c(value: Any, _level: int) -> tuple[str]:
        return (_encoder.encode(value),)


def encode_fast(value: Any) -> str:
    """JSON text of a dict that reads back equal to it, for the append hot path. Raises
    TypeError, ValueError (including UnicodeEncodeError and :class:`NotExact`) or RecursionError
    on anything :func:`encode_object` refuses; call that for the message.

    The C encoder turns non-string keys into strings and tuples into lists, silently; so the
    text is read back (a C-speed decode, about a third of the encoding's cost) and compared.
    Only a value that does not compare equal, or that holds a float written with an exponent,
    takes the slow walk of :func:`exact_json`."""
    if value.__class__ is not dict:
        raise TypeError("not a dict")
    if not value:
        return _EMPTY_JSON
    text = "".join(_encode_c(value, 0))
    if "\\u0000" in text and _has_nul(value):
        raise ValueError("NUL")
    text.encode()  # lone surrogates raise UnicodeEncodeError, a ValueError
    try:
        same = _read_back(text) == value
    except ValueError:  # orjson's limits (nesting): the walk decides
        same = False
    if not same or ("e+" in text and _EXPONENT.search(text)):
        return exact_json(value)
    return text


def encode_object(value: Any, what: str) -> str:
    """Serialise a JSON object, or raise InvalidInputError naming ``what`` was wrong and where
    (``event #0 (E) data["items"][3]: key 1 is not a string ...``). See :func:`exact_json` for
    what is refused."""
    if not isinstance(value, dict):
        raise InvalidInputError(f"{what} must be a JSON object (dict), got {type(value).__name__}")
    try:
        return exact_json(value)
    except NotExact as exc:
        raise InvalidInputError(f"{what}{exc.path}: {exc.reason}") from None
    except RecursionError:
        raise InvalidInputError(f"{what} is nested too deeply to be stored") from None


class NotExact(ValueError):
    """A value JSON would not give back equal: ``path`` (``["items"][3]``, "" for the value
    itself) and ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or 'value'}: {reason}")
        self.path = path
        self.reason = reason


# orjson reads integers beyond 64 bits as floats: such a value then only seems to differ, and
# the walk accepts it.
_read_back = _orjson.loads if _orjson is not None else json.loads
# A number with a positive exponent (Python writes floats from 1e16 up so): PostgreSQL's jsonb
# gives it back without the exponent, as an integer (1e+300 as 10**300, not the float).
_EXPONENT = re.compile(r"[0-9]e\+[0-9]")
_encode_str = json.encoder.encode_basestring  # C, non-ASCII kept (as the fast path writes)


def exact_json(value: Any, allow_nan: bool = False) -> str:
    """JSON text of ``value`` that reads back equal to it on every backend, or :class:`NotExact`
    saying where and why not.

    Refused: keys that are not strings (JSON would store ``1`` as ``"1"``, and ``{1: "a", "1":
    "b"}`` would lose a value), tuples (they read back as lists), NaN and infinities (unless
    ``allow_nan``: aggregation states keep them), strings with NUL characters or lone
    surrogates, and anything that is not a dict, list, str, int, float, bool or None.
    Subclasses of those are stored as their base type (an ``IntEnum`` member as its int): they
    read back equal. Floats from 1e16 up are written as plain decimals (``1e+300`` as
    ``1000...0.0``), which PostgreSQL's jsonb keeps as the same float."""
    return _exact(value, [], set(), allow_nan)


def _exact(value: Any, path: list[Any], open_: set[int], allow_nan: bool) -> str:
    if isinstance(value, str):
        _check_str(value, path, "")
        return _encode_str(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (_INF, -_INF):
            if not allow_nan:
                raise NotExact(
                    _path(path), f"{value!r} is not JSON-serialisable (JSON has no NaN or infinity)"
                )
            return json.dumps(value)
        text = float.__repr__(value)
        return float.__format__(value, ".1f") if "e+" in text else text
    if isinstance(value, dict | list):
        if id(value) in open_:
            raise NotExact(_path(path), "refers to itself (a circular reference)")
        open_.add(id(value))
        try:
            if isinstance(value, list):
                return (
                    "["
                    + ",".join(_exact(v, [*path, i], open_, allow_nan) for i, v in enumerate(value))
                    + "]"
                )
            parts = []
            for k, v in value.items():
                if not isinstance(k, str):
                    raise NotExact(_path(path), _key_reason(k, value))
                _check_str(k, path, f"key {k!r} ")
                parts.append(f"{_encode_str(k)}:{_exact(v, [*path, k], open_, allow_nan)}")
            return "{" + ",".join(parts) + "}"
        finally:
            open_.discard(id(value))
    if isinstance(value, tuple):
        raise NotExact(_path(path), "a tuple would read back as a list (pass a list)")
    raise NotExact(_path(path), f"{type(value).__name__} is not JSON-serialisable")


_INF = float("inf")


def _check_str(text: str, path: list[Any], what: str) -> None:
    if "\x00" in text:
        raise NotExact(
            _path(path), f"{what}contains a NUL character (\\x00), which cannot be stored"
        )
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise NotExact(
            _path(path), f"{what}contains a lone surrogate {bad!r}, which is not valid UTF-8"
        ) from None


def _key_reason(key: Any, obj: dict[Any, Any]) -> str:
    reason = f"key {key!r} is not a string"
    try:
        stored = next(iter(json.loads(_encoder.encode({key: 0}))))
    except (TypeError, ValueError):  # not even that (a tuple, NaN)
        return reason
    reason += f" (JSON would store it as {json.dumps(stored, ensure_ascii=False)}"
    if stored in obj:
        reason += ", which is also a key there: one of the two values would be lost"
    return reason + ")"


def _path(path: list[Any]) -> str:
    return "".join(
        f"[{p}]" if isinstance(p, int) else f"[{json.dumps(p, ensure_ascii=False)}]" for p in path
    )


def check_text(value: str, what: str) -> None:
    """Refuse NUL characters and lone surrogates in a stored string (stream id, type)."""
    if "\x00" in value:
        raise InvalidInputError(
            f"{what} {value!r} contains a NUL character, which cannot be stored"
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} {value!r} contains a lone surrogate, which is not valid UTF-8"
        ) from None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def decode_object(raw: Any) -> dict[str, Any]:
    """A stored JSON object (text or UTF-8 bytes) as a dict; ValueError saying why it is not
    one. ``None`` (a missing column value, e.g. from Parquet) is the empty object."""
    if raw.__class__ is dict:
        return raw
    if raw is None or raw == _EMPTY_JSON:
        return {}
    if isinstance(raw, Undecodable):
        raise ValueError(raw.reason)
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            raw = bytes(raw).decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not isinstance(raw, str):
        raise ValueError(f"a stored {type(raw).__name__}, not a JSON object")
    if not raw:
        raise ValueError("an empty string, not a JSON object")
    try:
        if _orjson is not None and not _LONG_DIGITS.search(raw):
            value = _orjson.loads(raw)
        else:
            value = json.loads(raw)
    except ValueError as exc:  # orjson's JSONDecodeError is a ValueError too
        raise ValueError(f"not valid JSON ({exc})") from None
    if value.__class__ is not dict:
        kind = "null" if value is None else type(value).__name__
        raise ValueError(f"not a JSON object but {kind}")
    return value


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
        """Its place in the store's global order (gap-free on SQLite; increasing on PostgreSQL)."""
        return self._position

    @property
    def stream_id(self) -> str:
        """The stream it was appended to."""
        return self._stream_id

    @property
    def version(self) -> int:
        """Its place in its stream, from 1."""
        return self._version

    @property
    def type(self) -> str:
        """The event's type, as appended."""
        return self._type

    @property
    def routing_hash(self) -> int:
        """``crc32`` of the stream id (unsigned 32-bit), stored so segment filters run in SQL."""
        return self._routing_hash

    @property
    def source(self) -> str:
        """ "" for the app's own store; a source's name for multi-source processors."""
        return self._source

    @property
    def data(self) -> dict[str, Any]:
        """The event's data; CorruptEventError when the stored value is not a JSON object."""
        raw = self._data
        if raw.__class__ is not dict:  # decoded once, on first access
            raw = self._data = self._decoded(raw, "data")
        return raw

    @property
    def metadata(self) -> dict[str, Any]:
        """The event's metadata; CorruptEventError when the stored value is not a JSON object."""
        raw = self._metadata
        if raw.__class__ is not dict:
            raw = self._metadata = self._decoded(raw, "metadata")
        return raw

    def _decoded(self, raw: Any, what: str) -> dict[str, Any]:
        if isinstance(raw, Undecodable):
            raise raw.error(self._position, raw.reason)
        try:
            return decode_object(raw)
        except ValueError as exc:
            raise CorruptEventError(self._position, f"{what} is {exc}") from None

    @property
    def corrupt(self) -> str | None:
        """Why the stored event cannot be decoded, or None when it can (never raises)."""
        try:
            self.data  # noqa: B018 - decoding is the check
            self.metadata  # noqa: B018
        except CorruptEventError as exc:
            return exc.reason
        return None

    @property
    def recorded_at(self) -> datetime:
        """When it was appended (UTC, timezone-aware)."""
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
        corrupt = self.corrupt  # a log line about a corrupt event must not raise
        what = f"corrupt={corrupt!r}" if corrupt is not None else f"data={self.data!r}"
        return (
            f"Event({where}position={self.position}, stream_id={self.stream_id!r}, "
            f"version={self.version}, type={self.type!r}, {what})"
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


# -- whole batches, for folds that handle thousands of events at a time ---------------------------
# Each is a C-level pass over the batch where the usual case allows, with exactly what the
# per-event properties would give (or raise) otherwise.

_POSITION = attrgetter("_position")
_TYPE = attrgetter("_type")
_SOURCE = attrgetter("_source")
_DATA = attrgetter("_data")
_METADATA = attrgetter("_metadata")


# -- friends of Event: other modules that build or adjust events at speed use these, never the
# slots themselves (the slots stay private to this module).


def rebuilt(event: Event, type_: str, data: Any) -> Event:
    """``event`` as type ``type_`` with ``data``, everything else as stored (upcasting)."""
    return Event(
        event._position, event._stream_id, event._version, type_, data,
        event._metadata, event._recorded_at, event._routing_hash, event._source,
    )  # fmt: skip


def set_source(event: Event, name: str) -> None:
    """Name the source store ``event`` was read from (multi-source readers, before anyone
    sees the event)."""
    event._source = name


def stored_data(event: Event) -> Any:
    """``data`` as the store gave it: the checked JSON text, or a dict."""
    return event._data


def recorded_raw(event: Event) -> Any:
    """``recorded_at`` as read: microseconds since the epoch on both backends, or a datetime
    once converted (no conversion here: merges order thousands of events by it)."""
    return event._recorded_at


type_of = _TYPE  # an event's type, a C-level getter for hot comprehensions


def positions(events: Sequence[Event]) -> list[int]:
    return list(map(_POSITION, events))


def types(events: Sequence[Event]) -> list[str]:
    return list(map(_TYPE, events))


def sources(events: Sequence[Event]) -> list[str]:
    return list(map(_SOURCE, events))


def datas(events: Sequence[Event], keep: bool = True) -> list[dict[str, Any]]:
    """Every event's ``data``, as ``event.data`` gives it (or raises: CorruptEventError naming
    the event), decoded in one pass: stored text by orjson when none of it may hold an integer
    beyond 64 bits. ``keep``: keep the decoded data in the events (for folds that read
    ``event.data`` again), as ``event.data`` does."""
    raws = list(map(_DATA, events))
    kinds = list(map(type, raws))
    n = len(raws)
    done = kinds.count(dict)
    if done == n:
        return raws
    # Some may be decoded already (a batch's events carried over from the last one): the
    # others are decoded in the one pass, not all of them one by one.
    strs = kinds.count(str)
    texts = raws if strs == n else [r for r, k in zip(raws, kinds, strict=True) if k is str]
    if _orjson is not None and done + strs == n and not _has_long_digits("\n".join(texts)):
        try:
            decoded = list(map(_orjson.loads, texts))
        except ValueError:  # a corrupt one: found and named below
            decoded = []
        if decoded and list(map(type, decoded)).count(dict) == len(texts):
            if done:
                more = iter(decoded)
                decoded = [r if k is dict else next(more) for r, k in zip(raws, kinds, strict=True)]
            if keep:
                for event, value in zip(events, decoded, strict=True):
                    event._data = value
            return decoded
    return [e.data for e in events]


# Every ASCII digit as "0": a run of 19 digits is then a plain substring search, several times
# faster than the regular expression over a whole batch's text.
_DIGITS_AS_ZERO = str.maketrans("0123456789", "0" * 10)
_ZEROS = "0" * 19


def _has_long_digits(text: str) -> bool:
    return _ZEROS in text.translate(_DIGITS_AS_ZERO)


def without_metadata(events: Sequence[Event]) -> bool:
    """True when every event's metadata is the empty object (nothing decoded to know it)."""
    metas = list(map(_METADATA, events))
    return metas.count(_EMPTY_JSON) + metas.count({}) == len(metas)
