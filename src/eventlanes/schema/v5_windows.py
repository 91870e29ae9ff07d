"""Schema version 5: the tables of windowed aggregations (``window=``).

* ``{prefix}window_states``: one row per window of a key, ``[start_us, end_us)`` in
  microseconds; ``value`` (JSON), ``closed_at`` (the position whose clock closed it; NULL while
  open), ``revision`` (raised by each late event folded into it after it closed),
  ``routing_hash`` (the key's, so a segment loads its own open windows by a range test).
* ``{prefix}window_late``: the late events of ``late="park"`` (and those folded as revisions
  by ``late="amend"``), one row per (aggregation, position): the key, the event time, the
  windows it was late for (JSON) and whether it was folded in.
* ``{prefix}window_clocks``: per segment, the store clock at its token (the largest event
  time read up to ``position``, NULL before any), its counts (folded, late, clamped) and the
  window definition it ran with (a changed definition needs a new version). Written in the
  transaction of the segment's token; any row at or below a position is a valid start for
  the clock there, since the clock is a function of the log alone.
"""

from __future__ import annotations

from typing import Any

from ..db import Database


def apply(db: Database, conn: Any) -> None:
    states, late, clocks = (db.table(t) for t in ("window_states", "window_late", "window_clocks"))
    for statement in (
        f"""CREATE TABLE IF NOT EXISTS {states} (
            aggregation TEXT NOT NULL,
            key TEXT NOT NULL,
            start_us BIGINT NOT NULL,
            end_us BIGINT NOT NULL,
            routing_hash BIGINT NOT NULL,
            value TEXT NOT NULL,
            closed_at BIGINT,
            revision INTEGER NOT NULL DEFAULT 0,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (aggregation, key, start_us))""",
        f"CREATE INDEX IF NOT EXISTS {db.table('window_states_end')} ON {states} "
        "(aggregation, end_us)",
        f"""CREATE TABLE IF NOT EXISTS {late} (
            aggregation TEXT NOT NULL,
            position BIGINT NOT NULL,
            key TEXT NOT NULL,
            t_us BIGINT NOT NULL,
            windows TEXT NOT NULL,
            amended INTEGER NOT NULL DEFAULT 0,
            recorded_at BIGINT NOT NULL,
            PRIMARY KEY (aggregation, position))""",
        f"""CREATE TABLE IF NOT EXISTS {clocks} (
            aggregation TEXT NOT NULL,
            segment_id BIGINT NOT NULL,
            position BIGINT NOT NULL,
            latest BIGINT,
            definition TEXT NOT NULL,
            folded BIGINT NOT NULL DEFAULT 0,
            late BIGINT NOT NULL DEFAULT 0,
            clamped BIGINT NOT NULL DEFAULT 0,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (aggregation, segment_id))""",
    ):
        conn.execute(statement)
