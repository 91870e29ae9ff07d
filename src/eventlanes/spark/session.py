"""SparkSessions: lean settings for ``local[N]``, the cluster's own defaults everywhere else.

``local[N]`` runs in this process on this machine: bind to 127.0.0.1, run Python workers with
this interpreter, size partitions by the N cores, UI off. For ``spark://``, ``yarn``,
``k8s://`` (or a session the user built, e.g. by ``spark-submit`` or in a notebook) none of
that holds: executors run elsewhere, with their own Python, and the cluster's defaults and the
user's ``--conf`` settings apply.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InvalidInputError, SparkJobError


def is_local(master: str | None) -> bool:
    return master is None or master == "local" or master.startswith("local[")


def get_session(
    master: str | None = None,
    app_name: str = "eventlanes",
    conf: Mapping[str, str] | None = None,
    py_files: Iterable[str] = (),
    archives: Iterable[str] = (),
) -> Any:
    """The active SparkSession when no master is given, else a new one.

    ``conf``: extra Spark settings (applied last: they win). ``py_files``: wheels, zips or
    ``.py`` files for the executors' Python path. ``archives``: e.g. a packed virtualenv,
    ``env.tar.gz#environment`` (then set ``PYSPARK_PYTHON=./environment/bin/python``)."""
    from pyspark.sql import SparkSession

    py_files, archives = list(py_files), list(archives)
    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf and not archives:
        _add_py_files(active, py_files)
        register(active)
        return active
    master = master or os.environ.get("EVENTLANES_SPARK_MASTER", "local[2]")
    check_master(master)
    builder = SparkSession.builder.master(master).appName(app_name)
    local = is_local(master)
    if local:
        cores = _cores(master)
        for key, value in {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(cores),
            "spark.default.parallelism": str(cores),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.python.worker.reuse": "true",
            "spark.sql.adaptive.enabled": "false",  # keep partitions = segments
        }.items():
            builder = builder.config(key, value)
    builder = builder.config("spark.sql.execution.arrow.pyspark.enabled", "true").config(
        "spark.sql.session.timeZone", "UTC"
    )
    if archives:
        builder = builder.config("spark.archives", ",".join(archives))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    # Local Python workers run this interpreter (the one with eventlanes and the app's
    # packages). Anywhere else the executors' own Python runs (PYSPARK_PYTHON or python3 on
    # the nodes): the driver's path would not exist there. SparkContext reads the variable
    # once, when it starts: set it only for that moment.
    saved: dict[str, str | None] = {
        k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")
    }
    if local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        spark = builder.getOrCreate()
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    spark.sparkContext.setLogLevel("ERROR")
    _add_py_files(spark, py_files)
    register(spark)  # the streaming source (batch reads need none), for Structured Streaming
    return spark


def check_master(master: str, timeout: float = 10.0) -> None:
    """A standalone master (``spark://host:port``, or several separated by commas) must accept
    a connection before a session is built: Spark's own client retries for about a minute,
    then fails with "Cannot call methods on a stopped SparkContext" and the cause only in its
    log. Raises :class:`SparkJobError` naming the master and why, within ``timeout`` s."""
    if not master.startswith("spark://"):
        return
    addresses = master[len("spark://") :].split(",")
    reasons = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInputError(f"invalid Spark master {master!r}: use spark://host:port")
        reason = _unreachable(host, int(port), timeout)
        if reason is None:
            return
        reasons.append(f"{address}: {reason}")
    raise SparkJobError(f"cannot reach the Spark master {master}: {'; '.join(reasons)}")


def _unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why ``host:port`` does not accept a connection (None: it does). In a thread of its own:
    name resolution has no timeout of its own."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc) or type(exc).__name__)

    probe = threading.Thread(target=connect, name="eventlanes-spark-master", daemon=True)
    probe.start()
    probe.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _add_py_files(spark: Any, py_files: list[str]) -> None:
    for path in py_files:
        if "://" not in path and not os.path.exists(path):
            raise InvalidInputError(f"--py-files: {path!r} does not exist")
        spark.sparkContext.addPyFile(path)


def parse_conf(pairs: Iterable[str]) -> dict[str, str]:
    """``--conf k=v`` options (repeatable) as a dict."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"invalid --conf {pair!r}: use key=value")
        conf[key.strip()] = value
    return conf


def partitions_of(spark: Any, partitions: int | None) -> int:
    """A power of two (segments are masks): ``partitions`` or the session's parallelism."""
    n = partitions or spark.sparkContext.defaultParallelism
    p = 1
    while p < n:
        p *= 2
    return p


def _cores(master: str) -> int:
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    if inside == "*":
        return os.cpu_count() or 1
    try:
        return max(1, int(inside.split(",")[0]))
    except ValueError:
        return 2


def register(spark: Any) -> None:
    """The store's streaming data source, on whatever session runs the continuous query
    (registering again is cheap and harmless)."""
    from .source import StoreDataSource

    spark.dataSource.register(StoreDataSource)
