"""Logging setup for the command line and its worker processes.

* ``text`` on a terminal: rich's handler on the same Console as the progress bars, so log lines
  scroll above the bars instead of tearing them;
* ``text`` elsewhere: ``2026-01-01T12:00:00.123Z INFO eventlanes.processing: message`` lines;
* ``json``: one JSON object per line (time, level, logger, message, process, exc).

Worker processes (``run --processes N``) send their records through a queue to the supervisor,
whose handlers format them: one place decides the format, and nothing prints into the bars.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time
from typing import Any

from rich.console import Console
from rich.logging import RichHandler

from .errors import InvalidInputError

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
_OURS = "_eventlanes_handler"  # marks handlers this module installed (replaced on reconfigure)


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


def setup_worker(queue: Any, level: str) -> None:
    """In a worker process: every record goes to the supervisor through ``queue``."""
    _install(logging.handlers.QueueHandler(queue), _check(level, "text"))
    logging.captureWarnings(True)


class WorkerLogs:
    """In the supervisor: a queue for the workers' records and a listener that hands them to
    this process's handlers (formatted and placed like its own lines)."""

    def __init__(self, ctx: Any) -> None:
        self.queue = ctx.Queue()
        root = logging.getLogger()
        self.listener = logging.handlers.QueueListener(
            self.queue, *root.handlers, respect_handler_level=True
        )
        self.listener.start()

    def close(self) -> None:
        self.listener.stop()
