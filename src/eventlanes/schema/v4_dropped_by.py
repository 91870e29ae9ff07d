"""Schema version 4: ``dropped_by`` on ``{prefix}aggregates``, the inputs of each state dropped
as duplicates, by root source (JSON: source -> count; NULL while none was dropped).

``dropped`` stays the total. Drops counted before this version have no source: for them
``dropped`` is more than the sum of ``dropped_by``.
"""

from __future__ import annotations

from typing import Any

from ..db import Database


def apply(db: Database, conn: Any) -> None:
    conn.execute(f"ALTER TABLE {db.table('aggregates')} ADD COLUMN dropped_by TEXT")
