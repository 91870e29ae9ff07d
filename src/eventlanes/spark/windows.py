"""The window start formula as a Spark column (``pmod``: a floor modulo, right before 1970),
equal to Python's and SQL's (:mod:`eventlanes.windows.kinds`) on integer microseconds. Spark's
own ``window()`` is not used: it works on TimestampType with the session's rules, and the
engines must agree bit for bit."""

from __future__ import annotations

from typing import Any


def start_column(t: Any, step: Any, offset: Any = 0) -> Any:
    """The start of the ``step``-aligned window holding the long column ``t`` (``step`` and
    ``offset``: integers, or long columns)."""
    from pyspark.sql import functions as F

    def col(v: Any) -> Any:
        return F.lit(int(v)) if isinstance(v, int) else v

    return t - F.pmod(t - col(offset), col(step))
