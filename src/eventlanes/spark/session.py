"""A lean SparkSession for this machine size, and the store's data source registered on it."""

from __future__ import annotations

import os
import sys
from typing import Any

_registered: set[int] = set()


def get_session(master: str | None = None, app_name: str = "eventlanes") -> Any:
    """The active SparkSession, or a new one tuned for small machines: UI and progress bar off,
    shuffle partitions = cores, bound to 127.0.0.1, Python workers reused, Arrow on."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        register(active)
        return active
    master = master or os.environ.get("EVENTLANES_SPARK_MASTER", "local[2]")
    # Python workers run this interpreter (the venv with eventlanes), and import the user's
    # modules (handlers are pickled by reference): give them the driver's import roots.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    roots = [p for p in (os.getcwd(), *sys.path[:3]) if p and os.path.isdir(p)]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *current]))
    cores = _cores(master)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")  # keep partitions = segments
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _cores(master: str) -> int:
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    if inside == "*":
        return os.cpu_count() or 1
    try:
        return max(1, int(inside.split(",")[0]))
    except ValueError:
        return 2


def register(spark: Any) -> None:
    if id(spark) in _registered:
        return
    from .source import StoreDataSource

    spark.dataSource.register(StoreDataSource)
    _registered.add(id(spark))
