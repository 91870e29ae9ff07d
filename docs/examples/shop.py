"""The shop of the getting-started guide: orders projected into a table, revenue per customer.

Every eventlanes command (``eventlanes run shop:app``, ``status``, ``dead-letters``...) and every
worker process imports this module, so importing it only defines things: no connection, no
table created, no event appended. The set-up of an environment is a step of its own (below).
"""

from __future__ import annotations

import os

import eventlanes as el

# One store for every command and worker, named by the environment: a SQLite file in the
# working directory by default; in production e.g. SHOP_URL=postgresql://shop@db/shop.
app = el.App(os.environ.get("SHOP_URL", "sqlite:///shop.db"))

# A projection: rows written in the same transaction as the processor's progress (its token),
# so each event's effect is stored exactly once, whatever crashes.
orders = app.processor("orders", segments=4, tables=["orders"])


@orders.on("OrderPlaced")
def place(event: el.Event, ctx: el.Context) -> None:
    ctx.execute(
        f"INSERT INTO {ctx.table('orders')} (id, customer, total) VALUES (?, ?, ?)",
        (event.stream_id, event.data["customer"], event.data["total"]),
    )


@orders.on("OrderCancelled")
def cancel(event: el.Event, ctx: el.Context) -> None:
    ctx.execute(f"DELETE FROM {ctx.table('orders')} WHERE id = ?", (event.stream_id,))


@orders.on_reset
def clear(ctx: el.Context) -> None:
    ctx.execute(f"DELETE FROM {ctx.table('orders')}")  # a replay rebuilds the table


# An aggregation: per customer, counted and summed without Python code per event.
revenue = app.aggregation(
    "revenue",
    key="customer",
    on="OrderPlaced",
    fields={"orders": el.count(), "total": el.sum("total")},
)


def setup() -> None:
    """Create eventlanes' tables and the app's own, once per environment (``python shop.py``
    at deploy): never at import, where every command and worker would run it."""
    for migrated in app.migrate():  # what `eventlanes migrate URL` does
        print(migrated.summary())
    app.db.run_ddl(
        [
            f"CREATE TABLE IF NOT EXISTS {app.db.table('orders')} "
            "(id TEXT PRIMARY KEY, customer TEXT NOT NULL, total BIGINT NOT NULL)"
        ]
    )


if __name__ == "__main__":
    setup()
