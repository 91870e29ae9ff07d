"""Logging setup for the command line and its worker processes.

* ``text`` on a terminal: rich's handler on the same Console as the progress bars, so log lines
  scroll above the bars instead of tearing them;
* ``text`` elsewhere: ``2026-01-01T12:00:00.123Z INFO eventlanes.processing: message`` lines;
* ``json``: one JSON object per line (time, level, logger, message, process, exc).

Worker processes (``run --processes N``) send their records, each down a pipe of its own, to
the supervisor, whose handlers format them: one place decides the format, and nothing prints
into the bars.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import pickle
import sys
import threading
import time
from collections import deque
from contextlib import suppress
from multiprocessing.connection import Connection, wait
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from ..errors import InvalidInputError
from ..observe import CRASH

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
_OURS = "_eventlanes_handler"  # marks handlers this module installed (replaced on reconfigure)
#: a record attribute: a worker process tells the supervisor its processors run (not printed)
READY = "eventlanes_ready"


def _utc(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return _utc(record.created, record.msecs)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _utc(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str)


def _check(level: str, fmt: str) -> int:
    if level.lower() not in LEVELS:
        raise InvalidInputError(f"invalid log level {level!r}: use one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise InvalidInputError(f"invalid log format {fmt!r}: use one of {', '.join(FORMATS)}")
    return int(getattr(logging, level.upper()))


def _install(handler: logging.Handler, level: int) -> None:
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    logging.getLogger("eventlanes").setLevel(level)
    # Third-party libraries stay at WARNING unless debugging.
    root.setLevel(min(level, logging.WARNING))


def handler_for(fmt: str, console: Console | None = None) -> logging.Handler:
    """The handler that writes our format: rich's on a terminal Console, plain lines else."""
    if fmt == "text" and console is not None and console.is_terminal:
        return RichHandler(console=console, show_path=False, log_time_format="%H:%M:%S")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    return handler


def setup(level: str = "info", fmt: str = "text", console: Console | None = None) -> None:
    """Configure logging of this process (``console``: the Console of the progress bars)."""
    numeric = _check(level, fmt)
    _install(handler_for(fmt, console), numeric)


def setup_worker(channel: Connection, level: str) -> LogSender:
    """In a worker process: every record goes to the supervisor down ``channel``, this
    worker's own pipe. Returns the sender (:func:`tell_ready` writes to it too)."""
    sender = LogSender(channel)
    _install(logging.handlers.QueueHandler(sender), _check(level, "text"))  # type: ignore[arg-type]
    logging.captureWarnings(True)
    return sender


def tell_ready(sender: LogSender) -> None:
    """In a worker process: tell the supervisor that its processors run, in line with its
    log records (so a crash logged before it is seen before it)."""
    sender.put_nowait(logging.makeLogRecord({"name": "eventlanes.worker", "msg": "ready",
                                             READY: True}))  # fmt: skip


def supervisor_gone() -> None:
    """In a worker whose supervisor is gone: its records go to its own stderr from now. (A
    record sent while the dead supervisor's pipe ends were still being closed was taken by
    the pipe, and lost.)"""
    for handler in logging.getLogger().handlers:
        sender = getattr(handler, "queue", None)
        if isinstance(sender, LogSender):
            sender.detach()


class LogSender:
    """A worker's end of its pipe, as the queue of a ``QueueHandler``. One pipe per worker, no
    lock shared between processes: a ``multiprocessing.Queue`` shared by all workers has one,
    and a worker killed while writing (SIGKILL, the OOM killer) kept it for ever, so no
    worker's record arrived again and the supervisor hung at its stop. Sending blocks while
    the pipe is full (the supervisor is slow), as writing to stderr would."""

    def __init__(self, channel: Connection) -> None:
        self.channel: Connection | None = channel
        self.lock = threading.Lock()  # a record over PIPE_BUF is written in several parts
        # A process this worker forks (a handler's fork-based pool) must not write into the
        # pipe beside it: the lock is not shared with it (records would be cut), and one
        # held by another thread at the fork stays held in the child for ever. Nor may a
        # program it runs (os.system) keep the pipe open after the worker ended.
        os.set_inheritable(channel.fileno(), False)
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a child forked from this worker: its records go to its own stderr (its copy of
        the pipe end is closed; the worker's stays). The lock is new: another thread may have
        held it at the fork."""
        self.lock = threading.Lock()
        self.detach()

    def detach(self) -> None:
        """From now, records go to stderr."""
        with self.lock:
            if self.channel is not None:
                with suppress(OSError):
                    self.channel.close()
                self.channel = None

    def put_nowait(self, record: logging.LogRecord) -> None:
        with self.lock:
            if self.channel is not None:
                try:
                    self.channel.send(record)
                    return
                except OSError:  # the supervisor is gone: the records go to our stderr
                    self.channel = None
                except BaseException:  # a stop signal while starting, maybe mid-record: the
                    # pipe ends here (a cut record followed by more would be read as one)
                    self.channel.close()
                    self.channel = None
                    raise
            sys.stderr.write(TextFormatter().format(record) + "\n")


class _Pipes:
    """The supervisor's ends of the workers' pipes, read as one queue by the listener:
    ``get`` returns the next record of any worker; a pipe whose worker ended (or that broke)
    is dropped at its end. ``put_nowait(None)`` (the listener's stop): ``get`` returns None
    once every pipe is read to its end, or ``DRAIN`` seconds later."""

    DRAIN = 5.0

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.lock = threading.Lock()
        self.readers: list[Connection] = []
        self.writers: list[Connection] = []  # closed at the stop (a worker never started)
        self.wake_r, self.wake_w = ctx.Pipe(duplex=False)
        self.pending: deque[logging.LogRecord] = deque()
        self.until: float | None = None  # set by the stop

    def open(self) -> Connection:
        reader, writer = self.ctx.Pipe(duplex=False)
        with self.lock:
            self.readers.append(reader)
            self.writers.append(writer)
        self.wake_w.send_bytes(b"")
        return writer

    def put_nowait(self, item: None) -> None:
        with self.lock:
            for writer in self.writers:
                writer.close()
            self.until = time.monotonic() + self.DRAIN
        self.wake_w.send_bytes(b"")

    def get(self, block: bool = True) -> logging.LogRecord | None:
        while not self.pending:
            with self.lock:
                readers, until = list(self.readers), self.until
            if until is not None and (not readers or time.monotonic() >= until):
                for left in readers:  # a worker still alive past the drain: stop reading it
                    left.close()
                with self.lock:
                    self.readers.clear()
                return None
            timeout = None if until is None else max(0.0, until - time.monotonic())
            for conn in wait([self.wake_r, *readers], timeout):
                assert isinstance(conn, Connection)
                if conn is self.wake_r:
                    conn.recv_bytes()
                    continue
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):  # its end, or a worker killed mid-record
                    with self.lock:
                        self.readers.remove(conn)
                    conn.close()
                    continue
                try:
                    self.pending.append(pickle.loads(data))
                except Exception as exc:  # noqa: BLE001 - a record this process cannot load
                    # (a class only the worker has, in ``extra``): that record alone is lost
                    sys.stderr.write(f"error: a worker's log record could not be read: {exc!r}\n")
        return self.pending.popleft()


class _Listener(logging.handlers.QueueListener):
    """Hands records to the handlers in the order they came; counts the workers' ready notes
    and calls ``on_ready`` once all ``workers`` sent one, unless a crash was logged before."""

    def __init__(self, queue: Any, handlers: list[logging.Handler], workers: int,
                 on_ready: Any) -> None:  # fmt: skip
        super().__init__(queue, *handlers, respect_handler_level=True)
        self.workers = workers
        self.on_ready = on_ready
        self.ready = 0
        self.crashed = False

    def handle(self, record: logging.LogRecord) -> None:
        try:
            self._handle(record)
        except Exception as exc:  # noqa: BLE001 - one record lost, never the listener:
            # a listener ended by it would leave every worker blocked on a full pipe
            with suppress(Exception):
                sys.stderr.write(f"error: a worker's log record was lost: {exc!r}\n")

    def _handle(self, record: logging.LogRecord) -> None:
        if getattr(record, READY, False):
            self.ready += 1
            if self.ready == self.workers and not self.crashed and self.on_ready is not None:
                self.on_ready()
            return
        if getattr(record, CRASH, False):
            self.crashed = True
        super().handle(record)


class WorkerLogs:
    """In the supervisor: a pipe per worker for its records and a listener that hands them to
    this process's handlers (formatted and placed like its own lines). ``on_ready()`` is called
    (on the listener's thread, in line with the records) once ``workers`` workers told that
    their processors run, unless one logged a crash first."""

    def __init__(self, ctx: Any, workers: int = 0, on_ready: Any = None) -> None:
        self.pipes = _Pipes(ctx)
        root = logging.getLogger()
        self.listener = _Listener(self.pipes, list(root.handlers), workers, on_ready)
        self.listener.start()

    def channel(self) -> Connection:
        """A new worker's end of a new pipe: pass it to the worker, and close it here once
        the worker started (so the pipe ends when the worker does)."""
        return self.pipes.open()

    def close(self) -> None:
        """Read what the ended workers wrote, then stop."""
        self.listener.stop()
