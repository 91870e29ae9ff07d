"""Testing your own processors: given these events, run to caught-up, assert on rows or states.

Plain functions on an :class:`~eventlanes.App` built by your own code (on a store URL that
your test provides; the pytest plugin :mod:`eventlanes.testing.pytest_plugin` gives one per
test, on SQLite and PostgreSQL)::

    app = build_app(url)                                  # your processors
    given(app, {"order-1": [el.NewEvent("Placed", {"total": 5})]})
    run_until_caught_up(app)                              # every processor, or the ones named
    assert rows(app, f"SELECT total FROM {app.db.table('orders')}") == [(5,)]
    assert states(app, "totals") == {"order-1": {"sum": 5}}

``run_until_caught_up`` starts the processors in this process, waits until each has reached
the head of every store it reads (also one that has not claimed a segment yet), and stops
them. A handler that fails does not leave the test waiting for the timeout: the run stops and
the handler's error is raised at once; so are events parked as dead letters, unless
``dead_letters=True``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..app import App
from ..events import NewEvent
from ..processing.tables.states import decode

__all__ = ["ProcessorFailed", "given", "rows", "run_until_caught_up", "states"]

Events = Mapping[str, Iterable[NewEvent]] | Iterable[tuple[str, NewEvent]]


class ProcessorFailed(AssertionError):
    """A processor's handler failed, or parked events, during :func:`run_until_caught_up`."""


def given(app: App, events: Events) -> list[int]:
    """Append ``events`` and return their positions: ``{stream: [event, ...]}`` (each
    stream's events in order, one append per stream) or ``[(stream, event), ...]`` (one
    append per event, in the order given: streams interleaved)."""
    positions: list[int] = []
    if isinstance(events, Mapping):
        for stream, stream_events in events.items():
            positions += app.store.append(stream, list(stream_events))
        return positions
    for item in events:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"given() takes (stream, event) pairs or a dict, got {item!r}")
        stream, event = item
        positions += app.store.append(stream, [event])
    return positions


def run_until_caught_up(
    app: App, *processors: str, timeout: float = 30.0, dead_letters: bool = False
) -> None:
    """Start ``processors`` (all of the app's when none are named), wait until each has
    handled everything in every store it reads, stop them. Raises :class:`ProcessorFailed`
    as soon as a handler fails (with its error), or when events were parked as dead letters
    (unless ``dead_letters``), and TimeoutError after ``timeout`` seconds."""
    names = list(processors) or list(app.processors)
    for name in names:
        app.get(name)  # an unknown name: refused before anything starts
    app.start(names)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                app.wait_until_caught_up(min(0.25, max(0.0, deadline - time.monotonic())), names)
                break
            except TimeoutError:
                _raise_failures(app, names)
                if time.monotonic() >= deadline:
                    lags = ", ".join(f"{n} (lag {app.status(n).lag})" for n in names)
                    raise TimeoutError(f"not caught up within {timeout:g} s: {lags}") from None
    finally:
        app.stop()
    _raise_failures(app, names)
    if not dead_letters:
        parked = {n: app.dead_letter_list(n) for n in names if app.get(n).on_error == "dead_letter"}
        found = [f"{n}: event {d.position}: {d.error}" for n, ds in parked.items() for d in ds]
        if found:
            raise ProcessorFailed("events were parked as dead letters:\n" + "\n".join(found))


def _raise_failures(app: App, names: Sequence[str]) -> None:
    for name in names:
        errors = {s.last_error for s in app.status(name).segments if s.last_error}
        if errors:
            raise ProcessorFailed(f"processor {name!r} failed: {'; '.join(sorted(errors))}")


def rows(app: App, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """The rows of a query on the app's database, as tuples; ``?`` placeholders on both
    backends. Name your tables with ``app.db.table("name")`` (``ctx.table`` in handlers)."""
    return [tuple(r) for r in app.db.query(app.db.sql(sql), params)]


def states(app: App, aggregation: str) -> dict[str, Any]:
    """Every stored state of ``aggregation``, by key (as ``agg.get(key)`` returns them)."""
    app.get(aggregation)
    table = app.aggregate_states.table
    found = app.db.query(
        app.db.sql(f"SELECT key, value FROM {table} WHERE aggregation = ?"), (aggregation,)
    )
    return {key: decode(value) for key, value in found}
