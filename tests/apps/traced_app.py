"""A test app for tracing across processes: ``eventlanes run tests.apps.traced_app:app`` with
the OTEL_* environment variables exporting its spans (tests/test_tracing.py).

EVENTLANES_TEST_APP_URL: the store. ``lines``: a projection (exactly-once, a row per event);
``mailer``: at-least-once lanes, an async handler standing in for a call to another system.
"""

from __future__ import annotations

import asyncio
import os

import eventlanes as el

app = el.App(os.environ.get("EVENTLANES_TEST_APP_URL", "sqlite:///unset.db"), claim_timeout=2)
lines = app.processor("lines", segments=2)
mailer = app.processor("mailer", guarantee="at-least-once", lanes=2)


def create_schema(app: el.App) -> str:
    table = app.db.table("lines")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (stream_id TEXT, version BIGINT)"])
    return table


@lines.on("LineAdded")
def add_line(event: el.Event, ctx: el.Context) -> None:
    p = ctx.param
    ctx.execute(
        f"INSERT INTO {ctx.table('lines')} (stream_id, version) VALUES ({p}, {p})",
        (event.stream_id, event.version),
    )


@mailer.on("LineAdded")
async def mail(event: el.Event, ctx: el.Context) -> None:
    await asyncio.sleep(0)
