"""A Spark standalone cluster for the tests: one Master and two Workers (a core each) on
127.0.0.1, started from the pyspark package, small memory, killed at the end: a job's tasks run
in two executor processes, as on a cluster of two machines.

The executors run a Python that cannot import eventlanes nor the tests' apps: a plain venv
(``--without-pip``, made in well under a second) whose only extra path is a folder of links to
the packages PySpark's Python workers need (pyarrow, pandas<3 with numpy, dateutil, pytz,
tzdata, orjson, the ADBC drivers and opentelemetry-api: what ``eventlanes[spark]``
installs). A copy of those packages would take seconds and hundreds of MB; a venv with the
driver's site-packages would see the driver's editable eventlanes install. The Worker puts
that venv first on PATH, so executors run it as ``python3``, as a cluster node's ``python3``
would be found. Whatever eventlanes and the app need must reach them through Spark.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

EXECUTOR_PACKAGES = [
    "pyarrow",
    "pandas",
    "numpy",
    "dateutil",
    "pytz",
    "tzdata",
    "orjson",
    "adbc_driver_manager",
    "adbc_driver_postgresql",
    # opentelemetry-api, a dependency of eventlanes itself (its tracing imports it), and its
    # one dependency
    "opentelemetry",
    "typing_extensions",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def executor_python(root: Path, name: str = "executor-venv", extra: tuple[str, ...] = ()) -> Path:
    """A venv whose Python sees only PySpark's worker dependencies."""
    venv = root / name
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    deps = root / "executor-deps"
    if deps.is_dir():
        (site,) = (venv / "lib").glob("python3*/site-packages")
        (site / "executor-deps.pth").write_text(f"{deps}\n")
        return venv / "bin" / "python"
    deps.mkdir()
    for package_name in (*EXECUTOR_PACKAGES, *extra):
        spec = importlib.util.find_spec(package_name)
        assert spec is not None, f"{package_name} is not installed"
        if spec.origin is None:  # a namespace package (opentelemetry): its one folder here
            (location,) = spec.submodule_search_locations or []
            (deps / package_name).symlink_to(location)
            continue
        if not spec.origin.endswith("__init__.py"):  # a single module (typing_extensions.py)
            (deps / Path(spec.origin).name).symlink_to(spec.origin)
            continue
        package = Path(spec.origin).parent
        (deps / package_name).symlink_to(package)
        libs = package.with_name(f"{package_name}.libs")  # vendored shared libraries of some wheels
        if libs.is_dir():
            (deps / libs.name).symlink_to(libs)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "executor-deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "python"


def pack_environment(root: Path) -> Path:
    """``env.tar.gz``: a venv packed as ``--archives env.tar.gz#environment`` expects it, used
    with ``PYSPARK_PYTHON=./environment/bin/python``. Its packages are links to this machine's
    (a real packed venv copies them: hundreds of MB, which one machine does not need), so it
    proves the archive is unpacked and its interpreter is the one the executors run."""
    import tarfile

    python = executor_python(root, "packed-venv")
    archive = root / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(python.parent.parent, arcname=".")
    return archive


@dataclass
class Cluster:
    master: str  # spark://127.0.0.1:PORT
    python: Path  # what the executors run
    root: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver process: this worktree's eventlanes and tests on its
        path (the executors have neither)."""
        here = Path(__file__).resolve().parent.parent
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
        env["PYTHONPATH"] = os.pathsep.join([str(here / "src"), str(here)])
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env.update(extra)
        return env

    def conf(self) -> list[str]:
        """Driver settings for this small cluster (as a user would pass them)."""
        pairs = {
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",  # an executor on each Worker
            "spark.cores.max": "2",
            "spark.driver.host": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
        }
        return [f"{k}={v}" for k, v in pairs.items()]

    def cli_conf(self) -> list[str]:
        return [arg for pair in self.conf() for arg in ("--conf", pair)]

    def tasks_by_worker(self, since: float) -> dict[str, int]:
        """Per Worker, the tasks its executors ran for applications started after ``since``
        (``time.time()``): the "Running task" lines of their logs."""
        found = {}
        for work in sorted(self.root.glob("work-*")):
            tasks = 0
            for app in work.glob("app-*"):
                if app.stat().st_mtime < since:
                    continue
                for log in app.glob("*/stderr"):
                    tasks += log.read_text(errors="replace").count("Running task ")
            found[work.name] = tasks
        return found

    def stop(self) -> None:
        for proc in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _daemon_env(cluster_root: Path, path_first: Path | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON")) and k != "VIRTUAL_ENV"
    }
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_LOG_DIR=str(cluster_root / "logs"),
        SPARK_CONF_DIR=str(cluster_root / "conf"),
    )
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return env


def start(root: Path, timeout: float = 90.0, extra: tuple[str, ...] = ()) -> Cluster:
    """Start the Master and two Workers (a core and 768 MB for executors each, work folders
    ``work-1`` and ``work-2``); wait until both have registered. Raises (after stopping what
    started) if they do not within ``timeout``."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        raise RuntimeError("Java 17+ is needed for the Spark cluster tests")
    root.mkdir(parents=True, exist_ok=True)
    (root / "conf").mkdir(exist_ok=True)
    python = executor_python(root, extra=extra)
    port, ui = _free_port(), _free_port()
    spark_class = str(spark_home() / "bin" / "spark-class")
    cluster = Cluster(f"spark://127.0.0.1:{port}", python, root)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)

    def launch(name: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        cwd.mkdir(exist_ok=True)
        out = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed when the process ends
        cluster.processes.append(
            subprocess.Popen(
                [spark_class, *args],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        )

    try:
        launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(port), "--webui-port", str(ui)],
               _daemon_env(root), root / "master")  # fmt: skip
        for n in (1, 2):
            launch(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", cluster.master,
                                   "--host", "127.0.0.1", "--cores", "1", "--memory", "768m",
                                   "--work-dir", str(root / f"work-{n}"),
                                   "--webui-port", str(_free_port())],
                   _daemon_env(root, python.parent), root / f"worker-{n}")  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in cluster.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited; see {logs}")
            status = f"http://127.0.0.1:{ui}/json/"
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(status) as r:
                if json.load(r).get("aliveworkers", 0) >= 2:
                    return cluster
            time.sleep(0.5)
        raise RuntimeError(f"the Spark workers did not register within {timeout} s; see {logs}")
    except BaseException:
        cluster.stop()
        raise
