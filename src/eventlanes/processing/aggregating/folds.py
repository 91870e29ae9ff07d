"""The fold kernel shared by the local engine and Spark: fresh states, returned values, checked
outputs and the events a downstream stage folds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ...callables import name_of
from ...errors import InvalidInputError
from ...events import Event, NewEvent, encode_object
from ...lineage import CHAIN_KEY

#: states a fold cannot change in place: ``state += 1`` rebinds the fold's own name only
_IMMUTABLE = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None))


_IN_PLACE = 'a fold updates its state in place (state["n"] += 1) and returns nothing'


def check_fresh_state(kind: str, name: str, initial: Callable[[], Any]) -> None:
    """Refuse an ``initial()`` whose states no fold can change (an int, a string, a tuple,
    None...): folds update the state in place, so such a state would stay as it started,
    silently. Only where no downstream stage takes the folds' outputs (a stage of its own
    is then the point: its upstream state may be anything)."""
    try:
        value = initial()
    except Exception:  # noqa: BLE001 - fails where the first state is made, with its error
        return
    if isinstance(value, _IMMUTABLE):
        raise InvalidInputError(
            f"{kind} {name!r}: initial() gives {type(value).__name__} {value!r}, which no fold "
            f"can change ({_IN_PLACE}; a value it returns is not the new state): start from "
            'a dict or a list, e.g. initial=lambda: {"n": 0}'
        )


def returned_value(name: str, key: str, event: Event, fold: Any, produced: Any) -> None:
    """A fold returned a value where no downstream stage takes outputs: refused, since it
    would be dropped (a fold returning the new state, ``return state + 1``, would otherwise
    leave the state as it was, silently). Returning the state itself is allowed."""
    not_awaitable(produced, fold, event)
    shown = repr(produced)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise InvalidInputError(
        f"aggregation {name!r}, key {key!r}: fold {name_of(fold)} returned "
        f"{type(produced).__name__} {shown} for event {event.position} ({event.type}), and "
        f"no downstream stage takes a fold's outputs: {_IN_PLACE}, it does not return the "
        "new state"
    )


def fold_event(name: str, folds: Any, key: str, value: Any, event: Event) -> None:
    """Fold ``event`` into ``value`` with each of ``folds`` (a ``FunctionsByType``) for its
    type, where no downstream stage takes outputs (a returned value is refused)."""
    for fold in folds.for_type(event.type):
        if (produced := fold(value, event)) is not None and produced is not value:
            returned_value(name, key, event, fold, produced)


def not_awaitable(produced: Any, fold: Any, event: Event) -> None:
    """A fold's result is its outputs: a coroutine (a plain def returning one) never ran."""
    if hasattr(produced, "__await__") or inspect.isgenerator(produced):
        raise InvalidInputError(
            f"event {event.position} ({event.type}): fold {name_of(fold)} returned "
            f"{type(produced).__name__}, whose body never runs: folds update the state in place"
        )


def check_output(name: str, key: str, event: Event, index: int, out: Any) -> None:
    """A fold's output must be an ``el.NewEvent`` whose data and metadata read back equal from
    JSON: the Spark engine passes outputs on as JSON, the local one in memory, and both must
    fold the same values (an output ``{1: "a"}`` would reach Spark's stages as ``{"1": "a"}``)."""
    where = f"aggregation {name!r}, key {key!r}: output #{index} of event {event.position}"
    if not isinstance(out, NewEvent):
        raise InvalidInputError(f"{where} is a {type(out).__name__}, not an el.NewEvent")
    encode_object(out.data, f"{where} ({out.type}) data")
    encode_object(out.metadata, f"{where} ({out.type}) metadata")


def output_event(
    out: NewEvent, position: int, source: str, path: tuple[int, ...], recorded_at: Any = 0
) -> Event:
    """A fold output as the event a downstream stage folds, on both engines: at its input's
    ``position``, from ``source`` (``"aggregation:key"``), with the root of ``path`` as its
    chain; ``recorded_at``: its input's as read (Spark's stages have none: 0)."""
    meta = {**out.metadata, CHAIN_KEY: [{"source": source, "partition": "", "offset": path[0]}]}
    return Event(position, source, 0, out.type, out.data, meta, recorded_at, 0, source)
