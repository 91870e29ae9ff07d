"""Republishers: consume events, append derived events carrying their source chain.

A republisher appends its outputs in a transaction of its own (the target may be another store)
and commits its token afterwards: it is at-least-once. If it crashes between the two it appends
the same outputs again on restart; every output carries ``metadata["source_chain"]`` back to its
root event, so aggregations downstream drop the repeats (exactly-once overall).

A handler returns an ``el.NewEvent``, a list of them (a flat map), or None. All outputs of a
batch for one target stream are appended in one atomic append, so the outputs of one input are
never stored partially.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from ..callables import check
from ..errors import InvalidInputError
from ..events import Event
from ..store import EventStore
from ..upcasting import Upcasters
from .handlers import FunctionsByType
from .options import RepublisherOptions
from .processor import Processor

Republish = Callable[[Event], Any]


class Republisher(Processor):
    """``app.republisher(name, to_stream=..., to_store=None)``: ``@rep.on(type)`` registers
    ``fn(event)``, whose outputs are appended to ``to_stream`` of the app's store or of
    ``to_store``. ``stores(url)`` opens that store (None: the app's own) when the outputs are
    first appended."""

    kind = "republisher"

    def __init__(
        self,
        name: str,
        *,
        to_stream: str | Callable[[Event], str],
        to_store: str | EventStore | None = None,
        stores: Callable[[str | None], EventStore],
        prefix: str,
        upcasters: Upcasters,
        **options: Unpack[RepublisherOptions],
    ) -> None:
        if "guarantee" in options:
            raise InvalidInputError(
                f"republisher {name!r}: the guarantee is 'at-least-once' (outputs are appended "
                "before the token; source chains let aggregations drop the repeats)"
            )
        if options.get("version", 1) != 1:
            raise InvalidInputError(
                f"republisher {name!r}: versions are for projections and aggregations; a second "
                "version of a republisher would append the outputs of all history again (its "
                "mappings run on replays too): define a republisher of another name"
            )
        super().__init__(
            name, prefix=prefix, upcasters=upcasters, guarantee="at-least-once", **options
        )
        if not (isinstance(to_stream, str) and to_stream):
            if not callable(to_stream):
                raise InvalidInputError(
                    f"republisher {name!r}: to_stream must be a name or function"
                )
            check(to_stream, f"republisher {name!r}: to_stream", ("event",),
                  why_sync="the stream is named when the outputs are appended")  # fmt: skip
        self.to_stream = to_stream
        self.to_store = to_store
        self.stores = stores
        self.functions = FunctionsByType(
            f"republisher {name!r}", role="mapping", params=("event",), awaited=True
        )

    def on(self, *types: str) -> Callable[[Republish], Republish]:  # type: ignore[override]
        """Decorator: ``fn(event)`` returns an ``el.NewEvent``, a list of them, or None (an
        ``async def`` is awaited, one event at a time)."""
        register = self.functions.on(*types)
        self.refuse_upcast(types)
        return register

    def on_any(self, fn: Republish) -> Republish:  # type: ignore[override]
        """Decorator: ``fn(event)`` for every event (as :meth:`on`); only for a republisher
        appending to another store (``to_store=``): it would read its own outputs again."""
        if self.to_store is None:
            raise InvalidInputError(
                f"republisher {self.name!r}: on_any maps every event of the store it appends "
                "to, its own outputs too, so it would republish them forever: name the types "
                "it maps with on(...) (outputs of other types), or append to another store "
                "(to_store=)"
            )
        return self.functions.add_any(fn)

    def handled_types(self) -> frozenset[str] | None:
        return self.functions.types()

    def target(self) -> EventStore:
        """The store the outputs are appended to (the app's own unless ``to_store``)."""
        if self.to_store is None or isinstance(self.to_store, str):
            return self.stores(self.to_store)
        return self.to_store  # an EventStore, or anything with its append()

    def check_target(self, own: EventStore) -> None:
        """Before starting: another store whose events table has this one's name would take
        the outputs' roots (this store's positions) for its own events."""
        target = self.target()
        table = getattr(target, "events_table", None)
        if not same_store(target, own) and table == own.events_table:
            raise InvalidInputError(
                f"republisher {self.name!r}: to_store keeps its events in a table named "
                f"{table!r}, as this store does: the outputs' chains, rooted in this store's "
                "events, would name that store's own events there, and its aggregations would "
                "drop genuine inputs as repeats (give one of the stores another prefix=)"
            )


def same_store(target: Any, store: EventStore) -> bool:
    """Whether ``target`` appends to ``store``'s events (the same object, or another handle
    on the same database and table)."""
    if target is store:
        return True
    db = getattr(target, "db", None)
    return (
        isinstance(target, EventStore)
        and db is not None
        and db.url.url == store.db.url.url
        and target.events_table == store.events_table
    )
