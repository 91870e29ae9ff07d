"""SparkSessions: lean settings for ``local[N]``, the cluster's own defaults everywhere else.

``local[N]`` runs in this process on this machine: bind to 127.0.0.1, run Python workers with
this interpreter, size partitions by the N cores, UI off. For ``spark://``, ``yarn``,
``k8s://`` (or a session the user built, e.g. by ``spark-submit`` or in a notebook) none of
that holds: executors run elsewhere, with their own Python, and the cluster's defaults and the
user's ``--conf`` settings apply.

Spark Connect (``remote="sc://host:port"`` or ``$SPARK_REMOTE``): the session is a client of a
server that owns the JVM, the executors and its own settings. There is no SparkContext: code
ships with ``addArtifacts`` (classic sessions take it too), the log level is the server's, and
what classic sessions read off the SparkContext (master, parallelism) is read from the
session's settings where the server shows them. A session is told by its own type
(:func:`is_connect`), not by the process-wide flag PySpark sets once any Connect session was
built.
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


#: what :func:`master_of` says of a Connect session whose server does not show its master:
#: executors elsewhere, as on a cluster
UNKNOWN_REMOTE = "spark-connect (master not shown)"


def is_connect(spark: Any) -> bool:
    """A Spark Connect session (no SparkContext, no RDDs, no accumulators)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def conf_of(spark: Any, key: str) -> str | None:
    """A setting of the session (None: unset, or a server that does not show it)."""
    try:
        value = spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a server may refuse to show a setting
        return None
    return None if value is None else str(value)


def master_of(spark: Any) -> str:
    """The session's master: where its executors run (see :func:`is_local`)."""
    if not is_connect(spark):
        return str(spark.sparkContext.master)
    return conf_of(spark, "spark.master") or UNKNOWN_REMOTE


def check_remote(url: str, timeout: float = 10.0) -> None:
    """A Spark Connect URL (``sc://host[:port][/;param=value...]``) must be well formed and its
    server accept a connection: the client would retry for minutes, naming nothing."""
    rest = url[len("sc://") :] if url.startswith("sc://") else None
    address = (rest or "").split("/", 1)[0]
    host, colon, port = address.rpartition(":") if ":" in address else (address, "", "15002")
    if rest is None or not host or (colon and not port.isdigit()):
        raise InvalidInputError(
            f"invalid Spark Connect URL {url!r}: use sc://host:port (e.g. sc://127.0.0.1:15002)"
        )
    reason = _unreachable(host.strip("[]"), int(port), timeout)
    if reason is not None:
        raise SparkJobError(f"cannot reach the Spark Connect server {url}: {reason}")


def get_session(
    master: str | None = None,
    app_name: str = "eventlanes",
    conf: Mapping[str, str] | None = None,
    py_files: Iterable[str] = (),
    archives: Iterable[str] = (),
    remote: str | None = None,
) -> Any:
    """The active SparkSession when no master is given, else a new one; a Spark Connect
    session for ``remote`` (``sc://host:port``; without a master, ``$SPARK_REMOTE`` too).

    ``conf``: extra Spark settings (applied last: they win). ``py_files``: wheels, zips or
    ``.py`` files for the executors' Python path. ``archives``: e.g. a packed virtualenv,
    ``env.tar.gz#environment`` (then set ``PYSPARK_PYTHON=./environment/bin/python``)."""
    from pyspark.sql import SparkSession

    py_files, archives = list(py_files), list(archives)
    if remote and master:
        raise InvalidInputError("give --master or --remote, not both")
    active = SparkSession.getActiveSession()
    if active is not None and master is None and remote is None:
        if is_connect(active):  # never a second session: settings go to this one
            for key, value in (conf or {}).items():
                active.conf.set(key, value)
            _add_archives(active, archives)
        if is_connect(active) or (not conf and not archives):
            _add_py_files(active, py_files)
            register(active)
            return active
    if master is None:
        remote = remote or os.environ.get("SPARK_REMOTE") or None
    if remote is not None:
        return _connect(remote, app_name, conf or {}, py_files, archives)
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


def _connect(
    url: str, app_name: str, conf: Mapping[str, str], py_files: list[str], archives: list[str]
) -> Any:
    """A Spark Connect session: only runtime settings reach the server's session; the log
    level and the master are the server's."""
    from pyspark.sql import SparkSession

    check_remote(url)
    builder = SparkSession.builder.remote(url).appName(app_name)
    settings = {"spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.sql.session.timeZone": "UTC", **conf}  # fmt: skip
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _add_archives(spark, archives)
    _add_py_files(spark, py_files)
    register(spark)
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
        if "://" in path:
            if is_connect(spark):
                raise InvalidInputError(
                    f"--py-files: {path!r}: a Spark Connect session takes local files only"
                )
            spark.sparkContext.addPyFile(path)  # classic: a URL the nodes fetch themselves
            continue
        if not os.path.exists(path):
            raise InvalidInputError(f"--py-files: {path!r} does not exist")
        spark.addArtifacts(path, pyfile=True)


def _add_archives(spark: Any, archives: list[str]) -> None:
    """Archives for a Connect session (a classic one takes ``spark.archives`` when built:
    under Connect that is not a setting a session may change)."""
    for path in archives:
        local = path.split("#", 1)[0]
        if "://" in local or not os.path.exists(local):
            raise InvalidInputError(f"--archives: {path!r}: not a local file")
        spark.addArtifacts(path, archive=True)


def parse_conf(pairs: Iterable[str], option: str = "--conf") -> dict[str, str]:
    """``--conf k=v`` options (repeatable; or ``option``'s) as a dict."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"invalid {option} {pair!r}: use key=value")
        conf[key.strip()] = value
    return conf


def partitions_of(spark: Any, partitions: int | None) -> int:
    """A power of two (segments are masks): ``partitions`` or the session's parallelism."""
    n = partitions or parallelism(spark)
    p = 1
    while p < n:
        p *= 2
    return p


def parallelism(spark: Any) -> int:
    """The session's default parallelism. Under Connect (no SparkContext to ask): the
    ``spark.default.parallelism`` setting, else the cores of a ``local[N]`` master, else
    ``spark.sql.shuffle.partitions`` (the width the user gave shuffles); ``--partitions``
    overrides all of these."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    value = conf_of(spark, "spark.default.parallelism")
    if value and value.isdigit():
        return max(1, int(value))
    master = master_of(spark)
    if master.startswith("local"):
        return _cores(master)
    value = conf_of(spark, "spark.sql.shuffle.partitions")
    return max(1, int(value)) if value and value.isdigit() else 2


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
