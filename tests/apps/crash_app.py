"""A test app whose handler stops its runner: on an event with ``{"crash": true}`` it raises
what EVENTLANES_TEST_CRASH names (``KeyboardInterrupt``, ``SystemExit``), after writing a row
(which must roll back). ``app`` reads its store URL from EVENTLANES_TEST_CRASH_URL."""

from __future__ import annotations

import os

import eventlanes as el


def make_app(url: str, raises: str = "KeyboardInterrupt") -> el.App:
    app = el.App(url, claim_timeout=3)
    orders = app.processor("orders", segments=2)

    @orders.on("Order")
    def handle(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"INSERT INTO {ctx.table('handled')} VALUES (?)", (event.position,))
        if event.data.get("crash"):
            if raises == "SystemExit":
                raise SystemExit(0)  # sys.exit() in a handler: the "success" code
            raise KeyboardInterrupt("the handler gave up")

    return app


def create_schema(app: el.App) -> str:
    table = app.db.table("handled")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (position BIGINT)"])
    return table


app = make_app(
    os.environ.get("EVENTLANES_TEST_CRASH_URL", "sqlite:///unset-crash-app.db"),
    os.environ.get("EVENTLANES_TEST_CRASH", "KeyboardInterrupt"),
)
