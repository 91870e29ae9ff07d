"""The processor contract: one scenario through every executor, the same rows from each.

The scenario has every handler kind: a per-event handler and an ``on_batch`` handler writing
in the token's transaction, an ``on_reset`` handler, a ``disallow_replay`` side effect, and a
poison event that fails until it is fixed. Each executor (the pooled and tracking runners,
dead-letter retry, a reset and replay, the Spark replay, and the at-least-once lanes where the
scenario applies) must leave exactly the rows a plain Python loop over the events expects.

A backend gets the suite by subclassing and providing a ``contract_url`` fixture::

    class TestMyBackendProcessors(ProcessorContract):
        @pytest.fixture
        def contract_url(self, tmp_path):
            return f"mybackend://{tmp_path}/events"

The Spark case uses a session-scoped ``spark`` fixture when the project defines one.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

import eventlanes as el

STREAMS = 3
STEPS = 6
POISON = ("s-1", 3)  # this stream's third event fails until it is fixed


def _append_scenario(store: el.EventStore) -> None:
    # Interleaved streams, so one batch holds several keys and every segment gets work.
    for version in range(1, STEPS + 1):
        for s in range(STREAMS):
            stream = f"s-{s}"
            data = {"n": version, "poison": (stream, version) == POISON}
            store.append(stream, [el.NewEvent("Step", data)])
    store.append("other", [el.NewEvent("Ignored", {})])  # no handler: the token passes it


class Scenario:
    """The app, its processor and the tables it writes (``rows`` and ``effects``)."""

    def __init__(self, url: str, **options: Any) -> None:
        self.app = el.App(url, claim_timeout=3)
        # Handlers close over small values only (never the app): a Spark replay pickles them.
        state = self.state = {"fixed": False}
        seen: dict[int, tuple[str, int]] = {}  # at-least-once sink, idempotent by position
        self.lanes_seen = seen
        app = self.app
        db = app.db
        self.rows = db.table("contract_rows")
        self.effects = db.table("contract_effects")
        serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
        pk = serial if db.backend == "sqlite" else "BIGSERIAL PRIMARY KEY"

        def maybe_fail(event: el.Event) -> None:
            if event.data.get("poison") and not state["fixed"]:
                raise RuntimeError(f"poison at {event.stream_id} v{event.version}")

        with db.transaction() as conn:
            for table in (self.rows, self.effects):
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table} (id {pk}, kind TEXT NOT NULL, "
                    "stream TEXT NOT NULL, version BIGINT NOT NULL)"
                )
        self.proc = proc = app.processor("contract", segments=2, batch_size=7, **options)
        rows, effects, p = self.rows, self.effects, db.param

        if proc.guarantee is el.Guarantee.AT_LEAST_ONCE:

            @proc.on("Step")
            def record(event: el.Event, ctx: el.Context) -> None:
                maybe_fail(event)
                seen[event.position] = (event.stream_id, event.version)

            return

        @proc.on("Step")
        def per_event(event: el.Event, ctx: el.Context) -> None:
            maybe_fail(event)
            ctx.execute(
                f"INSERT INTO {rows} (kind, stream, version) VALUES ({p}, {p}, {p})",
                ("event", event.stream_id, event.version),
            )

        @proc.on_batch("Step")
        def per_batch(events: list[el.Event], ctx: el.Context) -> None:
            ctx.executemany(
                f"INSERT INTO {rows} (kind, stream, version) VALUES ({p}, {p}, {p})",
                [("batch", e.stream_id, e.version) for e in events],
            )

        @proc.on("Step")
        @el.disallow_replay
        def side_effect(event: el.Event, ctx: el.Context) -> None:
            ctx.execute(
                f"INSERT INTO {effects} (kind, stream, version) VALUES ({p}, {p}, {p})",
                ("effect", event.stream_id, event.version),
            )

        @proc.on_reset
        def clear(ctx: el.Context) -> None:
            ctx.execute(f"DELETE FROM {rows}")

    def fix(self) -> None:
        self.state["fixed"] = True

    # -- what the plain loop expects ---------------------------------------------------------
    def expected(self) -> list[tuple[str, int]]:
        return sorted(
            (e.stream_id, e.version) for e in self.app.store.iter_events() if e.type == "Step"
        )

    def written(self, table: str, kind: str) -> list[tuple[str, int]]:
        rows = self.app.db.query(
            self.app.db.sql(f"SELECT stream, version FROM {table} WHERE kind = ? ORDER BY id"),
            (kind,),
        )
        return [(r[0], int(r[1])) for r in rows]

    def assert_rows(self, *, parked: frozenset[tuple[str, int]] = frozenset()) -> None:
        """Every handled event once per handler kind, each stream in version order; the
        side effect once per event, never again on replays."""
        expected = [k for k in self.expected() if k not in parked]
        for kind in ("event", "batch"):
            got = self.written(self.rows, kind)
            doubled = [k for k, c in Counter(got).items() if c > 1]
            assert not doubled, f"{kind} handler ran twice for {doubled[:5]}"
            assert sorted(got) == expected, f"{kind} rows differ from the events"
            _assert_in_order(got)
        effects = self.written(self.effects, "effect")
        assert sorted(effects) == expected, "side effects differ from the events (once each)"

    def run_until_caught_up(self, timeout: float = 60.0, **start: Any) -> None:
        self.app.start(**start)
        try:
            deadline = time.monotonic() + timeout
            while not self.app.status("contract").caught_up:
                assert time.monotonic() < deadline, f"not caught up: {self.app.status('contract')}"
                time.sleep(0.05)
        finally:
            self.app.stop()


def _assert_in_order(rows: list[tuple[str, int]]) -> None:
    last: dict[str, int] = {}
    for stream, version in rows:
        assert version > last.get(stream, 0), f"{stream} v{version} after v{last[stream]}"
        last[stream] = version


def _parked_keys() -> frozenset[tuple[str, int]]:
    stream, first = POISON
    return frozenset((stream, v) for v in range(first, STEPS + 1))


class ProcessorContract:
    """Subclasses provide the ``contract_url`` fixture: a URL of a fresh, empty store."""

    @pytest.fixture
    def contract_url(self) -> str:  # pragma: no cover - subclasses override
        raise NotImplementedError("subclass ProcessorContract and define contract_url")

    @pytest.mark.parametrize("mode", ["pooled", "tracking"])
    def test_runners_park_retry_and_replay(self, contract_url: str, mode: str) -> None:
        sc = Scenario(contract_url, mode=mode, on_error="dead_letter")
        try:
            _append_scenario(sc.app.store)
            sc.run_until_caught_up()
            # The poison and the later events of its key are parked; everything else handled.
            letters = sc.app.dead_letter_list("contract")
            assert {(d.stream_id, d.version) for d in letters} == _parked_keys()
            sc.assert_rows(parked=_parked_keys())
            # Dead-letter retry runs per-event and on_batch handlers, in order per key.
            sc.fix()
            handled, left = sc.app.retry_dead_letters("contract")
            assert (handled, left) == (len(_parked_keys()), 0)
            sc.assert_rows()
            # A reset replays: rows rebuilt (reset handler cleared them), side effects not rerun.
            sc.app.reset("contract")
            sc.run_until_caught_up()
            sc.assert_rows()
        finally:
            sc.app.close()

    def test_at_least_once_lanes(self, contract_url: str) -> None:
        sc = Scenario(contract_url, guarantee="at-least-once", lanes=3, handler_timeout=5)
        try:
            _append_scenario(sc.app.store)
            sc.fix()
            sc.run_until_caught_up()
            assert sorted(sc.lanes_seen.values()) == sc.expected()
        finally:
            sc.app.close()

    # With pytest-xdist (--dist loadgroup) it runs in the worker of the session's Spark JVM
    # (a `spark` fixture's group), not beside it in a JVM of its own.
    @pytest.mark.xdist_group("spark")
    def test_spark_replay(self, contract_url: str, request: pytest.FixtureRequest) -> None:
        pytest.importorskip("pyspark")
        spark = request.getfixturevalue("spark")
        from ...spark import replay

        sc = Scenario(contract_url, on_error="dead_letter")
        try:
            _append_scenario(sc.app.store)
            sc.fix()
            sc.run_until_caught_up()
            sc.assert_rows()
            result = replay(sc.app, "contract", spark=spark)
            assert result.end == sc.app.store.head()
            sc.assert_rows()  # rebuilt by the replay, side effects not rerun
            assert all(s.position == result.end for s in sc.app.status("contract").segments)
        finally:
            sc.app.close()
