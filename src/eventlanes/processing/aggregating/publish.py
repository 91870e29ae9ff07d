"""States published to a downstream sink (a Kafka topic) with their source chains."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import InvalidInputError
from ...lineage import Coordinates, coordinates_chain, state_chain
from ..tables.states import Entry


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
) -> None:
    """Publish the states of ``keys`` (acknowledged before the caller commits them), each with
    the coordinates of the newest input folded into it (``newest``, else its offsets)."""
    keys = sorted(k for k in keys if k in entries)
    picked = [entries[k] for k in keys]
    if offsets is not None:
        texts = offsets(keys, picked)
    else:
        texts = [json.dumps(e.offsets) for e in picked]
    records = []
    for key, entry, text in zip(keys, picked, texts, strict=True):
        coords = (newest or {}).get(key)
        chain = (coordinates_chain(name, *coords) if coords is not None
                 else state_chain(name, json.loads(text)))  # fmt: skip
        records.append((key, entry.value, chain,
                        [("type", b"AggregateState"), ("aggregation", name.encode())]))  # fmt: skip
    sink.publish(records)
