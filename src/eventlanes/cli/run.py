"""``run``: the app's processors and ingestors in this process, in ``--processes`` worker
processes under a supervisor, or its aggregations on Spark (``--engine spark``); with progress
bars on a terminal and Prometheus metrics (summed over the workers) on request."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from .. import signals
from ..admin.health import lag_seconds, store_first_after
from ..errors import InvalidInputError, ProcessorCrashedError, StopTimeoutError
from ..loader import load_app
from ..node import DEFAULT_METRICS_HOST, serve_metrics
from ..tracing import configure_from_env
from ..tracing import shutdown as shutdown_tracing
from . import logs as logsetup
from .base import console, err_console, log, main, spark_kwargs, spark_options

if TYPE_CHECKING:
    from ..app import App

Tick = Callable[[], None]


@dataclass(frozen=True)
class RunOptions:
    """The options of ``run``, as click parses them (one list, read by every step)."""

    app_spec: str
    processes: int
    processors: tuple[str, ...]
    node_index: int | None
    nodes: int | None
    progress: bool | None
    metrics_port: int | None
    grace: float
    max_restarts: int
    balance: bool
    engine: str
    master: str | None
    remote: str | None
    conf: tuple[str, ...]
    py_files: str
    archives: str
    trigger: float
    kafka_options: tuple[str, ...] = ()
    kafka_files: tuple[str, ...] = ()
    metrics_host: str = DEFAULT_METRICS_HOST
    delta: tuple[str, ...] = ()
    delta_options: tuple[str, ...] = ()


def _kafka_options(command: Any) -> Any:
    command = click.option(
        "--kafka-file", "kafka_files", multiple=True, metavar="PATH",
        help="Kafka client options for ingestors and sinks, KEY=VALUE lines (secrets here)",
    )(command)  # fmt: skip
    return click.option(
        "--kafka", "kafka_options", multiple=True, metavar="KEY=VALUE",
        help="a Kafka client option (bootstrap.servers, SASL, TLS...; repeatable)",
    )(command)  # fmt: skip


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--processes", "-p", default=1, show_default=True, help="worker processes")
@click.option("--processor", "processors", multiple=True, help="run only these (repeatable)")
@click.option("--node-index", type=int, help="static mode: this node's index (0-based)")
@click.option("--nodes", type=int, help="static mode: how many nodes share the segments")
@click.option("--progress/--no-progress", default=None, help="progress bars (default: on a tty)")
@click.option("--metrics-port", type=int, help="serve Prometheus metrics on this port (/metrics)")
@click.option("--metrics-host", default=DEFAULT_METRICS_HOST, show_default=True,
              help="the address metrics listen on (127.0.0.1: this host only)")  # fmt: skip
@click.option("--grace", default=30.0, show_default=True,
              help="seconds SIGTERM waits for the batch in hand; then exit non-zero")  # fmt: skip
@click.option("--max-restarts", default=5, show_default=True,
              help="with --processes: replace workers that die, at most this often")  # fmt: skip
@click.option("--balance", is_flag=True,
              help="split/merge segments so the live nodes share them evenly")  # fmt: skip
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True)
@spark_options
@click.option("--trigger", default=1.0, show_default=True, help="--engine spark: seconds per batch")
@click.option("--delta", multiple=True, metavar="NAME=URI",
              help="--engine spark: keep aggregation NAME's Delta table at URI current "
              "(written by `replay NAME --delta URI` first; repeatable)")  # fmt: skip
@click.option("--delta-option", "delta_options", multiple=True, metavar="K=V",
              help="a deltalake storage option (repeatable)")  # fmt: skip
@_kafka_options
def run(**options: Any) -> None:
    """Run the app's processors and Kafka ingestors until SIGINT/SIGTERM (then finish batches,
    store tokens, release claims). --engine spark keeps its aggregations up to date in
    micro-batches on Spark (the other processors need --engine local)."""
    # An orchestrator may stop a worker while it still starts (an autoscaler scaling in right
    # after scaling out): end at once, exit 0, instead of dying by the signal.
    signals.interrupt_startup()
    try:
        _run(RunOptions(**options))
    except signals.StartupInterrupted as exc:
        log.info("stopped by %s while starting", exc)
    finally:
        signals.startup_done()  # also after an early error: the handlers from before are back


def _run(o: RunOptions) -> None:
    _use_kafka_options(o.kafka_options, o.kafka_files)
    app = load_app(o.app_spec)
    configure_from_env()  # OTEL_TRACES_EXPORTER=...: unless the app module set up its own
    everything = list(o.processors) or [*app.processors, *app.ingestors]
    ingest = [n for n in everything if n in app.ingestors]
    names = [n for n in everything if n not in app.ingestors]
    for name in names:
        app.get(name)
    if ingest and o.engine == "local":
        app.check_ingestors(ingest)  # a broker that does not answer: one error line, now
    _check_engine(o)
    if o.engine == "spark":
        _run_spark(app, o)
        return
    _check(o)
    show = console.is_terminal if o.progress is None else o.progress
    level = _log_setup(show)
    bars, tick = _progress(app, names) if show else (None, None)
    _start_lines(app, names)
    # the runners (and metrics) take the ingestors too
    metrics = _Metrics(app, everything, o)
    if o.processes == 1:
        _run_here(app, everything, o, bars, tick)
    else:
        _supervise(o, everything, level, metrics, bars, tick)


def _use_kafka_options(options: tuple[str, ...], files: tuple[str, ...]) -> None:
    """Command-line Kafka options override the app's, here and in worker processes (handed
    to them by the supervisor: secrets stay out of the environment)."""
    from ..kafka.settings import cli_overrides, use_overrides

    use_overrides(cli_overrides(options, files))


def _run_spark(app: App, o: RunOptions) -> None:
    """``--engine spark``: the aggregations asked for (or all), in micro-batches."""
    from ..spark.continuous import plan
    from ..spark.continuous import run as run_spark
    from ..spark.session import parse_conf

    tables = parse_conf(o.delta, "--delta")
    if named := [n for n in o.processors if n in app.ingestors]:
        raise InvalidInputError(f"{', '.join(map(repr, named))}: ingestors run with "
                                "--engine local")  # fmt: skip
    runs, skipped = plan(app, list(o.processors))
    if not o.processors:  # said, as the processors it does not run are
        skipped += [f"ingestor {name}" for name in app.ingestors]
    if unknown := sorted(set(tables) - set(runs)):
        raise InvalidInputError(f"--delta names {', '.join(map(repr, unknown))}, which this "
                                "run does not fold on Spark")  # fmt: skip
    console.print(
        f"spark: running {', '.join(runs)}"
        + (
            f"; not running {', '.join(skipped)} (not aggregations: --engine local runs them)"
            if skipped
            else ""
        )  # fmt: skip
    )
    run_spark(app, runs, o.master, trigger_seconds=o.trigger, delta=tables,
              delta_options=parse_conf(o.delta_options, "--delta-option"),
              **spark_kwargs(o.conf, o.py_files, o.archives, o.remote))  # fmt: skip


def _check_engine(o: RunOptions) -> None:
    """Options of the other engine, refused before anything starts (each was dropped)."""
    local = {"--processes": o.processes != 1, "--node-index": o.node_index is not None,
             "--nodes": o.nodes is not None, "--progress": o.progress is not None,
             "--metrics-port": o.metrics_port is not None,
             "--metrics-host": o.metrics_host != DEFAULT_METRICS_HOST,
             "--grace": o.grace != 30.0, "--max-restarts": o.max_restarts != 5,
             "--balance": o.balance}  # fmt: skip
    spark = {"--master": o.master is not None, "--remote": o.remote is not None,
             "--conf": bool(o.conf), "--py-files": bool(o.py_files),
             "--archives": bool(o.archives), "--trigger": o.trigger != 1.0,
             "--delta": bool(o.delta), "--delta-option": bool(o.delta_options)}  # fmt: skip
    if o.engine == "spark":
        if given := [name for name, on in local.items() if on]:
            raise InvalidInputError(
                f"{', '.join(given)} {'are' if len(given) > 1 else 'is'} the local engine's "
                f"option{'s' if len(given) > 1 else ''}: --engine spark runs micro-batches "
                "(their progress: eventlanes status)"
            )
        if o.delta_options and not o.delta:
            raise InvalidInputError("--delta-option without --delta")
    elif given := [name for name, on in spark.items() if on]:
        raise InvalidInputError(
            f"{', '.join(given)} {'are' if len(given) > 1 else 'is'} --engine spark's "
            f"option{'s' if len(given) > 1 else ''} (this run is --engine local)"
        )


def _check(o: RunOptions) -> None:
    """The local engine's options, refused before anything starts."""
    if o.processes < 1:
        raise InvalidInputError("--processes must be >= 1")
    if o.grace <= 0 or o.max_restarts < 0:
        raise InvalidInputError("--grace must be > 0 seconds and --max-restarts >= 0")
    if o.processes > 1 and (o.node_index is not None or o.nodes is not None):
        raise InvalidInputError("static mode (--node-index/--nodes) runs one process per node")


def _log_setup(show: bool) -> str:
    """Log lines scroll above the bars: rich's handler on the bars' console. Returns the log
    level (the workers' too)."""
    options = click.get_current_context().find_root().obj or {}
    level, fmt = options.get("log_level", "info"), options.get("log_format", "text")
    logsetup.setup(level, fmt, console if show else err_console)
    return str(level)


class _RateColumn(ProgressColumn):
    """Events per second, from rich's moving estimate of the position's speed."""

    def render(self, task: Any) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f} ev/s", style="progress.data.speed")


def _progress(app: App, names: list[str]) -> tuple[Progress, Tick]:
    """One bar per processor, and ``tick``, which reads their status and moves the bars."""
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


def _start_lines(app: App, names: list[str]) -> None:
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

    def __init__(self, app: App, names: list[str], o: RunOptions) -> None:
        self.port = o.metrics_port
        self.dir: str | None = None
        self.server: Any = None
        self.marked: set[int] = set()
        if o.metrics_port is None or o.processes == 1:
            return
        self.dir = tempfile.mkdtemp(prefix="eventlanes-metrics-")
        # Set before prometheus-client is imported here (it picks its value store at import),
        # and inherited by the spawned workers.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.dir
        from ..admin.metrics import MetricsServer, registry_for

        registry = registry_for(app, None, names)
        try:
            self.server = serve_metrics(lambda p, h: MetricsServer(registry, p, h),
                                        o.metrics_port, o.metrics_host)  # fmt: skip
        except InvalidInputError:
            self.close()
            raise

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


def _run_here(
    app: App, names: list[str], o: RunOptions, bars: Progress | None, tick: Tick | None
) -> None:
    """One process: the app runs here until a signal; the bars move in a thread."""
    stop_ticking = threading.Event()

    def ready() -> None:  # called by app.run once every processor runs, never after a crash
        where = (f", metrics on {o.metrics_host}:{app.metrics_port}"
                 if o.metrics_port is not None else "")  # fmt: skip
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
        app.run(names, node_index=o.node_index, nodes=o.nodes, metrics_port=o.metrics_port,
                metrics_host=o.metrics_host, grace=o.grace, balance=o.balance,
                on_ready=ready)  # fmt: skip
    except (StopTimeoutError, ProcessorCrashedError) as exc:
        _stopped_by(exc, bars)
    finally:
        stop_ticking.set()
        if bars:
            bars.stop()
        shutdown_tracing()


def _stopped_by(exc: StopTimeoutError | ProcessorCrashedError, bars: Progress | None) -> NoReturn:
    """A crash: processing stopped (the error is in status); a stuck handler: its thread would
    block a normal exit. Both exit 1, as a worker process that died does."""
    from rich.markup import escape

    if bars:
        bars.stop()
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    if isinstance(exc, ProcessorCrashedError):
        sys.exit(1)
    sys.stdout.flush()
    shutdown_tracing(1000)  # the spans of the batches that did finish
    os._exit(1)


def _supervise(
    o: RunOptions,
    names: list[str],
    level: str,
    metrics: _Metrics,
    bars: Progress | None,
    tick: Tick | None,
) -> NoReturn:
    """``--processes N``: a supervisor starts the workers and replaces those that die; this
    process moves the bars and serves the workers' summed metrics. Exits with its code."""
    from .supervisor import Supervisor

    def all_ready() -> None:  # every worker's processors run, and none crashed before
        where = (f", metrics on {o.metrics_host}:{metrics.server.port}"
                 if metrics.server else "")  # fmt: skip
        log.info("ready: %d worker process(es) started for %s%s", o.processes, ", ".join(names),
                 where)  # fmt: skip

    supervisor = Supervisor(
        o.app_spec, o.processes, names, max_restarts=o.max_restarts, grace=o.grace,
        log_level=level, balance=o.balance, on_ready=all_ready,
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
