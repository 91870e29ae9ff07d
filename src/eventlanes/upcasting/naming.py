"""How an event type names its schema version: version 1 of type ``T`` is stored as ``"T"`` (the
name events had before anyone versioned them), version N >= 2 as ``"T.vN"``.

The version travels in the type, written by whoever appends the event, so every reader knows
an event's shape from the type alone: an event appended by a producer that never heard of the
new version (another service, a node of the previous release during a rolling deploy, a Kafka
ingest) is still read as what it is; the store's ``(type, position)`` index finds every event
of an old version; and the fast paths that read JSON fields without Python (SQLite's
statement, Arrow, Spark's expressions) tell old shapes from new ones by the ``type`` column,
without reading metadata (a metadata key on every event would also send every range of a
SQLite pushdown to the row path, which takes any event with metadata).
"""

from __future__ import annotations

import re

from ..errors import InvalidInputError
from ..events import check_text

#: ``T.vN`` with N >= 2 written without leading zeros (``T.v1``, ``T.v02`` are other types)
_VERSIONED = re.compile(r"(.+)\.v([2-9]|[1-9][0-9]+)")
#: what looks like a version but is not one (refused in registrations: ambiguous)
_LOOKS_VERSIONED = re.compile(r".+\.v[0-9]+")
MAX_TYPE_LENGTH = 500


def split_type(name: str) -> tuple[str, int]:
    """``(base, version)`` of a stored type name: ``"OrderPlaced.v3"`` -> ``("OrderPlaced",
    3)``, ``"OrderPlaced"`` -> ``("OrderPlaced", 1)``."""
    match = _VERSIONED.fullmatch(name)
    if match is None:
        return name, 1
    return match.group(1), int(match.group(2))


def type_name(base: str, version: int) -> str:
    """The stored type of ``version`` of ``base`` (version 1: ``base`` itself)."""
    return base if version == 1 else f"{base}.v{version}"


def check_type(name: object, what: str) -> str:
    """A type name given to a registration: a non-empty string that can be stored, and whose
    version reads one way only (``T.v1`` or ``T.v02`` would look like a version of ``T``)."""
    if not isinstance(name, str) or not name or len(name) > MAX_TYPE_LENGTH:
        raise InvalidInputError(
            f"{what} must be an event type name (1-{MAX_TYPE_LENGTH} characters), got {name!r}"
        )
    check_text(name, what)
    if _LOOKS_VERSIONED.fullmatch(name) and _VERSIONED.fullmatch(name) is None:
        base = name[: name.rindex(".v")]
        raise InvalidInputError(
            f"{what} {name!r} looks like a version of {base!r} but is not one: version 1 of a "
            f"type is stored under its plain name ({base!r}), version N >= 2 as "
            f"{base + '.vN'!r} (no leading zeros)"
        )
    return name
