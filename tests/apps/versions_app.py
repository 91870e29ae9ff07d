"""A test app with two versions of a projection and of an aggregation (blue/green), for worker
processes: ``eventlanes run tests.apps.versions_app:app``. Configured by environment variables:
EVENTLANES_TEST_VERSIONS_URL (required) and EVENTLANES_TEST_V2_DELAY (seconds version 2's
projection waits per event: a warm-up long enough to act during it).

``mails`` is the side effect: one row per (version, event) that a ``disallow_replay`` handler
ran for. Version 1's rows also say whether version 2 had started when the row was written
(``after_v2``, read in the same transaction; on PostgreSQL under a shared lock on the key that
starting version 2 takes, so the two are serialised as SQLite serialises every writer): the
test's oracle of what version 1 had handled when version 2 started.
"""

from __future__ import annotations

import os
import time
import zlib

import eventlanes as el
from tests.processing_helpers import serial_pk


def make_app(url: str, v2_delay: float = 0.0) -> el.App:
    app = el.App(url, claim_timeout=2)
    orders = app.processor("orders", segments=2, tables=["orders"], batch_size=50)
    # One event per batch: version 2's wait comes before its transaction opens, so it never
    # holds SQLite's write lock while it waits (appends go on during the warm-up).
    orders2 = app.processor("orders", version=2, segments=3, tables=["orders"], batch_size=1)
    app.aggregation("totals", key="customer", on="Placed", fields={"n": el.count()})
    app.aggregation(
        "totals", version=2, key="customer", on="Placed",
        fields={"n": el.count(), "amount": el.sum("amount")}, persist_every=0.2,
    )  # fmt: skip

    def shared(name: str) -> str:  # a table of no version (named when handlers run: no
        return app.db.table(name)  # connection while the module is imported)

    @orders.on("Placed")
    def project(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(
            f"INSERT INTO {ctx.table('orders')} (position, customer) VALUES (?, ?)",
            (event.position, event.data["customer"]),
        )

    @orders.on("Placed")
    @el.disallow_replay
    def mail(event: el.Event, ctx: el.Context) -> None:
        if ctx.backend == "postgresql":
            key = zlib.crc32(b"init:orders@v2") - 2**31
            ctx.execute("SELECT pg_advisory_xact_lock_shared(?, ?)",
                        (app.db.lock_namespace, key))  # type: ignore[attr-defined]  # fmt: skip
        ctx.execute(
            f"INSERT INTO {shared('mails')} (version, position, after_v2) VALUES (1, ?, "
            f"(SELECT count(*) FROM {shared('tokens')} WHERE processor = 'orders@v2'))",
            (event.position,),
        )

    @orders2.on("Placed")
    def project_v2(event: el.Event, ctx: el.Context) -> None:
        time.sleep(v2_delay)
        ctx.execute(
            f"INSERT INTO {ctx.table('orders')} (position, customer, amount) VALUES (?, ?, ?)",
            (event.position, event.data["customer"], event.data["amount"]),
        )

    @orders2.on("Placed")
    @el.disallow_replay
    def mail_v2(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(
            f"INSERT INTO {shared('mails')} (version, position, after_v2) VALUES (2, ?, 1)",
            (event.position,),
        )

    return app


def create_schema(app: el.App) -> None:
    v1, v2 = app.get("orders"), app.get("orders@v2")
    app.db.run_ddl([
        f"""CREATE TABLE IF NOT EXISTS {app.db.table('mails')} (id {serial_pk(app.db)},
            version INTEGER NOT NULL, position BIGINT NOT NULL, after_v2 INTEGER NOT NULL)""",
        f"CREATE TABLE IF NOT EXISTS {v1.table('orders')} (position BIGINT, customer TEXT)",
        f"""CREATE TABLE IF NOT EXISTS {v2.table('orders')} (position BIGINT, customer TEXT,
            amount BIGINT)""",
    ])  # fmt: skip


app = make_app(
    os.environ.get("EVENTLANES_TEST_VERSIONS_URL", "sqlite:////nonexistent/versions.db"),
    float(os.environ.get("EVENTLANES_TEST_V2_DELAY", "0")),
)
