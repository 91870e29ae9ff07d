"""A Spark Connect server for the tests: ``sbin/start-connect-server.sh`` of the pyspark package
(its server jar ships in the wheel), in the foreground (``--wait``), on 127.0.0.1 and a free
port, ``local[2]`` with small memory, killed (its process group) at the end.

Its executors' Python is the cluster tests' bare venv (:func:`tests.spark_cluster.executor_python`,
with the Kafka client linked in too): it cannot import eventlanes nor the tests' apps, so
whatever a job needs of them must be shipped to the server (``addArtifacts``).

Clients run in processes of their own, never in a pytest worker: PySpark refuses a Connect
session in a process that has a classic one ("[SESSION_ALREADY_EXIST] Cannot start a remote
Spark session because there is a regular Spark session already running", checked), and
building one sets a process-wide Connect flag that later classic sessions would meet.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.spark_cluster import executor_python, spark_home

ROOT = Path(__file__).resolve().parent.parent
CONNECT_CLIENT = ("grpc", "grpc_status", "zstandard", "google.rpc")  # pyspark[connect]


def client_missing() -> str | None:
    """The first module of the Connect client this Python lacks (None: it has them all)."""
    import importlib.util

    for name in CONNECT_CLIENT:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return name
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ConnectServer:
    url: str  # sc://127.0.0.1:PORT
    python: Path  # what the executors run
    root: Path
    process: subprocess.Popen

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a client process: this worktree's eventlanes and tests on its
        path, no Spark settings of the caller's (a SPARK_REMOTE among them)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
        env.update(extra)
        return env

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def start(root: Path, timeout: float = 120.0, extra: tuple[str, ...] = ()) -> ConnectServer:
    """Start the server; return once it accepts connections. Raises (after stopping it) if it
    exits or does not accept within ``timeout``. ``extra``: more packages of this Python the
    executors see."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("conf", "logs", "pids", "work"):
        (root / name).mkdir(exist_ok=True)
    python = executor_python(root, extra=("confluent_kafka", *extra))
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_CONF_DIR=str(root / "conf"),
        SPARK_LOG_DIR=str(root / "logs"),
        SPARK_PID_DIR=str(root / "pids"),
        PYSPARK_PYTHON=str(python),
    )
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.python.worker.reuse": "true",
        "spark.sql.adaptive.enabled": "false",
    }
    script = spark_home() / "sbin" / "start-connect-server.sh"
    args = ["bash", str(script), "--wait", "--master", "local[2]", "--driver-memory", "768m"]
    args += [a for k, v in settings.items() for a in ("--conf", f"{k}={v}")]
    log = open(root / "logs" / "server.log", "w")  # noqa: SIM115 - closed when it ends
    process = subprocess.Popen(args, env=env, cwd=root / "work", stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    server = ConnectServer(f"sc://127.0.0.1:{port}", python, root, process)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited; see {root / 'logs'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return server
            time.sleep(0.5)
        raise RuntimeError(f"the Spark Connect server did not accept within {timeout} s")
    except BaseException:
        server.stop()
        raise
