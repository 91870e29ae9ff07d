"""The Spark pipeline: bulk replay and continuous processing on PySpark.

Needs the ``spark`` extra (pyspark, pyarrow, pandas<3) and Java 17+. Imported lazily: the rest
of eventlanes works without Spark.
"""

from __future__ import annotations

from .session import get_session

__all__ = ["get_session", "replay", "export_parquet"]


def replay(*args, **kwargs):
    from .bulk_replay import replay as _replay

    return _replay(*args, **kwargs)


def export_parquet(*args, **kwargs):
    from .export import export_parquet as _export

    return _export(*args, **kwargs)
