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


def coordinates(event: Event, default_source: str) -> Coordinates:
    chain = event.metadata.get(CHAIN_KEY) if event.metadata else None
    if not chain:
        return (event.source or default_source, "", (event.position,))
    try:
        root = chain[0]
        path = (int(root["offset"]), *(int(h.get("out", 0)) for h in chain))
        return (str(root["source"]), str(root.get("partition", "")), path)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InvalidInputError(
            f"event {event.position}: malformed {CHAIN_KEY} {chain!r} ({exc})"
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


def coordinates_chain(name: str, source: str, partition: str, path: Any) -> Chain:
    """A chain whose root coordinates are ``(source, partition, path)`` (:func:`coordinates`)."""
    steps = [int(x) for x in path] or [0]
    chain = [{"source": source, "partition": partition, "offset": steps[0],
              "out": steps[1] if len(steps) > 1 else 0}]  # fmt: skip
    chain += [{"source": name, "partition": "", "offset": 0, "out": o} for o in steps[2:]]
    return chain
