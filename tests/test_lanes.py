"""Parallel lanes within a segment: async handlers, in-order acks, at-least-once."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

import eventlanes as el
from tests.processing_helpers import append_load, wait_for

E = el.NewEvent


def lanes_app(url: str, **options):  # type: ignore[no-untyped-def]
    app = el.App(url, claim_timeout=2)
    proc = app.processor(
        "lanes", guarantee="at-least-once", segments=1, lanes=4, batch_size=200, **options
    )
    return app, proc


def test_lanes_run_keys_concurrently_and_in_order(store_url: str) -> None:
    app, proc = lanes_app(store_url)
    seen: dict[str, list[int]] = defaultdict(list)
    running = {"now": 0, "max": 0}

    @proc.on_any
    async def slow_io(event: el.Event, ctx: el.Context) -> None:
        running["now"] += 1
        running["max"] = max(running["max"], running["now"])
        await asyncio.sleep(0.002)
        seen[event.stream_id].append(event.version)
        running["now"] -= 1

    append_load(app.store, streams=30, events=600)
    app.start()
    try:
        app.wait_until_caught_up(60)
    finally:
        app.stop()
    assert running["max"] > 1  # lanes really overlapped
    assert sum(len(v) for v in seen.values()) == 600  # none lost (no failure: none repeated)
    for stream, versions in seen.items():
        assert versions == sorted(versions), f"{stream} out of order"


def test_a_failure_commits_the_prefix_and_retries_at_least_once(store_url: str) -> None:
    app, proc = lanes_app(store_url)
    handled: list[int] = []
    broken = {"yes": True}

    @proc.on_any
    async def io(event: el.Event, ctx: el.Context) -> None:
        if event.stream_id == "bad" and broken["yes"]:
            raise ConnectionError("remote system down")
        handled.append(event.position)

    for i in range(20):
        app.store.append(f"s{i % 5}", [E("A")])
    [bad] = app.store.append("bad", [E("A")])
    for i in range(20):
        app.store.append(f"s{i % 5}", [E("B")])
    app.start()
    try:
        failing = wait_for(lambda: (s := app.status("lanes").segments[0]).last_error and s)
        assert "remote system down" in failing.last_error
        assert failing.position == bad - 1  # the contiguous prefix before the failure
        broken["yes"] = False
        app.wait_until_caught_up(30)
    finally:
        app.stop()
    assert set(handled) == set(range(1, 42))  # every event at least once
    assert handled.count(bad) == 1


def test_a_hung_handler_times_out_instead_of_stalling(store_url: str) -> None:
    app, proc = lanes_app(store_url, handler_timeout=0.2)
    hang = {"yes": True}

    @proc.on_any
    async def maybe_hang(event: el.Event, ctx: el.Context) -> None:
        if hang["yes"] and event.stream_id == "stuck":
            await asyncio.sleep(3600)

    app.store.append("ok", [E("A")])
    app.store.append("stuck", [E("A")])
    app.start()
    try:
        failing = wait_for(lambda: (s := app.status("lanes").segments[0]).last_error and s)
        assert "did not finish within 0.2 s" in failing.last_error and failing.position == 1
        hang["yes"] = False
        app.wait_until_caught_up(30)
    finally:
        app.stop()


def test_lanes_need_retry_mode_and_refuse_transactions(store_url: str) -> None:
    app = el.App(store_url)
    with pytest.raises(el.InvalidInputError, match="declare guarantee='at-least-once'"):
        app.processor("w", lanes=2)
    with pytest.raises(el.InvalidInputError, match="needs guarantee='exactly-once'"):
        app.processor("x", guarantee="at-least-once", lanes=2, on_error="dead_letter")
    with pytest.raises(el.InvalidInputError, match="lanes must be >= 1"):
        app.processor("y", lanes=0)
    with pytest.raises(el.InvalidInputError, match="guarantee must be one of"):
        app.processor("z", guarantee="exactly_once")
    lanes = app.processor("v", guarantee="at-least-once", lanes=2)
    with pytest.raises(el.InvalidInputError, match="on_batch handlers run in the token's"):
        lanes.on_batch()(lambda events, ctx: None)
    app2, proc = lanes_app(store_url)
    errors: list[str] = []

    @proc.on_any
    async def uses_sql(event: el.Event, ctx: el.Context) -> None:
        try:
            ctx.execute("SELECT 1")
        except RuntimeError as exc:
            errors.append(str(exc))

    app2.store.append("a", [E("A")])
    app2.start()
    try:
        app2.wait_until_caught_up(30)
    finally:
        app2.stop()
    assert errors and "outside the token's transaction" in errors[0]
