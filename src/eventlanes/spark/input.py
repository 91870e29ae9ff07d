"""What a Spark replay reads: the store (or an export) up to its end, and the check that Spark read
every event of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError, SparkJobError
from ..processing.aggregating.aggregation import Aggregation
from ..upcasting import Upcasters
from ..upcasting.arrow import upcast_batch
from .export import PREFIX, check_store, load_manifest
from .source import Keyed


@dataclass
class ReplayInput:
    """The events up to ``end`` and how to learn how many rows Spark read of them."""

    df: Any
    end: int
    expected: int  # events in (0, end] in the store (or the export)
    read: Callable[[], int | None]  # rows Spark read, once the plan has run
    columns: dict[str, str] | None = None  # an export's typed data columns (property -> type)
    chained_types: list[str] | None = None  # an export's event types with chained events
    parquet: bool = False
    pending: Future[None] | None = None  # the store's check of an export, run meanwhile
    #: the store's read: the event types with chained events it read (once the plan has run)
    chained: Callable[[], set[str] | None] | None = None
    #: the store's read of events alone, where ``df`` holds the executors' partial folds
    events_df: Any = None

    def verify(self) -> None:
        """Before anything is written: the store's check of the export passed (or raise)."""
        if self.pending is not None:
            self.pending.result()

    @property
    def events(self) -> Any:
        """The events' own columns (``FIELDS``), without an export's typed columns."""
        from .source import FIELDS

        keys = ["key"] if "key" in self.df.columns else []  # read on the executors (Keyed)
        return self.df.select(*FIELDS, *keys)


def read_input(
    spark: Any,
    app: Any,
    url: str,
    n: int,
    parquet: str | None,
    decl: Any = None,
    upcasters: Upcasters | None = None,
    keyed: Keyed | None = None,
) -> ReplayInput:
    """The events up to the store's head, or exactly the files of a Parquet export.
    ``decl``: a declarative aggregation's declaration (the store's read takes only what its
    plan reads, the declared properties typed); ``upcasters``: the processor's, applied on the
    executors as the events are read (an export holds what is stored); ``keyed``: a fold keyed
    by a data property reads the events it folds, their keys read on the executors."""
    from pyspark.sql import functions as F

    from .source import FIELDS, SCHEMA, Declared, read_events

    if parquet:  # the export's end: the live processor folds what came after it
        export = load_manifest(parquet, app.store)
        end, files, expected = export["end"], export["paths"], export["events"]
        if not files:  # an export of an empty store
            check_store(parquet, export, app.store)
            return ReplayInput(spark.createDataFrame([], SCHEMA), end, 0, lambda: 0)
        # The store's count up to the export's end runs while Spark reads the files.
        pending: Future[None] = Future()
        threading.Thread(target=_settle, args=(pending, check_store, parquet, export, app.store),
                         daemon=True, name="eventlanes-export-check").start()  # fmt: skip
        columns = export["columns"]
        chained_types = export["chained_types"]
        schema = ", ".join([SCHEMA, *(f"`{PREFIX}{p}` {k}" for p, k in columns.items())])
        df = spark.read.schema(schema).parquet(*files).where(F.col("position") <= end)
        count = df.count  # of the files' rows, as read (an upcaster neither adds nor drops)
        if upcasters is not None:
            # The export's typed columns hold the stored shapes: the data is parsed instead.
            df = df.select(*FIELDS).mapInArrow(
                lambda it: (upcast_batch(upcasters, b) for b in it), SCHEMA
            )
            columns, chained_types = {}, sorted({upcasters.current(t) for t in chained_types})
        # Spark's own row count of those files (a declarative plan counts them in its job).
        return ReplayInput(df, end, expected, count, columns, chained_types, True, pending)
    end = app.store.head()
    if decl is None:
        df, counter = read_events(spark, url, 0, end, n, keyed, upcasters)
        return ReplayInput(df, end, app.store.count(until=end), counter.total)
    kinds, types, fields = decl.kinds(), tuple(sorted(decl.types)), decl.partials()
    # Folded on the executors as read; the events alone for the plan with source chains.
    df, counter = read_events(spark, url, 0, end, n, Declared(kinds, types, fields, decl.key),
                              upcasters)  # fmt: skip
    events, _ = read_events(spark, url, 0, end, n, Declared(kinds, types), upcasters)
    return ReplayInput(df, end, app.store.count(until=end), counter.total,
                  chained=counter.chained_types, events_df=events)  # fmt: skip


def keyed_of(agg: Aggregation) -> Keyed | None:
    """What the store's read gives a Python fold keyed by a data property (None: events)."""
    if agg.declaration is not None or agg.key_field is None or agg.folds.any:
        return None
    return Keyed(agg.key_field, tuple(sorted(agg.folds.by_type)))


def _settle(future: Future[None], fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the replay's thread
        future.set_exception(exc)
    else:
        future.set_result(None)


def refuse_sources(proc: Any) -> None:
    """An aggregation of several sources, refused before any work: Spark reads the app's own
    store, and a token without the other sources' positions would say they hold nothing."""
    if isinstance(proc, Aggregation) and proc.sources:
        raise InvalidInputError(
            f"aggregation {proc.name!r} reads several sources ({', '.join(sorted(proc.sources))}"
            " besides this store): Spark reads this app's store only (eventlanes run --engine "
            "local)"
        )


def upcasters_of(proc: Any) -> Upcasters | None:
    """The upcasters into the types ``proc`` handles (shipped with the job; None: none)."""
    return proc.upcasters.into(proc.handled_types())


def check_read(name: str, what: str, read: int | None, expected: int) -> int:
    """Refuse to write anything unless Spark read exactly the store's events."""
    if read != expected:
        got = "an incomplete or inconsistent set of" if read is None else f"{read:,}"
        raise SparkJobError(
            f"{name}: Spark {what} {got} events but the store holds {expected:,} up to the "
            "replay's end: nothing was written (do executors see the same store?)"
        )
    return read
