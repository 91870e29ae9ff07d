"""The demo's app: users built from parts, projected into a `parts` table exactly once.

Run it yourself with `eventlanes run examples.shop:app --processes 2` and inspect it with
`eventlanes status examples.shop:app` (EVENTLANES_DEMO_URL picks the store).
"""

from __future__ import annotations

import os

import eventlanes as el

app = el.App(os.environ.get("EVENTLANES_DEMO_URL", "sqlite:///demo-data/demo.db"), claim_timeout=3)
users = app.processor("user-state", segments=4, batch_size=1000)


def create_schema(app: el.App) -> str:
    table = app.db.table("parts")
    app.db.run_ddl(
        [f"CREATE TABLE IF NOT EXISTS {table} (usr TEXT, part TEXT, position BIGINT PRIMARY KEY)"]
    )
    return table


@users.on("PartAdded")
def add_part(event: el.Event, ctx: el.Context) -> None:
    # Same transaction as the token: a crash before commit leaves neither behind.
    p = ctx.param
    ctx.execute(
        f"INSERT INTO {ctx.table('parts')} (usr, part, position) VALUES ({p}, {p}, {p})",
        (event.stream_id, event.data["part"], event.position),
    )


@users.on_reset
def clear(ctx: el.Context) -> None:
    ctx.execute(f"DELETE FROM {ctx.table('parts')}")
