"""The ordered list of schema migrations, and the objects of the schema they leave.

To change the schema in a release: add a module ``vN_what.py`` with ``apply(db, conn)`` (run
inside one transaction with the others of the same ``migrate``, under the schema lock), append
it here with the next version, and update ``PARTS`` if objects come or go. Released
migrations never change: stores out there recorded them as applied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..db import Database
from . import (
    v1_initial,
    v2_kafka,
    v3_versions,
    v4_dropped_by,
    v5_windows,
    v6_dead_letter_replays,
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[Database, Any], None]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial", v1_initial.apply),
    Migration(2, "kafka", v2_kafka.apply),
    Migration(3, "versions", v3_versions.apply),
    Migration(4, "dropped_by", v4_dropped_by.apply),
    Migration(5, "windows", v5_windows.apply),
    Migration(6, "dead_letter_replays", v6_dead_letter_replays.apply),
)


def latest() -> int:
    """The schema version this eventlanes needs (the last migration's)."""
    return MIGRATIONS[-1].version  # read at call time: tests add a migration of their own


#: The objects of the current schema by the component that uses them, with the privileges a
#: role needs on each to write (``create=True``) and to read (``create=False``). Sequences
#: exist on PostgreSQL only. The events table is append-only: no UPDATE or DELETE needed.
DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
PARTS: dict[str, tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...]] = {
    "events": (
        ("table", "events", ("SELECT", "INSERT"), ("SELECT",)),
        ("sequence", "events_position_seq", ("USAGE", "SELECT"), ("SELECT",)),
    ),
    "tokens": (
        ("table", "tokens", DML, ("SELECT",)),
        ("table", "nodes", DML, ("SELECT",)),
        ("table", "paused", DML, ("SELECT",)),
        ("table", "versions", DML, ("SELECT",)),
    ),
    "dead_letters": (("table", "dead_letters", DML, ("SELECT",)),),
    "aggregates": (("table", "aggregates", DML, ("SELECT",)),),
    "spark_batches": (("table", "spark_batches", DML, ("SELECT",)),),
    "kafka": (("table", "kafka_partitions", DML, ("SELECT",)),),
    "windows": (
        ("table", "window_states", DML, ("SELECT",)),
        ("table", "window_late", DML, ("SELECT",)),
        ("table", "window_clocks", DML, ("SELECT",)),
    ),
}

#: Tables of the releases before schema versions: finding one without the migrations table
#: means a store to adopt, not an empty database.
LEGACY_TABLES = ("events", "tokens", "nodes", "paused", "dead_letters", "aggregates",
                 "spark_batches")  # fmt: skip
