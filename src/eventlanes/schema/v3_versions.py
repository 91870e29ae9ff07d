"""Schema version 3: ``{prefix}versions``, the versions of processors (``version=N``).

One row per version that was started (``started_at``: when its first node created its token
rows), promoted (``promoted_at``: readers were switched to it; the last one promoted serves)
or retired (``retired_at``). A processor of an app that never declares versions has no row.
Nothing else changes: the tables of version 1 are the tables every processor always had.
"""

from __future__ import annotations

from typing import Any

from ..db import Database


def apply(db: Database, conn: Any) -> None:
    conn.execute(
        f"""CREATE TABLE IF NOT EXISTS {db.table("versions")} (
            processor TEXT NOT NULL PRIMARY KEY,
            base TEXT NOT NULL,
            version INTEGER NOT NULL,
            started_at BIGINT,
            promoted_at BIGINT,
            retired_at BIGINT)"""
    )
