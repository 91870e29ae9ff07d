"""A test app for the operations tools (metrics, status, dashboard), in subprocesses too.

EVENTLANES_TEST_OPS_URL: the store. ``orders`` parks the events of stream ``bad`` as dead
letters until the file EVENTLANES_TEST_OPS_FLAG exists; ``audit`` is defined but never run in
the tests (a lagging processor). ``handled`` rows are the orders' effects.
"""

from __future__ import annotations

import os

import eventlanes as el

env = os.environ.get
app = el.App(env("EVENTLANES_TEST_OPS_URL", "sqlite:///unset.db"), claim_timeout=3)
orders = app.processor("orders", segments=2, on_error="dead_letter", batch_size=100)
audit = app.processor("audit")


def create_schema(app: el.App) -> str:
    table = app.db.table("handled")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (position BIGINT, stream_id TEXT)"])
    return table


@orders.on_any
def handle(event: el.Event, ctx: el.Context) -> None:
    flag = env("EVENTLANES_TEST_OPS_FLAG")
    if event.stream_id == "bad" and not (flag and os.path.exists(flag)):
        raise RuntimeError(f"payment service refused {event.stream_id} v{event.version}")
    p = ctx.param
    ctx.execute(
        f"INSERT INTO {ctx.table('handled')} (position, stream_id) VALUES ({p}, {p})",
        (event.position, event.stream_id),
    )


@audit.on_any
def noted(event: el.Event, ctx: el.Context) -> None:
    pass
