"""A test app for the operations tools (metrics, status, dashboard), in subprocesses too.

``orders`` parks the events of stream ``bad`` as dead letters until the flag file exists;
``billing`` (retry mode) fails its segment on ``bad`` until then; ``audit`` is never run in the
tests (a lagging processor). ``handled`` rows are the orders' effects. For the CLI,
``app`` reads EVENTLANES_TEST_OPS_URL and EVENTLANES_TEST_OPS_FLAG (the flag file's path).
"""

from __future__ import annotations

import os

import eventlanes as el


def make_app(url: str, flag: str | None = None) -> el.App:
    app = el.App(url, claim_timeout=3)
    orders = app.processor("orders", segments=2, on_error="dead_letter", batch_size=100)
    billing = app.processor("billing")
    audit = app.processor("audit")

    def refused(event: el.Event) -> bool:
        return event.stream_id == "bad" and not (flag and os.path.exists(flag))

    @orders.on_any
    def handle(event: el.Event, ctx: el.Context) -> None:
        if refused(event):
            raise RuntimeError(f"payment service refused {event.stream_id} v{event.version}")
        p = ctx.param
        ctx.execute(
            f"INSERT INTO {ctx.table('handled')} (position, stream_id) VALUES ({p}, {p})",
            (event.position, event.stream_id),
        )

    @billing.on_any
    def bill(event: el.Event, ctx: el.Context) -> None:
        if refused(event):
            raise RuntimeError(f"billing refused {event.stream_id} v{event.version}")

    @audit.on_any
    def noted(event: el.Event, ctx: el.Context) -> None:
        pass

    return app


def create_schema(app: el.App) -> str:
    table = app.db.table("handled")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (position BIGINT, stream_id TEXT)"])
    return table


app = make_app(
    os.environ.get("EVENTLANES_TEST_OPS_URL", "sqlite:////nonexistent/ops.db"),  # fails on use
    os.environ.get("EVENTLANES_TEST_OPS_FLAG"),
)


def fill(store: el.EventStore, good: int = 60, streams: int = 6, bad: int = 2) -> int:
    """``good`` events over ``streams`` streams and ``bad`` events of stream ``bad``."""
    for i in range(good):
        store.append(f"s-{i % streams}", [el.NewEvent("Ordered", {"n": i})])
    if bad:
        store.append("bad", [el.NewEvent("Ordered", {"n": -1})] * bad)
    return good + bad
