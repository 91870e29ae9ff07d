"""Aggregation states cached by bytes (``state_cache_bytes``): with a budget far below the
keys' states, written states are dropped and read back, and changed ones are written before
``persist_every``; the folds stay exact (none lost, none twice), across restarts and kills."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes.observe import Observer
from eventlanes.processing.aggregating.cache import STATE_OVERHEAD
from eventlanes.processing.options import STATE_CACHE_BYTES
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
E = el.NewEvent
#: about 10 small states per segment: nearly every batch drops states and writes early
BUDGET = 20_000
NAMES = ("sums", "counted")


class Seen(Observer):
    """Events handled and state writes, per processor, and failures (a batch or a write that
    failed is retried from the stored token: it would heal what the cache broke)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled: dict[str, int] = {}
        self.writes: dict[str, int] = {}
        self.failures: list[str] = []

    def failed(self, processor: str, segment: str, error: str) -> None:
        with self.lock:
            self.failures.append(f"{processor} {segment}: {error}")

    def batch_handled(
        self, processor: str, segment: str, events: int, handler_seconds: float
    ) -> None:
        with self.lock:
            self.handled[processor] = self.handled.get(processor, 0) + events

    def committed(self, processor: str, segment: str, seconds: float) -> None:
        with self.lock:
            self.writes[processor] = self.writes.get(processor, 0) + 1


def sums_app(url: str, persist_every: float = 3600.0) -> el.App:
    """A Python fold and a declared one over the same events, each with a tiny budget; no
    write is due by time unless ``persist_every`` says so."""
    app = el.App(url, claim_timeout=2)
    common: Any = {"persist_every": persist_every, "segments": 2, "batch_size": 100,
                   "state_cache_bytes": BUDGET}  # fmt: skip
    sums = app.aggregation("sums", key="k", initial=lambda: {"sum": 0, "n": 0}, **common)

    @sums.on("Measured")
    def add(state: dict, event: el.Event) -> None:
        state["sum"] += event.data["v"]
        state["n"] += 1

    fields = {"n": el.count(), "sum": el.sum("v")}
    app.aggregation("counted", key="k", on="Measured", fields=fields, **common)
    return app


def fill(store: el.EventStore, seed: int, events: int, keys: int, offset: int = 0) -> int:
    """``events`` events over ``keys`` keys, in batches of 50: every sixth batch is chained
    (a republisher's outputs, source offsets from ``offset`` up), and mixes in outputs of
    earlier batches appended again (duplicates, dropped). The next free offset."""
    rng = random.Random(seed)
    sent: list[tuple[dict, dict]] = []
    for i in range(events // 50):
        batch = []
        for j in range(50):
            data = {"k": f"k{rng.randrange(keys)}", "v": rng.randrange(100)}
            if i % 6 == 5:
                if sent and j % 5 == 0:  # appended again: an older offset of its key
                    batch.append(E("Measured", *rng.choice(sent)))
                    continue
                offset += 1
                meta = {"source_chain": [{"source": "raw", "partition": "", "offset": offset,
                                          "out": 0}]}  # fmt: skip
                sent.append((data, meta))
                batch.append(E("Measured", data, meta))
            else:
                batch.append(E("Measured", data))
        store.append(f"sensor-{i % 7}", batch)
    return offset


def plain_loop(store: el.EventStore) -> tuple[dict[str, dict[str, int]], int]:
    """The states by a plain loop over the store, and the inputs dropped: a chained input is
    folded when its source offset is above the last one folded for its key."""
    want: dict[str, dict[str, int]] = {}
    last: dict[str, int] = {}
    dropped = 0
    for event in store.iter_events():
        key = event.data["k"]
        chain = event.metadata.get("source_chain")
        if chain:
            offset = chain[0]["offset"]
            if offset <= last.get(key, -1):
                dropped += 1
                continue
            last[key] = offset
        state = want.setdefault(key, {"sum": 0, "n": 0})
        state["sum"] += event.data["v"]
        state["n"] += 1
    return want, dropped


def check_exact(app: el.App) -> None:
    want, dropped = plain_loop(app.store)
    for name in NAMES:
        agg = app.processors[name]
        assert {k: agg.get(k) for k in want} == want, name
        assert agg.dropped() == dropped, name
    assert dropped > 0


def caught_up(app: el.App, seen: Seen) -> None:
    app.start(observer=seen)
    try:
        app.wait_until_caught_up(120)
    finally:
        app.stop()


def cached(app: el.App) -> dict[str, tuple[int, int]]:
    """Per aggregation: the states held in memory, and the most any segment's took (bytes
    estimated), beside its share of the budget."""
    found = {}
    for runner in app.node.runners:
        ex: Any = runner.executor
        caches = list(ex.caches.values())  # the segments' threads change these: copied first
        share = ex.budget // max(1, len(caches))
        held = sum(len(e) for e in list(ex.entries.values()))
        found[runner.name] = (held, max((c.used - share for c in caches), default=0))
    return found


def within_budget(app: el.App) -> bool:
    """Every aggregation within its budget: at most about twice the states it has room for,
    and no segment above its share."""
    return all(
        states <= 2 * BUDGET // STATE_OVERHEAD and over <= 0
        for name, (states, over) in cached(app).items()
        if name in NAMES
    )


def test_a_tiny_budget_over_many_keys_folds_exactly(store_url: str) -> None:
    app = sums_app(store_url)
    fill(app.store, seed=1, events=3000, keys=1500)
    seen = Seen()
    app.start(observer=seen)
    try:
        wait_for(lambda: all(seen.handled.get(n, 0) >= 3000 for n in NAMES), timeout=120,
                 what="every event handled")  # fmt: skip
        # A batch is counted handled before its states are measured against the budget: the
        # last one's are dropped a moment later (a cache left above its share never is).
        wait_for(lambda: within_budget(app), timeout=10, what="the caches within the budget")
        held = cached(app)
        # persist_every is an hour away: every write so far was made by the budget
        assert all(seen.writes.get(n, 0) >= 5 for n in NAMES), seen.writes
    finally:
        app.stop()
    assert seen.failures == []
    for name in NAMES:
        states, over = held[name]
        assert states <= 2 * BUDGET // STATE_OVERHEAD, (name, states)  # of about 1,500 keys
        assert over <= 0, (name, over)  # no segment above its share
    check_exact(app)
    app.close()


def test_a_stop_mid_run_and_a_restart_keep_the_folds_exact(store_url: str) -> None:
    app = sums_app(store_url)  # written by the budget, and when stopped
    offset = fill(app.store, seed=2, events=2000, keys=800)
    seen = Seen()
    app.start(observer=seen)
    try:
        wait_for(lambda: all(seen.writes.get(n, 0) >= 3 for n in NAMES), timeout=120,
                 what="writes made by the budget")  # fmt: skip
    finally:
        app.stop()
    app.close()
    again = sums_app(store_url, persist_every=0.2)  # a new process would start the same
    fill(again.store, seed=3, events=1000, keys=800, offset=offset)
    caught_up(again, seen)
    assert seen.failures == []
    check_exact(again)
    again.close()


def serve(url: str) -> None:
    """A worker process: the aggregations, writing only when the budget says so, until
    killed."""
    app = sums_app(url)
    app.start()
    while True:
        time.sleep(1)


def test_a_worker_killed_mid_run_loses_no_fold_and_folds_none_twice(
    store_url: str, tmp_path: Path
) -> None:
    app = sums_app(store_url, persist_every=0.2)
    fill(app.store, seed=4, events=3000, keys=1200)
    code = f"from tests.test_state_cache import serve; serve({store_url!r})"
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                              stderr=log.open("w"))  # fmt: skip

    def written() -> bool:  # states and tokens the worker wrote early, before any timed write
        return (
            all(any(s.position > 0 for s in app.status(n).segments) for n in NAMES)
            or worker.poll() is not None
        )

    try:
        wait_for(written, timeout=120, what="the worker's first writes")
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    assert "retrying" not in log.read_text(), log.read_text()[-3000:]  # nothing failed
    seen = Seen()
    caught_up(app, seen)
    assert seen.failures == []
    check_exact(app)
    app.close()


def test_the_budget_is_a_whole_number_of_bytes(tmp_path: Path) -> None:
    app = el.App(f"sqlite:///{tmp_path / 'budget.db'}")
    plain = app.aggregation("plain", key="k", initial=dict)
    assert plain.state_cache_bytes == STATE_CACHE_BYTES == 64 * 2**20
    small = app.aggregation("small", key="k", initial=dict, state_cache_bytes=1)
    assert small.state_cache_bytes == 1
    for i, wrong in enumerate([0, -1, 1.5, True, "64MB", None, 2.0**30]):
        with pytest.raises(el.InvalidInputError) as caught:
            app.aggregation(f"a{i}", key="k", initial=dict, state_cache_bytes=wrong)
        assert str(caught.value) == (
            f"aggregation 'a{i}': state_cache_bytes must be a whole number of bytes >= 1, "
            f"got {wrong!r}"
        )
    with pytest.raises(el.InvalidInputError, match="state_cache_bytes bounds the states"):
        app.processor("p", state_cache_bytes=1000)
    with pytest.raises(el.InvalidInputError, match="state_cache_bytes bounds the states"):
        app.republisher("r", to_stream="out", state_cache_bytes=1000)
    app.close()
