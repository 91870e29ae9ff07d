"""What operators do with an app's processors and ingestors, by name: status, read-your-writes,
reset, pause and resume, split, merge and release, dead letters, versions (akka's
``ProjectionManagement``). Here, and not in the callers, is where a name is told to be an
ingestor or a processor. The App is one of these, with the definitions and the lifecycle on
top."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ..errors import InvalidInputError
from ..kafka import parking
from ..kafka import status as ingest_status
from ..names import check_table_name, split_version, validate_base_name, validate_processor_name
from ..node import Node
from ..processing.processor import Processor
from ..processing.running import requests
from ..processing.running.balance import balance
from ..processing.runtime import Runtime
from ..processing.tables.dead_letters import DeadLetter
from ..registry import Registry
from . import control, dead_letters, reset, status
from . import versions as lifecycle
from .reset import ResetPlan
from .views import ProcessorView


class Operations:
    """The operations on the processors and ingestors of ``registry``, over ``runtime``;
    ``node``: what runs in this process (read-your-writes waits on it)."""

    def __init__(self, runtime: Runtime, registry: Registry, node: Node) -> None:
        self.runtime = runtime
        self.registry = registry
        self.node = node

    def get(self, name: str) -> Processor:
        """The processor defined with this name (``orders@v2`` for a version); InvalidInputError
        naming the defined ones otherwise."""
        return self.registry.get(name)

    # -- inspecting ----------------------------------------------------------------------------
    def status(self, name: str) -> ProcessorView:
        """Where the processor is, per segment, and for a processor with versions which one
        serves and how far behind it this one is (reads only: nothing is created)."""
        proc = self.get(name)
        defined = lifecycle.defined_versions(self.registry.processors.values(), proc.base)
        return status.status(self.runtime, proc, defined)

    def ingest_status(self, name: str) -> Any:
        """Where the ingestor is, per partition (:class:`eventlanes.kafka.status.IngestorView`;
        reads only)."""
        self.registry.ingestor(name)
        return ingest_status.view(self.runtime.db, name, self.runtime.claim_timeout)

    def initialize(self, name: str) -> None:
        """Create the processor's token rows if they do not exist yet (the runners and the
        commands that change tokens do it themselves)."""
        self.runtime.initialize(*self.get(name).token_spec())

    def wait_for(self, name: str, positions: int | Iterable[int], timeout: float = 30.0) -> None:
        """Read-your-writes: block until processor ``name`` has handled the events at
        ``positions`` (e.g. what ``append`` returned); raises TimeoutError after ``timeout``."""
        status.wait_for(self.runtime, self.get(name), positions, timeout)

    def wait_until_caught_up(
        self, timeout: float = 60.0, processors: list[str] | None = None
    ) -> None:
        """Block until every segment of the processors has reached the store's head; first,
        until each Kafka ingestor (all of them, or those named) has appended every record
        its topic held when the call began (the high watermarks read then)."""
        deadline = time.monotonic() + timeout
        selected, ingestors = self.registry.split(processors)
        if ingestors:
            rt, ingesting = self.runtime, self.node.ingest_runners
            ingest_status.wait_caught_up(rt.db, ingestors, ingesting, rt.claim_timeout, deadline)
        head = 0  # the last head read: it only grows
        names = {p.name for p in selected}
        while True:
            runners = self.node.runners
            crashed = [r.error for r in runners if r.error is not None]
            if crashed:
                raise RuntimeError(f"a processor crashed: {crashed[0]!r}") from crashed[0]
            # A segment held here still short of a head already read is not caught up: no
            # need to ask the database (its stored token is at most the one in memory).
            behind = any(r.behind(head) for r in runners if r.name in names)
            if not behind:
                head = self.runtime.store.head()
                if all(status.caught_up(self.runtime, p, head) for p in selected):
                    return
            if time.monotonic() > deadline:
                views = [self.status(p.name) for p in selected]
                lagging = {v.name: v.lag for v in views if not v.caught_up}
                raise TimeoutError(f"processors not caught up after {timeout} s: {lagging}")
            time.sleep(0.05)

    # -- steering ------------------------------------------------------------------------------
    def reset(
        self,
        name: str,
        to: str | int | datetime = "tail",
        *,
        wait: bool = False,
        timeout: float | None = None,
        context: Any = None,
    ) -> int:
        """Reset a stopped processor and replay from ``to`` ("tail", "head", a position or a
        time); refuses while a live node holds a segment unless ``wait``."""
        return reset.reset(self.runtime, self.get(name), to, wait, timeout, context)

    def reset_plan(
        self, name: str, to: str | int | datetime = "tail", *, context: Any = None
    ) -> ResetPlan:
        """What ``reset(name, to)`` would do, read without writing: how many events it replays
        (handled before) and handles for the first time, which segments a live node holds, and
        warnings (e.g. rows its handlers would write twice without an ``on_reset`` handler)."""
        return reset.reset_plan(self.runtime, self.get(name), to, context)

    def balance(self, name: str, timeout: float = 15.0) -> list[str]:
        """Split or merge the processor's segments, one operation at a time, until the live
        nodes can share them evenly (see ``eventlanes.processing.running.balance``)."""
        return balance(self.runtime, self.get(name), timeout)

    def pause(self, name: str) -> bool:
        """Pause the processor on every node (segments released, not claimed until resumed);
        True if this call paused it. An ingestor releases its partitions the same way."""
        if name in self.registry.ingestors:
            return self.runtime.tokens.pause(name)
        return control.pause(self.runtime, self.get(name))

    def resume(self, name: str) -> bool:
        """Resume a paused processor (or ingestor) on every node; True if this call resumed it."""
        if name in self.registry.ingestors:
            return self.runtime.tokens.resume(name)
        return control.resume(self.runtime, self.get(name))

    def split(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owner of segment ``segment_id`` to split it (done here when nobody holds it);
        returns what was done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "split", timeout)

    def merge(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owners of segment ``segment_id`` and its sibling to merge them; returns what was
        done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "merge", timeout)

    def release(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        """Ask the owner of segment ``segment_id`` to store its token and let it go; returns what
        was done."""
        return requests.steer(self.runtime, self.get(name), segment_id, "release", timeout)

    # -- dead letters --------------------------------------------------------------------------
    def dead_letter_list(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> list[DeadLetter]:
        """A processor's parked events, or an ingestor's parked records (``position`` packs
        partition and offset, ``version`` is the offset, the key is the stream)."""
        if name in self.registry.ingestors:
            return self.runtime.dead_letters.list(name, key, position)
        return dead_letters.list_dead_letters(self.runtime, self.get(name), key, position)

    def retry_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> tuple[int, int]:
        """Re-run parked events (all, one key's, or one position's); (handled, still parked).
        For an ingestor: fetch its parked records again and append them."""
        if name in self.registry.ingestors:
            return parking.retry(self.runtime, self.registry.ingestors[name], key, position)
        return dead_letters.retry_dead_letters(self.runtime, self.get(name), key, position)

    def discard_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> int:
        """Drop parked events (all, one key's, or one position's) for good; returns how many."""
        if name in self.registry.ingestors:
            return parking.discard(self.runtime, self.registry.ingestors[name], key, position)
        return dead_letters.discard_dead_letters(self.runtime, self.get(name), key, position)

    # -- versions (blue/green: eventlanes.admin.versions) ----------------------------------
    def promote(self, name: str) -> str:
        """Switch readers of a processor to its version ``name`` (``"orders@v2"``, or the
        plain name for version 1): ``app.table(...)`` and ``app.serving(...)`` resolve to it
        from then on, in every process. Refused with :class:`VersionError`, giving every
        reason, unless it has caught up: each segment at the head of every store it reads
        (read now), no failing segment, no parked dead letter, not paused. Writes one row
        (no DDL: a role with DML only may promote)."""
        proc = self.get(name)
        defined = lifecycle.defined_versions(self.registry.processors.values(), proc.base)
        return lifecycle.promote(self.runtime, proc, defined)

    def retire_plan(self, name: str, *, keep_tables: bool = False) -> lifecycle.RetirePlan:
        """What ``retire(name)`` would drop, read without writing; raises
        :class:`VersionError` when it would be refused."""
        return lifecycle.retire_plan(self.runtime, name, self._retirable(name), keep_tables)

    def retire(self, name: str, *, keep_tables: bool = False) -> lifecycle.RetirePlan:
        """Drop an old version (``"orders"``: version 1; ``"orders@v2"``) for good: its
        tokens, aggregation states, dead letters and Spark batches, and the tables its
        processor's versions declare (``tables=``; ``keep_tables``: leave them, e.g. for a
        role that may not drop them). Never done by itself; refused while the version serves
        readers or runs anywhere. Returns what was dropped. Its definition may already be
        gone from the app; another version of the processor must be defined."""
        return lifecycle.retire(self.runtime, name, self._retirable(name), keep_tables)

    def _retirable(self, name: str) -> list[Processor]:
        base, _ = split_version(validate_processor_name(name))
        procs = self.registry.versions_of(base)
        if not procs:
            raise InvalidInputError(
                f"unknown processor {name!r}: no version of {base!r} is defined in this app"
            )
        return procs

    def serving(self, name: str) -> Processor:
        """The definition of the version of processor ``name`` that readers see (the last
        one promoted; before any promotion the lowest that has run), e.g. to read an
        aggregation: ``app.serving("totals").get(key)``."""
        base = validate_base_name(name)
        defined = {p.version: p for p in self.registry.versions_of(base)}
        version = lifecycle.serving(self.runtime, base, defined)
        if version is None or version not in defined:
            raise InvalidInputError(
                f"readers of {base!r} see version {version}, which this app does not define"
                if version is not None
                else f"unknown processor {name!r}"
            )
        return defined[version]

    def table(self, name: str, processor: str | None = None) -> str:
        """The full name of table ``name`` of the version of ``processor`` that serves
        readers: ``{prefix}name`` for version 1, ``{prefix}name__vN`` once version N is
        promoted. Without ``processor``: the one processor of the app that declares the table
        (``tables=[...]``). Read on every call, so a promotion in another process counts at
        once."""
        try:
            check_table_name(name)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        if processor is None:
            procs = self.registry.processors.values()
            bases = sorted({p.base for p in procs if name in p.tables})
            if len(bases) != 1:
                raise InvalidInputError(
                    f"no processor of this app declares table {name!r} (tables=[...])"
                    if not bases
                    else f"table {name!r} is declared by {', '.join(bases)}: name the processor"
                )
            processor = bases[0]
        base = validate_base_name(processor)
        defined = lifecycle.defined_versions(self.registry.processors.values(), base)
        return lifecycle.table_name(self.runtime, name, base, defined)
