"""Source coordinates: where an input came from, for exactly-once non-idempotent folds.

An event appended by a republisher carries, in ``metadata["source_chain"]``, the hops back to
its root cause, root first: ``{"source", "partition", "offset", "out"}`` where ``out`` is the
index of this output among those its input produced (flat map). Folds dedupe on the root:
``(source, partition)`` and the path ``(root offset, out, out, ...)``, which only grows for the
inputs of one key. An event without a chain is its own root: (its store, "", (position,)).
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidInputError
from .events import Event

CHAIN_KEY = "source_chain"

Coordinates = tuple[str, str, tuple[int, ...]]  # source, partition, path
Chain = list[dict[str, Any]]


#: the keys of a hop, as every release wrote them
HOP_KEYS = frozenset(("source", "partition", "offset", "out"))
#: bounds of a chain taken from outside (a Kafka header): hops, and characters of a name
MAX_HOPS = 64
MAX_NAME = 300
_MAX_INT = 2**63 - 1  # offsets and outs are stored as 64-bit integers downstream


def _whole(value: object) -> bool:
    return isinstance(value, int) and value.__class__ is not bool and 0 <= value <= _MAX_INT


def check_hop(i: int, hop: object, exact: bool) -> None:
    """ValueError saying what is wrong with hop ``i``. ``exact``: its keys are exactly
    :data:`HOP_KEYS` (a chain from outside); else ``partition`` and ``out`` may be missing,
    as :func:`coordinates` has always read them."""
    if not isinstance(hop, dict):
        raise ValueError(f"hop {i} is {type(hop).__name__}, not an object")
    keys = set(hop)
    if (keys != HOP_KEYS) if exact else not {"source", "offset"} <= keys:
        raise ValueError(f"hop {i} has keys {sorted(map(str, keys))}, not {sorted(HOP_KEYS)}")
    source, partition = hop["source"], hop.get("partition", "")
    if not isinstance(source, str) or not 0 < len(source) <= MAX_NAME:
        raise ValueError(f"hop {i}: 'source' must be text of 1 to {MAX_NAME} characters, "
                         f"got {_short(source)}")  # fmt: skip
    # a stored chain may name its partition by number, as earlier releases read it (str())
    if not exact and _whole(partition):
        partition = str(partition)
    if not isinstance(partition, str) or len(partition) > MAX_NAME:
        raise ValueError(f"hop {i}: 'partition' must be text of at most {MAX_NAME} characters, "
                         f"got {_short(partition)}")  # fmt: skip
    for what in ("offset", "out"):
        if what in hop and not _whole(hop[what]):
            raise ValueError(f"hop {i}: {what!r} must be a whole number >= 0 (at most 2**63-1), "
                             f"got {_short(hop[what])}")  # fmt: skip


def check_chain(chain: object) -> Chain:
    """``chain`` if it is a source chain as eventlanes writes it (a list of 1 to
    :data:`MAX_HOPS` hops of exactly :data:`HOP_KEYS`); ValueError saying what is wrong."""
    if not isinstance(chain, list):
        raise ValueError(f"not a list of hops but {type(chain).__name__}")
    if not chain:
        raise ValueError("no hops")
    if len(chain) > MAX_HOPS:
        raise ValueError(f"more than {MAX_HOPS} hops ({len(chain)})")
    for i, hop in enumerate(chain):
        check_hop(i, hop, exact=True)
    return chain


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)  # bounded: the value may be as large as a record
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def coordinates(event: Event, default_source: str) -> Coordinates:
    chain = event.metadata.get(CHAIN_KEY) if event.metadata else None
    if not chain:
        return (event.source or default_source, "", (event.position,))
    try:
        # every hop checked: a coercion (int("5"), True as 1, 1.5 as 1) would fold or drop an
        # input by a number nobody wrote
        if not isinstance(chain, list):
            raise ValueError(f"not a list of hops but {type(chain).__name__}")
        for i, hop in enumerate(chain):
            check_hop(i, hop, exact=False)
        root = chain[0]
        path = (root["offset"], *(h.get("out", 0) for h in chain))
        return (root["source"], str(root.get("partition", "")), path)
    except ValueError as exc:
        raise InvalidInputError(
            f"event {event.position}: malformed {CHAIN_KEY} {_short(chain, 300)} ({exc})"
        ) from None


def extend_chain(event: Event, source: str, out: int) -> list[dict[str, Any]]:
    """The chain of an output of ``event``: its own chain plus a hop for it."""
    chain = list(event.metadata.get(CHAIN_KEY) or []) if event.metadata else []
    chain.append({"source": event.source or source, "partition": "", "offset": event.position,
                  "out": out})  # fmt: skip
    return chain


def is_newer(offsets: dict[str, list[Any]], coords: Coordinates) -> bool:
    """True if ``coords`` was not folded in yet. A new partition for a source starts over."""
    source, partition, path = coords
    seen = offsets.get(source)
    if seen is None or seen[0] != partition:
        return True
    return path > tuple(seen[1])


def record(offsets: dict[str, list[Any]], coords: Coordinates) -> None:
    """``coords`` as the newest folded of its source (an own root: ``(source, "", path)``)."""
    source, partition, path = coords
    offsets[source] = [partition, list(path)]


def own_path(offsets: dict[str, list[Any]], source: str) -> tuple[int, ...] | None:
    """The path recorded for ``source``'s own events (their root partition ""), if any."""
    seen = offsets.get(source)
    return tuple(seen[1]) if seen is not None and seen[0] == "" else None


def state_chain(name: str, offsets: dict[str, Any]) -> Chain:
    """The chain of a published state: the coordinates of the newest input folded into it, so
    that the state published again after a crash has the same root, and a newer one a newer
    root. A state fed by several sources is published with its first source's (by name)."""
    if not offsets:
        return [{"source": name, "partition": "", "offset": 0, "out": 0}]
    source = sorted(offsets)[0]
    partition, path = offsets[source]
    return coordinates_chain(name, source, partition, path)


def newest_chain(name: str, offsets: dict[str, Any]) -> Chain:
    """The chain of a published state rooted in the source of ``offsets`` with the largest
    path (a downstream stage's sources are upstream keys: the newest input folded, where
    their paths are positions of one log)."""
    if not offsets:
        return state_chain(name, offsets)
    source, (partition, path) = max(offsets.items(), key=lambda kv: (list(kv[1][1]), kv[0]))
    return coordinates_chain(name, source, partition, path)


def coordinates_chain(name: str, source: str, partition: str, path: Any) -> Chain:
    """A chain whose root coordinates are ``(source, partition, path)`` (:func:`coordinates`)."""
    steps = [int(x) for x in path] or [0]
    chain = [{"source": source, "partition": partition, "offset": steps[0],
              "out": steps[1] if len(steps) > 1 else 0}]  # fmt: skip
    chain += [{"source": name, "partition": "", "offset": 0, "out": o} for o in steps[2:]]
    return chain
