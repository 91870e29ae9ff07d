"""A replay's states brought to the driver a bounded part at a time, so that its memory does not
grow with the number of keys: the states are kept on the executors (memory, then disk),
counted, and collected one hash bucket of the key at a time, each part staged before the next
is asked for (:mod:`eventlanes.processing.tables.staging`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import SparkJobError

#: states collected at a time, at most about (their Arrow columns, then one Python tuple each)
PART = 100_000


def parts_of(df: Any, bound: int, what: str) -> Iterator[Any]:
    """``df``'s rows as Arrow tables of about :data:`PART` rows at most (one collect when
    ``bound``, a bound of its row count, says it is small). Every row is in exactly one part:
    the parts' sizes are checked against the count, or :class:`SparkJobError` (``what`` names
    the replay)."""
    if bound <= PART:
        yield df.toArrow()
        return
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    kept = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        total = kept.count()
        parts = max(1, -(-total // PART))
        if parts == 1:
            yield kept.toArrow()
            return
        bucket = F.pmod(F.xxhash64(F.col("key")), F.lit(parts))  # a null key's: the seed's
        seen = 0
        for i in range(parts):
            table = kept.where(bucket == i).toArrow()
            seen += table.num_rows
            yield table
        if seen != total:  # a part lost or doubled: nothing may be written
            raise SparkJobError(
                f"{what}: Spark returned {seen:,} states in parts but counted {total:,}: "
                "nothing was written"
            )
    finally:
        kept.unpersist()
