"""What every ``eventlanes`` command shares: the click group (its error lines), the consoles,
the table printer and the Spark options of ``run`` and ``replay``."""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import click
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from .. import __version__
from ..errors import EventlanesError
from . import logs as logsetup

console = Console()
err_console = Console(stderr=True)
#: one logger for every command: log lines say ``eventlanes.cli`` (the docs show them)
log = logging.getLogger("eventlanes.cli")


def _is_spark_failure(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("pyspark", "py4j")


def _error_line(message: str) -> NoReturn:
    from rich.markup import escape

    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(2)


def _usage_error(exc: click.UsageError, where: str = "eventlanes") -> NoReturn:
    """A mistyped command line (unknown option or command, missing argument, bad value):
    one line with a hint to ``--help``, instead of click's usage block; exit code 2."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc  # no arguments at all: click prints the help
    if exc.ctx is not None:
        where = exc.ctx.command_path
    _error_line(f"{exc.format_message().rstrip('.')} (see '{where} --help')")


class _Group(click.Group):
    """Turns eventlanes errors (and Spark's) into one clear line and exit code 2, not a
    traceback; ``--debug`` shows the full trace. Usage errors are one line too."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context) -> Any:
        args = [*ctx._protected_args, *ctx.args]  # the command's name first
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            named = args[0] if args and args[0] in self.commands else None
            _usage_error(exc, f"{ctx.command_path} {named}" if named else ctx.command_path)
        except Exception as exc:
            if ctx.params.get("debug") or not (
                isinstance(exc, EventlanesError) or _is_spark_failure(exc)
            ):
                raise
            message = str(exc)
            if _is_spark_failure(exc):
                from ..spark.ship import first_line

                message = f"Spark failed: {first_line(exc)}"
            _error_line(message)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="eventlanes")
@click.option(
    "--log-level",
    type=click.Choice(logsetup.LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="log lines at this level and above",
)
@click.option(
    "--log-format",
    type=click.Choice(logsetup.FORMATS),
    default="text",
    show_default=True,
    help="text (rich on a terminal) or json (one object a line)",
)
@click.option("--debug", is_flag=True, help="show full tracebacks of errors")
@click.pass_context
def main(ctx: click.Context, log_level: str, log_format: str, debug: bool) -> None:  # fmt: skip
    """Parallel, per-key ordered, resumable, exactly-once event processing.

    MODULE:APP names the app: a module importable from the current directory and its
    el.App (shop:app, shop.app:app), or a Python file (./shop.py:app)."""
    ctx.obj = {"log_level": log_level.lower(), "log_format": log_format}
    logsetup.setup(log_level.lower(), log_format, err_console)
    logging.captureWarnings(True)


def spark_options(command: Any) -> Any:
    """--master, --remote, --conf, --py-files, --archives: the options of spark-submit."""
    for option in reversed([
        click.option("--master", help="Spark master: local[N], spark://host:port, yarn, "
                     "k8s://... (default: the active session, $EVENTLANES_SPARK_MASTER or "
                     "local[2])"),
        click.option("--remote", help="a Spark Connect server, sc://host:port (default: "
                     "$SPARK_REMOTE when no --master is given)"),
        click.option("--conf", "conf", multiple=True, metavar="K=V",
                     help="a Spark setting (repeatable)"),
        click.option("--py-files", "py_files", default="",
                     help="comma-separated wheels, zips or .py files for the executors"),
        click.option("--archives", default="",
                     help="comma-separated archives for the executors, e.g. a packed "
                     "virtualenv env.tar.gz#environment (with PYSPARK_PYTHON="
                     "./environment/bin/python)"),
    ]):  # fmt: skip
        command = option(command)
    return command


def spark_kwargs(
    conf: tuple[str, ...], py_files: str, archives: str, remote: str | None = None
) -> dict[str, Any]:
    """The values of :func:`spark_options` as the Spark engine takes them."""
    from ..spark.session import parse_conf

    return {
        "remote": remote,
        "conf": parse_conf(conf),
        "py_files": [p for p in py_files.split(",") if p],
        "archives": [a for a in archives.split(",") if a],
    }


def print_table(table: Table) -> None:
    """Print a table whole. On a terminal it fits the terminal's width, long cells folded onto
    more lines (never cut with an ellipsis); elsewhere (a pipe, a file, a log) at its natural
    width, one line per row, so scripts and people reading logs see every value."""
    for column in table.columns:
        column.overflow = "fold"
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update(max_width=1_000_000), table)
    title = cell_len(table.title) if isinstance(table.title, str) else 0
    Console(file=console.file, width=max(natural.maximum, title, 1)).print(table)
