"""Schema version 6: ``replay`` on ``{prefix}dead_letters``, whether the event was a replay
(after a reset) when it was parked, so that a retry runs it as one: ``disallow_replay``
handlers skip it, as they would have. Letters parked before this version read 0 (a first
delivery), as every retry treated them.
"""

from __future__ import annotations

from typing import Any

from ..db import Database


def apply(db: Database, conn: Any) -> None:
    conn.execute(
        f"ALTER TABLE {db.table('dead_letters')} ADD COLUMN replay INTEGER NOT NULL DEFAULT 0"
    )
