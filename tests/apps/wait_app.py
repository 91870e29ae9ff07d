"""A test app for readers held back by an open transaction and for segment layouts: one
projection, ``orders``, that records the events it handles. For the CLI, ``app`` reads
EVENTLANES_TEST_WAIT_URL and EVENTLANES_TEST_WAIT_SEGMENTS (default 2)."""

from __future__ import annotations

import os

import eventlanes as el


def make_app(url: str, segments: int = 2, claim_timeout: float = 1.5) -> el.App:
    app = el.App(url, claim_timeout=claim_timeout)
    orders = app.processor("orders", segments=segments, batch_size=50)

    @orders.on_any
    def record(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"INSERT INTO {ctx.table('seen')} (position) VALUES ({ctx.param})",
                    (event.position,))  # fmt: skip

    return app


def create_schema(app: el.App) -> None:
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {app.db.table('seen')} (position BIGINT)"])


if "EVENTLANES_TEST_WAIT_URL" in os.environ:
    app = make_app(
        os.environ["EVENTLANES_TEST_WAIT_URL"],
        int(os.environ.get("EVENTLANES_TEST_WAIT_SEGMENTS", "2")),
    )
