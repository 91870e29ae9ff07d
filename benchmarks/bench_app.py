"""The app the processor benchmark runs (also in worker processes, configured by env vars).

EVENTLANES_BENCH_URL: the store; EVENTLANES_BENCH_HANDLER: "row" (one counter increment per
event), "batch" (one increment by the batch's size) or "cpu" (about 50 us of Python work per
event, then one increment per batch: a CPU-bound handler, for process scaling). Counters are kept
per segment, so segments committing in parallel do not queue on one row.
"""

from __future__ import annotations

import os
from functools import cache

import eventlanes as el

app = el.App(os.environ.get("EVENTLANES_BENCH_URL", "sqlite:///bench.db"), claim_timeout=5)
counter = app.processor("counter", segments=4, batch_size=2000)
HANDLER = os.environ.get("EVENTLANES_BENCH_HANDLER", "batch")


def create_schema(app: el.App) -> str:
    table = app.db.table("counts")
    app.db.run_ddl(
        [f"CREATE TABLE IF NOT EXISTS {table} (stream_id TEXT PRIMARY KEY, n BIGINT NOT NULL)"]
    )
    return table


@cache
def _upsert_sql(table: str, p: str) -> str:
    return (
        f"INSERT INTO {table} (stream_id, n) VALUES ({p}, {p}) "
        f"ON CONFLICT (stream_id) DO UPDATE SET n = {table}.n + excluded.n"
    )


if HANDLER == "row":

    @counter.on_any
    def count_one(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(_upsert_sql(ctx.table("counts"), ctx.param), (str(ctx.segment), 1))

else:
    if HANDLER == "cpu":

        @counter.on_any
        def burn(event: el.Event, ctx: el.Context) -> None:
            sum(i * i for i in range(400))  # stands in for real per-event work

    @counter.on_batch()
    def count_many(events: list[el.Event], ctx: el.Context) -> None:
        ctx.execute(_upsert_sql(ctx.table("counts"), ctx.param), (str(ctx.segment), len(events)))
