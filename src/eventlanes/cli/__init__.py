"""The ``eventlanes`` command line: run, inspect and steer processors."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from .. import __version__, signals
from ..admin.health import (
    MaxLag,
    lag_seconds,
    parse_max_lag,
    processor_document,
    status_document,
    store_first_after,
)
from ..admin.inspect import ReadOnlyInspector
from ..admin.reset import parse_reset_to
from ..errors import (
    EventlanesError,
    InvalidInputError,
    ProcessorBusyError,
    ProcessorCrashedError,
    StopTimeoutError,
)
from ..kafka import status as kafka_status
from ..loader import load_app
from ..store import open_store
from ..tracing import configure_from_env
from ..tracing import shutdown as shutdown_tracing
from . import logs as logsetup

console = Console()
err_console = Console(stderr=True)
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


def _spark_options(command: Any) -> Any:
    """--master, --conf, --py-files, --archives: the options of spark-submit."""
    for option in reversed([
        click.option("--master", help="Spark master: local[N], spark://host:port, yarn, "
                     "k8s://... (default: the active session, $EVENTLANES_SPARK_MASTER or "
                     "local[2])"),
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


def _spark_kwargs(conf: tuple[str, ...], py_files: str, archives: str) -> dict[str, Any]:
    from ..spark.session import parse_conf

    return {
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


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show an event store's size and head position (reads only: creates nothing)."""
    with open_store(url, create=False) as store:
        table = Table(title=f"event store {store.db.url.redacted}")
        table.add_column("backend")
        table.add_column("events", justify="right")
        table.add_column("head position", justify="right")
        table.add_row(store.db.backend, f"{store.count():,}", f"{store.head():,}")
        print_table(table)


@main.command()
@click.argument("url")
@click.option("--check", is_flag=True,
              help="change nothing: say what is pending and exit 1 unless up to date")  # fmt: skip
def migrate(url: str, check: bool) -> None:
    """Create or upgrade a store's tables (its schema version). Run it with a role that may
    create and alter them; the app then runs with SELECT, INSERT, UPDATE and DELETE only."""
    from ..db import open_database
    from ..schema import inspect, latest, migrate

    if not check:
        console.print(migrate(url).summary(), highlight=False, soft_wrap=True)
        return
    db = open_database(url, create=False)  # reads only: never creates a file or a table
    try:
        state = inspect(db)
    finally:
        db.close()
    if state.current:
        console.print(f"{state.url}: schema version {state.version}, up to date", highlight=False,
                      soft_wrap=True)  # fmt: skip
        return
    pending = ", ".join(f"{m.version} {m.name}" for m in state.pending) or "none"
    console.print(
        f"{state.url}: {state.describe()}; this eventlanes needs schema version {latest()} "
        f"(pending: {pending})" + (", and knows no version " + ", ".join(map(str, state.unknown))
                                   if state.unknown else ""),
        highlight=False,
        soft_wrap=True,
    )  # fmt: skip
    sys.exit(1)


class _RateColumn(ProgressColumn):
    """Events per second, from rich's moving estimate of the position's speed."""

    def render(self, task: Any) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f} ev/s", style="progress.data.speed")


def _progress(app: Any, names: list[str]) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _RateColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks = {n: progress.add_task(n, total=1, detail="") for n in names}
    first_after = store_first_after(app.store)

    def tick() -> None:
        try:
            now = datetime.now(UTC)
            for name, task in tasks.items():
                view = app.status(name)
                owners = len({s.owner for s in view.segments if s.owner})
                errors = sum(1 for s in view.segments if s.last_error)
                lag_s = lag_seconds(first_after, view.position, view.head, now)
                detail = f"lag {view.lag:,} ev / {lag_s:,.1f} s, {owners} node(s)"
                detail += f", [red]{errors} failing[/red]" if errors else ""
                detail += f", [red]{view.dead_letters} parked[/red]" if view.dead_letters else ""
                progress.update(
                    task, completed=view.position, total=max(1, view.head), detail=detail
                )
        except Exception as exc:  # noqa: BLE001 - the bars must not take the workers down
            log.warning("progress: reading the status failed: %s", exc)

    return progress, tick


def _start_lines(app: Any, names: list[str]) -> None:
    """One line per processor: mode, segments (the stored layout's, and what this app declares
    when that differs) and the position it starts from; and why readers wait, if they do."""
    for name in names:
        proc = app.get(name)
        view = app.status(name)
        segments = f"{len(view.segments)} segment(s)"
        if view.layout_note is not None:
            segments += f" stored, {proc.segments} declared here: the stored layout runs"
        log.info(
            "%s: starting (%s, %s, on_error=%s) at position %s, head %s, lag %s",
            name, proc.mode, segments, proc.on_error, f"{view.position:,}",
            f"{view.head:,}", f"{view.lag:,}",
        )  # fmt: skip
        if view.read_wait is not None:
            log.info("%s: %s", name, view.read_wait.describe())


class _Metrics:
    """``run --metrics-port``: in one process the app serves them; with N processes the
    workers write to a directory made here and this process serves their sum."""

    def __init__(self, app: Any, names: list[str], port: int | None, processes: int) -> None:
        self.port = port
        self.dir: str | None = None
        self.server: Any = None
        self.marked: set[int] = set()
        if port is None or processes == 1:
            return
        self.dir = tempfile.mkdtemp(prefix="eventlanes-metrics-")
        # Set before prometheus-client is imported here (it picks its value store at import),
        # and inherited by the spawned workers.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.dir
        from ..admin.metrics import MetricsServer, registry_for

        self.server = MetricsServer(registry_for(app, None, names), port)

    def reap(self, children: list[Any]) -> None:
        """Gauges of a worker that ended stop counting (``livesum``)."""
        if self.dir is None:
            return
        from prometheus_client import multiprocess

        for child in children:
            if (
                child.pid is not None
                and child.exitcode is not None
                and child.pid not in self.marked
            ):
                self.marked.add(child.pid)
                multiprocess.mark_process_dead(child.pid, self.dir)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.dir is not None:
            from ..admin.metrics import MULTIPROC_ENV

            os.environ.pop(MULTIPROC_ENV, None)
            shutil.rmtree(self.dir, ignore_errors=True)


def _kafka_options(command: Any) -> Any:
    command = click.option(
        "--kafka-file", "kafka_files", multiple=True, metavar="PATH",
        help="Kafka client options for ingestors and sinks, KEY=VALUE lines (secrets here)",
    )(command)  # fmt: skip
    return click.option(
        "--kafka", "kafka_options", multiple=True, metavar="KEY=VALUE",
        help="a Kafka client option (bootstrap.servers, SASL, TLS...; repeatable)",
    )(command)  # fmt: skip


def _use_kafka_options(options: tuple[str, ...], files: tuple[str, ...]) -> None:
    """Command-line Kafka options override the app's, here and in worker processes."""
    from ..kafka.settings import ENV, cli_overrides

    overrides = cli_overrides(options, files)
    if overrides:
        os.environ[ENV] = json.dumps(overrides)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--processes", "-p", default=1, show_default=True, help="worker processes")
@click.option("--processor", "processors", multiple=True, help="run only these (repeatable)")
@click.option("--node-index", type=int, help="static mode: this node's index (0-based)")
@click.option("--nodes", type=int, help="static mode: how many nodes share the segments")
@click.option("--progress/--no-progress", default=None, help="progress bars (default: on a tty)")
@click.option("--metrics-port", type=int, help="serve Prometheus metrics on this port (/metrics)")
@click.option("--grace", default=30.0, show_default=True,
              help="seconds SIGTERM waits for the batch in hand; then exit non-zero")  # fmt: skip
@click.option("--max-restarts", default=5, show_default=True,
              help="with --processes: replace workers that die, at most this often")  # fmt: skip
@click.option("--balance", is_flag=True,
              help="split/merge segments so the live nodes share them evenly")  # fmt: skip
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True)
@_spark_options
@click.option("--trigger", default=1.0, show_default=True, help="--engine spark: seconds per batch")
@_kafka_options
def run(
    app_spec: str,
    processes: int,
    processors: tuple[str, ...],
    node_index: int | None,
    nodes: int | None,
    progress: bool | None,
    metrics_port: int | None,
    grace: float,
    max_restarts: int,
    balance: bool,
    engine: str,
    master: str | None,
    conf: tuple[str, ...],
    py_files: str,
    archives: str,
    trigger: float,
    kafka_options: tuple[str, ...] = (),
    kafka_files: tuple[str, ...] = (),
) -> None:
    """Run the app's processors and Kafka ingestors until SIGINT/SIGTERM (then finish batches,
    store tokens, release claims). --engine spark keeps its aggregations up to date in
    micro-batches on Spark (the other processors need --engine local)."""
    # An orchestrator may stop a worker while it still starts (an autoscaler scaling in right
    # after scaling out): end at once, exit 0, instead of dying by the signal.
    signals.interrupt_startup()
    try:
        _run(app_spec, processes, processors, node_index, nodes, progress, metrics_port, grace,
             max_restarts, balance, engine, master, conf, py_files, archives, trigger,
             kafka_options, kafka_files)  # fmt: skip
    except signals.StartupInterrupted as exc:
        log.info("stopped by %s while starting", exc)


def _run(
    app_spec: str,
    processes: int,
    processors: tuple[str, ...],
    node_index: int | None,
    nodes: int | None,
    progress: bool | None,
    metrics_port: int | None,
    grace: float,
    max_restarts: int,
    balance: bool,
    engine: str,
    master: str | None,
    conf: tuple[str, ...],
    py_files: str,
    archives: str,
    trigger: float,
    kafka_options: tuple[str, ...],
    kafka_files: tuple[str, ...],
) -> None:
    _use_kafka_options(kafka_options, kafka_files)
    app = load_app(app_spec)
    configure_from_env()  # OTEL_TRACES_EXPORTER=...: unless the app module set up its own
    everything = list(processors) or [*app.processors, *app.ingestors]
    ingest = [n for n in everything if n in app.ingestors]
    names = [n for n in everything if n not in app.ingestors]
    for name in names:
        app.get(name)
    if ingest and engine == "local":
        app.check_ingestors(ingest)  # a broker that does not answer: one error line, now
    if engine == "spark":
        from ..spark.continuous import plan
        from ..spark.continuous import run as run_spark

        runs, skipped = plan(app, list(processors))
        console.print(
            f"spark: running {', '.join(runs)}"
            + (
                f"; not running {', '.join(skipped)} (not aggregations: use --engine local)"
                if skipped
                else ""
            )  # fmt: skip
        )
        run_spark(app, runs, master, trigger_seconds=trigger,
                  **_spark_kwargs(conf, py_files, archives))  # fmt: skip
        return
    if processes < 1:
        raise InvalidInputError("--processes must be >= 1")
    if grace <= 0 or max_restarts < 0:
        raise InvalidInputError("--grace must be > 0 seconds and --max-restarts >= 0")
    if processes > 1 and (node_index is not None or nodes is not None):
        raise InvalidInputError("static mode (--node-index/--nodes) runs one process per node")
    show = console.is_terminal if progress is None else progress
    options = click.get_current_context().find_root().obj or {}
    level, fmt = options.get("log_level", "info"), options.get("log_format", "text")
    # Log lines scroll above the bars: rich's handler on the bars' console.
    logsetup.setup(level, fmt, console if show else err_console)
    bars, tick = _progress(app, names) if show else (None, None)
    _start_lines(app, names)
    names = everything  # the runners (and metrics) take the ingestors too
    metrics = _Metrics(app, names, metrics_port, processes)
    if processes == 1:
        stop_ticking = threading.Event()

        def ready() -> None:  # called by app.run once every processor runs, never after a crash
            where = f", metrics on port {app.metrics_port}" if metrics_port is not None else ""
            log.info("ready: %d processor(s) running in process %d%s", len(names), os.getpid(),
                     where)  # fmt: skip

        def ticker() -> None:
            while not stop_ticking.wait(0.5):
                if tick is not None:
                    tick()

        thread = threading.Thread(target=ticker, daemon=True)
        if bars:
            bars.start()
        thread.start()
        try:
            app.run(names, node_index=node_index, nodes=nodes, metrics_port=metrics_port,
                    grace=grace, balance=balance, on_ready=ready)  # fmt: skip
        except (StopTimeoutError, ProcessorCrashedError) as exc:
            # A crash: processing stopped (the error is in status); a stuck handler: its thread
            # would block a normal exit. Both exit 1, as a worker process that died does.
            from rich.markup import escape

            if bars:
                bars.stop()
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            if isinstance(exc, ProcessorCrashedError):
                sys.exit(1)
            sys.stdout.flush()
            shutdown_tracing(1000)  # the spans of the batches that did finish
            os._exit(1)
        finally:
            stop_ticking.set()
            if bars:
                bars.stop()
            shutdown_tracing()
        return
    from .supervisor import Supervisor

    def all_ready() -> None:  # every worker's processors run, and none crashed before
        where = f", metrics on port {metrics.server.port}" if metrics.server else ""
        log.info("ready: %d worker process(es) started for %s%s", processes, ", ".join(names),
                 where)  # fmt: skip

    supervisor = Supervisor(
        app_spec, processes, names, max_restarts=max_restarts, grace=grace, log_level=level,
        balance=balance, on_ready=all_ready,
    )  # fmt: skip

    def supervise() -> None:
        metrics.reap(supervisor.children)
        if tick is not None:
            tick()

    if bars:
        bars.start()
    try:
        code = supervisor.run(supervise)
    finally:
        if bars:
            bars.stop()
        metrics.close()
    sys.exit(code)


def _age(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


@main.command()
@click.argument("args", nargs=-1, metavar="[MODULE:APP] [PROCESSOR]...")
@click.option("--processor", "processors", multiple=True, help="only these (repeatable)")
@click.option("--url", help="read this store's tables directly (no app module; read-only)")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON (see README)")
@click.option("--max-lag", help="unhealthy beyond this lag: events (1000) or a duration (30s)")
def status(
    args: tuple[str, ...],
    processors: tuple[str, ...],
    url: str | None,
    as_json: bool,
    max_lag: str | None,
) -> None:
    """Per processor and segment: position, head, lag, owner, claim age, caught up,
    replaying, errors. Exit code 0 when healthy, 1 when a segment has an error, a dead letter
    is parked or the lag exceeds --max-lag.

    \b
    eventlanes status shop:app [PROCESSOR]...
    eventlanes status --url sqlite:///shop.db [PROCESSOR]...
    """
    limit = parse_max_lag(max_lag) if max_lag is not None else MaxLag()
    if url is None:
        if not args:
            raise InvalidInputError("status needs MODULE:APP or --url URL")
        app = load_app(args[0])
        asked = list(args[1:] + processors)
        ingest = [n for n in asked or app.ingestors if n in app.ingestors]
        names = [n for n in asked if n not in app.ingestors] if asked else list(app.processors)
        for name in names:
            app.get(name)
        first_after = store_first_after(app.store)
        docs = [processor_document(app.status(n), first_after, limit) for n in names]
        ingest_docs = [kafka_status.document(app.ingest_status(n), limit.events) for n in ingest]
    else:
        inspector = ReadOnlyInspector(url)
        try:
            asked = list(args + processors)
            known = kafka_status.ingestor_names(inspector.db)
            ingest = [n for n in asked or known if n in known]
            names = [n for n in asked if n not in known] if asked else [
                n for n in inspector.processors() if n not in known]  # fmt: skip
            docs = [processor_document(inspector.view(n), inspector.first_after, limit)
                    for n in names]  # fmt: skip
            ingest_docs = [kafka_status.document(kafka_status.view(inspector.db, n), limit.events)
                           for n in ingest]  # fmt: skip
        finally:
            inspector.close()
    document = status_document(docs, limit, ingest_docs)
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        _print_status(document)
    sys.exit(0 if document["healthy"] else 1)


def _print_ingestors(document: dict[str, Any]) -> None:
    for ing in document.get("ingestors", ()):
        lag = ing["lag_records"]
        title = (
            f"{ing['name']} (Kafka topic {ing['topic']}): {len(ing['live_nodes'])} live node(s), "
            f"lag {'?' if lag is None else f'{lag:,}'} records"
            + (f", {ing['dead_letters']} record(s) parked" if ing["dead_letters"] else "")
        )
        table = Table(title=title)
        for col in ("partition", "position", "high watermark", "lag", "owner", "claim age",
                    "last error"):  # fmt: skip
            table.add_column(col, justify="right" if col in ("position", "lag") else "left")
        for p in ing["partitions"]:
            error = p["last_error"] or ""
            if p["errors"]:
                retry = _age(p["retry_in_seconds"]) or "now"
                error = f"[red]{p['errors']}x, retry in {retry}:[/red] {error}"
            high = p["high_watermark"]
            table.add_row(
                str(p["partition"]),
                f"{p['position']:,}",
                "?" if high is None else f"{high:,} ({_age(p['watermark_age_seconds'])} ago)",
                "?" if p["lag_records"] is None else f"{p['lag_records']:,}",
                p["owner"] or "-",
                _age(p["claim_age_seconds"]),
                error,
            )
        print_table(table)
        for problem in ing["problems"]:
            console.print(f"[red]unhealthy:[/red] {ing['name']}: {problem}", highlight=False)


def _version_note(p: dict[str, Any]) -> str:
    """`` (version 2 of orders: serving)`` for processors with versions (nothing otherwise)."""
    if p.get("version", 1) == 1 and p.get("serving", True):
        return ""
    if p["serving"]:
        how = "serving"
    elif p["behind_events"] is not None:
        how = f"not serving, {p['behind_events']:,} behind the serving version"
    else:
        how = "not serving"
    return f" (version {p['version']} of {p['base']}: {how})"


def _print_status(document: dict[str, Any]) -> None:
    _print_ingestors(document)
    for p in document["processors"]:
        readable = "" if p["readable_head"] == p["head"] else f" (readable {p['readable_head']:,})"
        title = (
            f"{p['name']}{_version_note(p)}: head {p['head']:,}{readable}, "
            f"{len(p['live_nodes'])} live node(s), "
            f"lag {p['lag_events']:,} events / {p['lag_seconds']:,.1f} s"
            + (f", {p['dead_letters']} dead letter(s)" if p["dead_letters"] else "")
        )
        table = Table(title=title)
        for col in ("segment", "position", "lag", "lag (s)", "owner", "claim age", "caught up",
                    "replaying", "last error"):  # fmt: skip
            table.add_column(
                col, justify="right" if col.startswith(("position", "lag")) else "left"
            )
        for s in p["segments"]:
            error = s["last_error"] or ""
            if s["errors"]:
                retry = _age(s["retry_in_seconds"]) or "now"
                error = f"[red]{s['errors']}x, retry in {retry}:[/red] {error}"
            table.add_row(
                s["segment"],
                f"{s['position']:,}",
                f"{s['lag_events']:,}",
                f"{s['lag_seconds']:,.1f}",
                s["owner"] or "-",
                _age(s["claim_age_seconds"]),
                "yes" if s["caught_up"] else "no",
                f"until {s['replay_until']:,}" if s["replaying"] else "no",
                error + (f" [{s['request']} requested]" if s["request"] else ""),
            )
        print_table(table)
        for problem in p["problems"]:
            console.print(f"[red]unhealthy:[/red] {p['name']}: {problem}", highlight=False)
        for note in p["notes"]:
            console.print(f"[yellow]note:[/yellow] {p['name']}: {note}", highlight=False)


def _steer(what: str) -> Any:
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.argument("processor")
    @click.argument("segment", type=int)
    @click.option(
        "--timeout", default=15.0, show_default=True, help="seconds to wait for the owner"
    )
    def command(app_spec: str, processor: str, segment: int, timeout: float) -> None:
        app = load_app(app_spec)
        console.print(getattr(app, what)(processor, segment, timeout=timeout))

    command.__doc__ = {
        "split": "Split a segment in two (the owner does it, or this command if unclaimed).",
        "merge": "Merge a segment with its sibling.",
        "release": "Ask the owner to release a segment so another node takes it.",
    }[what]
    return main.command(name=what)(command)


for _what in ("split", "merge", "release"):
    _steer(_what)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--to", "to", default="tail", show_default=True, help="tail, head, POSITION or TIME")
@click.option("--wait", is_flag=True, help="wait for running nodes to stop instead of refusing")
@click.option("--timeout", type=float, help="with --wait: give up after this many seconds")
@click.option("--yes", "-y", is_flag=True, help="reset without asking (for scripts)")
def reset(
    app_spec: str, processor: str, to: str, wait: bool, timeout: float | None, yes: bool
) -> None:
    """Reset a stopped processor: run its reset handlers and replay from --to (asks first)."""
    from rich.markup import escape

    app = load_app(app_spec)
    target = parse_reset_to(to)
    plan = app.reset_plan(processor, target)  # read only: nothing changes before the answer
    if plan.held and not wait:
        raise ProcessorBusyError(
            f"processor {processor!r} is running: {', '.join(plan.held)}. Stop it everywhere "
            "first or wait for it (--wait)"
        )
    if plan.held:
        console.print(f"{processor}: still running; counted as of now", highlight=False)
    console.print(plan.summary(), highlight=False)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError(
                f"reset of {processor} to position {plan.to:,} not confirmed: confirm with "
                "--yes (no terminal to ask on)"
            )
        click.confirm(f"Reset {processor} to position {plan.to:,}?", abort=True)
    position = app.reset(processor, target, wait=wait, timeout=timeout)
    if plan.replays:
        done = f"replays {plan.replays:,} event(s) from position {position:,} on the next run"
    else:
        done = f"nothing to replay; continues from position {position:,} on the next run"
    console.print(f"{processor}: reset; {done}", highlight=False)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option("--engine", type=click.Choice(["spark"]), default="spark", show_default=True)
@_spark_options
@click.option("--parquet", help="read a Parquet export (path or file://, hdfs://, s3a:// URI)")
@click.option("--partitions", type=int, help="Spark partitions (default: the parallelism)")
@click.option("--wait", is_flag=True, help="wait for running nodes to stop instead of refusing")
def replay(app_spec: str, names: tuple[str, ...], engine: str, master: str | None,
           conf: tuple[str, ...], py_files: str, archives: str, parquet: str | None,
           partitions: int | None, wait: bool) -> None:  # fmt: skip
    """Replay processors or aggregations from the start on Spark (one after the other, on one
    session); the live processor then continues from the replay's end position."""
    from ..spark import replay as spark_replay

    app = load_app(app_spec)
    configure_from_env()
    for name in names:
        app.get(name)
    spark = _spark_kwargs(conf, py_files, archives)
    for name in names:
        result = spark_replay(
            app, name, master=master, parquet=parquet, wait=wait, partitions=partitions, **spark
        )
        console.print(
            f"{name}: Spark read and replayed {result.events:,} events up to position "
            f"{result.end:,} in {result.seconds:.1f} s ({result.keys:,} states); every segment "
            "continues from there"
        )


@main.command()
@click.argument("url")
@click.option("--parquet", "directory", required=True,
              help="output directory: a path or a file://, hdfs://, s3a:// URI")  # fmt: skip
def export(url: str, directory: str) -> None:
    """Export a store's events to Parquet files (for Spark replays), with pyarrow (no Spark
    job: one reader of the store)."""
    from ..spark.export import export_parquet

    with open_store(url, create=False) as store:  # reads only: a typo creates no new store
        end = export_parquet(store, directory)
    console.print(f"exported positions 1..{end:,} to {directory}")


def _pause(what: str) -> Any:
    @click.argument("app_spec", metavar="MODULE:APP")
    @click.argument("processor")
    def command(app_spec: str, processor: str) -> None:
        app = load_app(app_spec)
        changed = getattr(app, what)(processor)
        past = "paused" if what == "pause" else "resumed"
        console.print(f"{processor}: {past}" if changed else f"{processor}: already {past}")

    command.__doc__ = {
        "pause": "Pause a processor on every node: segments released, not claimed until resumed.",
        "resume": "Resume a paused processor: nodes claim its segments again.",
    }[what]
    return main.command(name=what)(command)


for _what in ("pause", "resume"):
    _pause(_what)


@main.command(name="balance")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--timeout", default=15.0, show_default=True, help="seconds to wait per operation")
def balance_command(app_spec: str, processor: str, timeout: float) -> None:
    """Split or merge segments, one at a time, until the live nodes can share them evenly."""
    app = load_app(app_spec)
    done = app.balance(processor, timeout=timeout)
    for message in done:
        console.print(message)
    segments = app.status(processor).segments
    console.print(
        f"{processor}: balanced, {len(segments)} segment(s)" + ("" if done else " (nothing to do)")
    )


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("name", metavar="PROCESSOR@vN")
def promote(app_spec: str, name: str) -> None:
    """Switch readers of a processor to one of its versions (orders@v2; orders: version 1)
    once it has caught up: every segment at the head (read now), no failing segment, no
    parked dead letter, not paused. Refused, with every reason, before then."""
    app = load_app(app_spec)
    console.print(app.promote(name), highlight=False, soft_wrap=True)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("name", metavar="PROCESSOR[@vN]")
@click.option(
    "--keep-tables",
    is_flag=True,
    help="leave its tables (for their owner to drop: a role with DML only may not)",
)
@click.option("--yes", "-y", is_flag=True, help="retire without asking (for scripts)")
def retire(app_spec: str, name: str, keep_tables: bool, yes: bool) -> None:  # fmt: skip
    """Drop an old version of a processor for good (orders: version 1; orders@v2): its
    tokens, aggregation states, dead letters and tables (asks first). Refused while readers
    see it or it runs anywhere."""
    app = load_app(app_spec)
    plan = app.retire_plan(name, keep_tables=keep_tables)  # refused here: nothing asked
    console.print(plan.summary(), highlight=False, soft_wrap=True)
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError(
                f"retiring {name} would drop it for good; confirm with --yes (no terminal to "
                "ask on)"
            )
        click.confirm(f"Retire {name} for good? What it drops cannot be restored", abort=True)
    app.retire(name, keep_tables=keep_tables)
    console.print(f"{name}: retired", highlight=False)


@main.command(name="dead-letters")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--key", help="only the events of this sequence key")
@click.option("--position", type=int, help="only the event at this position")
@click.option("--retry", is_flag=True,
              help="re-run the parked events, in order per key (exit 1 if some stay)")  # fmt: skip
@click.option("--discard", is_flag=True, help="drop the parked events (asks first)")
@click.option("--yes", "-y", is_flag=True, help="--discard without asking")
def dead_letters(
    app_spec: str,
    processor: str,
    key: str | None,
    position: int | None,
    retry: bool,
    discard: bool,
    yes: bool,
) -> None:
    """List, retry or discard a processor's parked events (all, one key or one position)."""
    if retry and discard:
        raise InvalidInputError("use either --retry or --discard")
    app = load_app(app_spec)
    which = " and ".join(
        part for part in (f"key {key!r}" if key is not None else "",
                          f"position {position}" if position is not None else "") if part
    ) or "all keys"  # fmt: skip
    if retry:
        configure_from_env()
        handled, left = app.retry_dead_letters(processor, key=key, position=position)
        shutdown_tracing()
        console.print(f"{processor} ({which}): {handled} event(s) handled, {left} still parked")
        sys.exit(1 if left else 0)  # still parked: not done, whatever the count handled
    letters = app.dead_letter_list(processor, key=key, position=position)
    if discard:
        if not letters:
            console.print(f"{processor} ({which}): no dead letters to discard")
            return
        if not yes:
            if not sys.stdin.isatty():
                raise InvalidInputError(
                    f"--discard would drop {len(letters)} event(s) of {processor} ({which}) "
                    "for good; confirm with --yes (no terminal to ask on)"
                )
            click.confirm(
                f"Discard {len(letters)} parked event(s) of {processor} ({which}) for good? "
                "Their handlers will never run",
                abort=True,
            )
        count = app.discard_dead_letters(processor, key=key, position=position)
        console.print(f"{processor} ({which}): discarded {count} event(s)")
        return
    table = Table(title=f"{processor} ({which}): {len(letters)} dead letter(s)")
    for col in ("position", "key", "stream", "version", "type", "attempts", "error"):
        table.add_column(col)
    for d in letters:
        table.add_row(str(d.position), d.seq_key or "-", d.stream_id, str(d.version), d.type,
                      str(d.attempts), d.error)  # fmt: skip
    print_table(table)


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8321, show_default=True, help="port to listen on")
@click.option("--refresh", default=2.0, show_default=True,
              help="seconds between status polls (and page refreshes)")  # fmt: skip
@click.option("--max-lag", help="unhealthy beyond this lag, as for status: 1000 or 30s")
@click.option("--token-file", metavar="PATH",
              help="the operator token actions need (or $EVENTLANES_DASHBOARD_TOKEN; "
              "without one the dashboard is read-only)")  # fmt: skip
def dashboard(app_spec: str, host: str, port: int, refresh: float, max_lag: str | None,
              token_file: str | None) -> None:  # fmt: skip
    """A web page of processors, ingestors, segments and dead letters with their health,
    rates and lag history; actions (retry, discard, split, merge, release, reset, pause,
    resume, promote, retire) need the operator token. It does not run processors."""
    try:
        from ..dashboard import load_auth, serve
    except ImportError as exc:
        raise InvalidInputError(
            f"the dashboard needs starlette, jinja2 and uvicorn ({exc}): "
            "pip install 'eventlanes[ops]'"
        ) from None
    if not refresh >= 0.1:
        raise InvalidInputError(f"--refresh must be at least 0.1 seconds, got {refresh:g}")
    limit = parse_max_lag(max_lag) if max_lag is not None else MaxLag()
    auth = load_auth(token_file)
    app = load_app(app_spec)
    access = ("read-only (no token set)" if auth.read_only
              else f"actions need the token of {auth.source}")  # fmt: skip
    log.info("dashboard of %s on http://%s:%d/, %s", app_spec, host, port, access)
    serve(app, host, port, refresh, max_lag=limit, auth=auth, name=app_spec)

