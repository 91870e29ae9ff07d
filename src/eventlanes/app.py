"""The App: an event store, its token store, and the processors that consume it.

Nothing connects when an App is defined (modules that define one are imported by the CLI and by
worker processes); the store is opened on first use.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import datetime
from functools import cached_property
from typing import Any

from .db import Database
from .errors import InvalidInputError
from .notify import Wakeup, wakeup_for
from .observe import NO_OBSERVER, Observer
from .processing.admin import (
    ProcessorView,
    discard_dead_letters,
    reset,
    retry_dead_letters,
    status,
    steer,
)
from .processing.aggregation import Aggregation, StateTable
from .processing.dead_letters import DeadLetter, DeadLetterStore
from .processing.processor import Processor
from .processing.republisher import Republisher
from .processing.runner import ProcessorRunner, node_name
from .store import EventStore, open_store
from .tokens import DEFAULT_CLAIM_TIMEOUT, InMemoryTokenStore, TokenStore, open_token_store

log = logging.getLogger("eventlanes")


class App:
    """``el.App("sqlite:///shop.db")``: the store URL; the token store defaults to the same
    database, so projections written with ``ctx.execute`` commit together with their tokens."""

    def __init__(
        self,
        url: str,
        *,
        token_store: str | TokenStore | None = None,
        claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
        poll_interval: float | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidInputError(f"App needs a store URL, got {url!r}")
        self.url = url
        self._token_store_spec = token_store
        self.claim_timeout = claim_timeout
        self.poll_interval = poll_interval
        self.processors: dict[str, Processor] = {}
        self._runners: list[ProcessorRunner] = []
        self._wakeup: Wakeup | None = None
        self._stop = threading.Event()
        self.observer: Observer = NO_OBSERVER  # observe
        self._metrics: Any = None  # observe

    # -- resources, opened lazily --------------------------------------------------------------
    @cached_property
    def store(self) -> EventStore:
        return open_store(self.url)

    @property
    def db(self) -> Database:
        return self.store.db

    @cached_property
    def tokens(self) -> TokenStore:
        spec = self._token_store_spec
        if isinstance(spec, TokenStore):
            return spec
        if spec == "memory":
            return InMemoryTokenStore(self.claim_timeout)
        return open_token_store(spec or self.db, claim_timeout=self.claim_timeout)

    def source_store(self, target: str | EventStore) -> EventStore:
        """An extra source of a multi-source processor, opened once per app."""
        if isinstance(target, EventStore):
            return target
        if target == self.url:
            raise InvalidInputError(f"source {target!r} is the app's own store")
        opened = self.__dict__.setdefault("_sources", {})
        if target not in opened:
            opened[target] = open_store(target)
        return opened[target]

    @cached_property
    def dead_letters(self) -> DeadLetterStore:
        return DeadLetterStore(self.db)

    # -- definition ----------------------------------------------------------------------------
    def processor(self, name: str, **options: Any) -> Processor:
        """Define a processor; see :class:`eventlanes.processing.processor.Processor`."""
        return self._add(Processor(self, name, **options))

    def aggregation(self, name: str, **options: Any) -> Aggregation:
        """An exactly-once aggregation (see ``eventlanes.processing.aggregation``)."""
        return self._add(Aggregation(self, name, **options))

    def republisher(self, name: str, **options: Any) -> Republisher:
        """A processor appending derived events with their source chain; see
        :class:`eventlanes.processing.republisher.Republisher`."""
        return self._add(Republisher(self, name, **options))

    def _add(self, proc: Any) -> Any:
        if proc.name in self.processors:
            raise InvalidInputError(f"processor {proc.name!r} is already defined in this app")
        self.processors[proc.name] = proc
        return proc

    @cached_property
    def aggregate_states(self) -> StateTable:
        return StateTable(self.db)

    def get(self, name: str) -> Processor:
        try:
            return self.processors[name]
        except KeyError:
            known = ", ".join(self.processors) or "none"
            raise InvalidInputError(f"unknown processor {name!r} (defined: {known})") from None

    def _selected(self, names: list[str] | None) -> list[Processor]:
        if not names:
            return list(self.processors.values())
        return [self.get(n) for n in names]

    # -- running -------------------------------------------------------------------------------
    def start(
        self,
        processors: list[str] | None = None,
        *,
        node_index: int | None = None,
        nodes: int | None = None,
        observer: Observer | None = None,
        metrics_port: int | None = None,
    ) -> None:
        """Start the processors in background threads of this process. ``metrics_port``:
        serve Prometheus metrics there (``observer``: your own :class:`Observer` instead)."""
        if self._runners:
            raise RuntimeError("this app is already running")
        selected = self._selected(processors)
        if not selected:
            raise InvalidInputError("this app defines no processor to run")
        static = None
        if node_index is not None or nodes is not None:
            if node_index is None or nodes is None:
                raise InvalidInputError("static mode needs both node_index and nodes")
            static = (node_index, nodes)
        self._stop.clear()
        self.observer = self._observe(observer, metrics_port, [p.name for p in selected])  # observe
        self._wakeup = wakeup_for(self.store, self.poll_interval)
        owner = node_name()
        for proc in selected:
            runner = ProcessorRunner(self, proc, owner, static, self._wakeup)
            runner.start()
            self._runners.append(runner)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batches in hand, store tokens, release claims."""
        self._stop.set()
        runners, self._runners = self._runners, []
        for runner in runners:
            runner.stopping.set()
        for runner in runners:
            runner.stop(timeout)
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        if self._metrics is not None:  # observe
            self._metrics, server = None, self._metrics  # observe
            server.close()  # observe
        errors = [r.error for r in runners if r.error is not None]
        if errors:
            raise errors[0]

    def _observe(  # observe
        self, observer: Observer | None, port: int | None, names: list[str]
    ) -> Observer:
        if port is None:
            return observer or NO_OBSERVER
        try:
            from prometheus_client import CollectorRegistry

            from .metrics import MetricsServer, PrometheusObserver, registry_for
        except ImportError as exc:
            raise InvalidInputError(
                f"metrics need prometheus-client ({exc}): pip install 'eventlanes[ops]'"
            ) from None

        if observer is None:
            observer = PrometheusObserver(CollectorRegistry())
        if not isinstance(observer, PrometheusObserver):
            raise InvalidInputError("metrics_port needs no observer or a PrometheusObserver")
        self._metrics = MetricsServer(registry_for(self, observer, names), port)
        return observer

    @property
    def metrics_port(self) -> int | None:  # observe
        """The port metrics are served on (useful with ``metrics_port=0``)."""
        return None if self._metrics is None else self._metrics.port

    @property
    def running(self) -> bool:
        return bool(self._runners)

    def run(self, processors: list[str] | None = None, **options: Any) -> None:
        """Run until SIGINT/SIGTERM (or ``stop()`` from another thread), then shut down cleanly;
        ``options`` as for :meth:`start`."""
        self.start(processors, **options)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            while not self._stop.wait(0.5):
                if any(r.stopping.is_set() for r in self._runners):
                    break  # a runner crashed: stop the rest and raise its error
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

    def wait_until_caught_up(
        self, timeout: float = 60.0, processors: list[str] | None = None
    ) -> None:
        """Block until every segment of the processors has reached the store's head."""
        deadline = time.monotonic() + timeout
        while True:
            crashed = [r.error for r in self._runners if r.error is not None]
            if crashed:
                raise RuntimeError(f"a processor crashed: {crashed[0]!r}") from crashed[0]
            views = [self.status(p.name) for p in self._selected(processors)]
            if all(v.caught_up for v in views):
                return
            if time.monotonic() > deadline:
                lagging = {v.name: v.lag for v in views if not v.caught_up}
                raise TimeoutError(f"processors not caught up after {timeout} s: {lagging}")
            time.sleep(0.05)

    # -- inspecting and steering ---------------------------------------------------------------
    def status(self, name: str) -> ProcessorView:
        proc = self.get(name)
        self.initialize(name)
        return status(self, proc)

    def initialize(self, name: str) -> None:
        """Create the processor's token rows if they do not exist yet (the runners, status and
        admin commands do it themselves; once per app, as it is a locking transaction)."""
        proc = self.get(name)
        done = self.__dict__.setdefault("_initialized", set())
        if proc.name not in done:
            self.tokens.initialize(
                proc.name, segments=proc.segments, initial=proc.initial, store=self.store
            )
            done.add(proc.name)

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
        return reset(self, self.get(name), to, wait, timeout, context)

    def split(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        return steer(self, self.get(name), segment_id, "split", timeout)

    def merge(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        return steer(self, self.get(name), segment_id, "merge", timeout)

    def release(self, name: str, segment_id: int, timeout: float = 15.0) -> str:
        return steer(self, self.get(name), segment_id, "release", timeout)

    def dead_letter_list(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> list[DeadLetter]:
        return self.dead_letters.list(self.get(name).name, key=key, position=position)

    def retry_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> tuple[int, int]:
        """Re-run parked events (only those of ``key`` or the one at ``position`` if given)."""
        return retry_dead_letters(self, self.get(name), key=key, position=position)

    def discard_dead_letters(
        self, name: str, key: str | None = None, position: int | None = None
    ) -> int:
        return discard_dead_letters(self, self.get(name), key=key, position=position)

    def close(self) -> None:
        if self._runners:
            self.stop()
        for store in self.__dict__.get("_sources", {}).values():
            store.close()
        if "store" in self.__dict__:
            self.store.close()
