"""An app the way a team writes one (used by the example of testing one's own processors):
a function that defines its processors on an App for a store URL, and the schema they write.

``order-lines``: one row per order line (a projection through ``ctx``, cleared on reset);
``order-totals``: a declarative aggregation; ``receipts``: mails a receipt once per order
placed (``disallow_replay``), through a table standing in for the mail service.
"""

from __future__ import annotations

import eventlanes as el


def build(url: str) -> el.App:
    app = el.App(url)
    db = app.db
    db.run_ddl(
        [
            f"CREATE TABLE IF NOT EXISTS {db.table('order_lines')} (order_id TEXT, sku TEXT, "
            "qty BIGINT, PRIMARY KEY (order_id, sku))",
            f"CREATE TABLE IF NOT EXISTS {db.table('receipts')} (order_id TEXT)",
        ]
    )
    lines = app.processor("order-lines", segments=2)

    @lines.on("LineAdded")
    def add_line(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(
            f"INSERT INTO {ctx.table('order_lines')} (order_id, sku, qty) VALUES ({p}, {p}, {p}) "
            "ON CONFLICT (order_id, sku) DO UPDATE SET qty = excluded.qty",
            (event.stream_id, event.data["sku"], event.data["qty"]),
        )

    @lines.on("LineRemoved")
    def remove_line(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(
            f"DELETE FROM {ctx.table('order_lines')} WHERE order_id = {p} AND sku = {p}",
            (event.stream_id, event.data["sku"]),
        )

    @lines.on_reset
    def clear(ctx: el.Context) -> None:
        ctx.execute(f"DELETE FROM {ctx.table('order_lines')}")

    app.aggregation(
        "order-totals",
        key="sku",
        on="LineAdded",
        fields={"lines": el.count(), "qty": el.sum("qty")},
    )
    receipts = app.processor("receipts")

    @receipts.on("Placed")
    @el.disallow_replay
    def send_receipt(event: el.Event, ctx: el.Context) -> None:
        if "email" not in event.data:
            raise ValueError(f"order {event.stream_id} has no e-mail address")
        ctx.execute(
            f"INSERT INTO {ctx.table('receipts')} (order_id) VALUES ({ctx.param})",
            (event.stream_id,),
        )

    return app
