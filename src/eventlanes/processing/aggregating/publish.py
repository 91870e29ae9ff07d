"""States published to a downstream sink (a Kafka topic) with their source chains."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import InvalidInputError
from ...lineage import Coordinates, coordinates_chain, newest_chain, state_chain
from ..tables.states import Entry, decode


def sink_of(name: str, publish: Any, version: int) -> Any:
    """``publish=``: anything with ``publish(records)`` that returns once every record was
    acknowledged (an ``el.KafkaSink``). Not on a version from 2 on: its warm-up folds all of
    history again, and it runs beside the version before it."""
    if publish is not None and not callable(getattr(publish, "publish", None)):
        raise InvalidInputError(f"aggregation {name!r}: publish= takes an el.KafkaSink")
    if publish is not None and version != 1:
        raise InvalidInputError(
            f"aggregation {name!r}: publish= on version {version} would publish the states of "
            "its warm-up (all of history folded again) and then publish beside the version "
            "before it; publish from version 1 only, or from an aggregation of another name"
        )
    return publish


Offsets = Callable[[list[str], list[Entry]], list[str]]


def publish_states(
    sink: Any,
    name: str,
    entries: dict[str, Entry],
    keys: Iterable[str],
    offsets: Offsets | None,
    newest: dict[str, Coordinates] | None = None,
    before: dict[str, Entry] | None = None,
) -> None:
    """Publish the states of ``keys`` (acknowledged before the caller commits them), each with
    the coordinates of the newest input folded into it (``newest``), else of a source its
    write moved since ``before`` (the stored entries: see :func:`moved`)."""
    keys = sorted(k for k in keys if k in entries)
    picked = [entries[k] for k in keys]
    if offsets is not None:
        texts = offsets(keys, picked)
    else:
        texts = [json.dumps(e.offsets) for e in picked]
    records = []
    for key, entry, text in zip(keys, picked, texts, strict=True):
        coords = (newest or {}).get(key)
        if coords is not None:
            chain = coordinates_chain(name, *coords)
        else:
            chain = state_chain(name, moved(json.loads(text), before, key))
        records.append(_record(name, key, entry.value, chain))
    sink.publish(records)


def moved(offsets: dict[str, Any], before: dict[str, Entry] | None, key: str) -> dict[str, Any]:
    """The sources of a state's ``offsets`` that its write moved since ``before`` (its stored
    entry; all of them when none is stored). The published chain's root is one of them: a
    consumer drops a state whose root it has seen, so a root the write did not move (the
    first source by name, when another one moved) would make the changed state a repeat."""
    held = before.get(key) if before is not None else None
    if held is None:
        return offsets
    return {s: c for s, c in offsets.items() if held.offsets.get(s) != c} or offsets


def publish_stored(
    sink: Any,
    name: str,
    rows: Iterable[tuple[str, str, str]],
    stage: bool = False,
    before: dict[str, Entry] | None = None,
) -> int:
    """Publish states as stored, ``(key, value JSON, offsets JSON)`` (a Spark run's, which
    has no entries in hand), as :func:`publish_states` publishes them, rooted in a source
    the write moved since ``before`` (the stored entries; None: nothing stored): an
    aggregation's the first of those by name, a downstream ``stage``'s the newest by path
    (its sources are upstream keys, whose paths need not be comparable: a Kafka offset of
    one partition, of another). How many were published."""
    records = []
    for key, value, text in rows:
        sources = moved(decode(text), before, key)
        chain = newest_chain(name, sources) if stage else state_chain(name, sources)
        records.append(_record(name, key, decode(value), chain))
    if records:
        sink.publish(records)
    return len(records)


def _record(name: str, key: str, value: Any, chain: Any) -> tuple[Any, ...]:
    return key, value, chain, [("type", b"AggregateState"), ("aggregation", name.encode())]
