"""The autoscaling test's app: one projection whose handler takes a few milliseconds an event,
so one worker process has a known capacity and four have four times it.

``orders`` (4 segments, one handler thread per process: a worker handles one segment's batch
at a time) records every event it handles, once, in handling order (the ``id`` column), in
the token's transaction; the work (a sleep per event) comes before the transaction opens.
For `eventlanes run tests.apps.scaling_app:app`: EVENTLANES_TEST_SCALE_URL,
_DELAY (seconds per event, default 0.004), _CLAIM_TIMEOUT (default 10).
"""

from __future__ import annotations

import os
import time

import eventlanes as el
from tests.processing_helpers import serial_pk

env = os.environ.get
DELAY = float(env("EVENTLANES_TEST_SCALE_DELAY", "0.004"))

app = el.App(
    env("EVENTLANES_TEST_SCALE_URL", "sqlite:////nonexistent/scale.db"),  # fails on use
    claim_timeout=float(env("EVENTLANES_TEST_SCALE_CLAIM_TIMEOUT", "10")),
)
orders = app.processor("orders", segments=4, workers=1, batch_size=50)


@orders.on_batch("Placed")
def record(events: list[el.Event], ctx: el.Context) -> None:
    time.sleep(DELAY * len(events))  # the work, before the transaction opens (SQLite's lock)
    ctx.executemany(
        f"INSERT INTO {ctx.table('handled')} (stream_id, version, position, node) "
        "VALUES (?, ?, ?, ?)",
        [(e.stream_id, e.version, e.position, os.getpid()) for e in events],
    )


def create_schema(target: el.App) -> str:
    table = target.db.table("handled")
    target.db.run_ddl([
        f"""CREATE TABLE IF NOT EXISTS {table} (id {serial_pk(target.db)},
            stream_id TEXT NOT NULL, version BIGINT NOT NULL, position BIGINT NOT NULL,
            node BIGINT NOT NULL)"""
    ])  # fmt: skip
    return table
