"""The ``eventlanes`` command line: run, inspect and steer processors."""

from __future__ import annotations

import sys
import threading
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .errors import EventlanesError, InvalidInputError
from .loader import load_app
from .store import open_store

console = Console()


def _is_spark_failure(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("pyspark", "py4j")


class _Group(click.Group):
    """Turns eventlanes errors (and Spark's) into one clear line and exit code 2, not a
    traceback; ``--debug`` shows the full trace."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if ctx.params.get("debug") or not (
                isinstance(exc, EventlanesError) or _is_spark_failure(exc)
            ):
                raise
            message = str(exc)
            if _is_spark_failure(exc):
                from .spark.ship import first_line

                message = f"Spark failed: {first_line(exc)}"
            from rich.markup import escape

            console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="eventlanes")
@click.option("--debug", is_flag=True, help="show full tracebacks of errors")
def main(debug: bool) -> None:
    """Parallel, per-key ordered, resumable, exactly-once event processing."""


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
    from .spark.session import parse_conf

    return {
        "conf": parse_conf(conf),
        "py_files": [p for p in py_files.split(",") if p],
        "archives": [a for a in archives.split(",") if a],
    }


@main.command()
@click.argument("url")
def info(url: str) -> None:
    """Show an event store's size and head position."""
    with open_store(url) as store:
        table = Table(title=f"event store {store.db.url.redacted}")
        table.add_column("backend")
        table.add_column("events", justify="right")
        table.add_column("head position", justify="right")
        table.add_row(store.db.backend, f"{store.count():,}", f"{store.head():,}")
        console.print(table)


def _progress(app: Any, names: list[str]) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks = {n: progress.add_task(n, total=1, detail="") for n in names}

    def tick() -> None:
        for name, task in tasks.items():
            view = app.status(name)
            owners = len({s.owner for s in view.segments if s.owner})
            errors = sum(1 for s in view.segments if s.last_error)
            detail = f"{owners} node(s)" + (f", [red]{errors} failing[/red]" if errors else "")
            progress.update(task, completed=view.position, total=max(1, view.head), detail=detail)

    return progress, tick


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--processes", "-p", default=1, show_default=True, help="worker processes")
@click.option("--processor", "processors", multiple=True, help="run only these (repeatable)")
@click.option("--node-index", type=int, help="static mode: this node's index (0-based)")
@click.option("--nodes", type=int, help="static mode: how many nodes share the segments")
@click.option("--progress/--no-progress", default=None, help="progress bars (default: on a tty)")
@click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True)
@_spark_options
@click.option("--checkpoint", default="eventlanes-checkpoints", show_default=True,
              help="--engine spark: unused (progress lives in the token store)")  # fmt: skip
@click.option("--trigger", default=1.0, show_default=True, help="--engine spark: seconds per batch")
def run(
    app_spec: str,
    processes: int,
    processors: tuple[str, ...],
    node_index: int | None,
    nodes: int | None,
    progress: bool | None,
    engine: str,
    master: str | None,
    conf: tuple[str, ...],
    py_files: str,
    archives: str,
    checkpoint: str,
    trigger: float,
) -> None:
    """Run the app's processors until SIGINT/SIGTERM (then finish batches, store tokens,
    release claims). --engine spark runs its aggregations as Spark streaming queries."""
    app = load_app(app_spec)
    names = list(processors) or list(app.processors)
    for name in names:
        app.get(name)
    if engine == "spark":
        from .spark.continuous import plan
        from .spark.continuous import run as run_spark

        runs, skipped = plan(app, list(processors))
        console.print(
            f"spark: running {', '.join(runs)}"
            + (
                f"; not running {', '.join(skipped)} (not aggregations: use --engine local)"
                if skipped
                else ""
            )  # fmt: skip
        )
        run_spark(app, runs, checkpoint, master, trigger_seconds=trigger,
                  **_spark_kwargs(conf, py_files, archives))  # fmt: skip
        return
    if processes < 1:
        raise InvalidInputError("--processes must be >= 1")
    if processes > 1 and (node_index is not None or nodes is not None):
        raise InvalidInputError("static mode (--node-index/--nodes) runs one process per node")
    show = console.is_terminal if progress is None else progress
    bars, tick = _progress(app, names) if show else (None, None)
    if processes == 1:
        stop_ticking = threading.Event()

        def ticker() -> None:
            while not stop_ticking.wait(0.5):
                tick()  # type: ignore[misc]

        thread = threading.Thread(target=ticker, daemon=True) if bars else None
        if bars:
            bars.start()
            thread.start()  # type: ignore[union-attr]
        try:
            app.run(names, node_index=node_index, nodes=nodes)
        finally:
            stop_ticking.set()
            if bars:
                bars.stop()
        return
    from .supervisor import Supervisor

    supervisor = Supervisor(app_spec, processes, names)
    if bars:
        bars.start()
    try:
        code = supervisor.run(tick)
    finally:
        if bars:
            bars.stop()
    sys.exit(code)


def _age(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f} s"


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--processor", "processors", multiple=True, help="only these (repeatable)")
def status(app_spec: str, processors: tuple[str, ...]) -> None:
    """Per processor and segment: position, head, lag, owner, claim age, caught up,
    replaying, errors."""
    app = load_app(app_spec)
    for name in processors or app.processors:
        view = app.status(name)
        table = Table(
            title=f"{name}: head {view.head:,}, {len(view.live_nodes)} live node(s)"
            + (f", {view.dead_letters} dead letter(s)" if view.dead_letters else "")
        )
        for col in ("segment", "position", "lag", "owner", "claim age", "caught up",
                    "replaying", "last error"):  # fmt: skip
            table.add_column(col, justify="right" if col in ("position", "lag") else "left")
        for s in view.segments:
            error = s.last_error or ""
            if s.errors:
                error = f"[red]{s.errors}x, retry in {_age(s.retry_in) or 'now'}:[/red] {error}"
            table.add_row(
                str(s.segment),
                f"{s.position:,}",
                f"{s.lag:,}",
                s.owner or "-",
                _age(s.claim_age),
                "yes" if s.caught_up else "no",
                f"until {s.token.replay_until:,}" if s.replaying else "no",
                error[:80] + (f" [{s.request} requested]" if s.request else ""),
            )
        console.print(table)


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


def _parse_to(value: str) -> str | int | datetime:
    if value in ("tail", "head"):
        return value
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"invalid --to {value!r}: use tail, head, a position or an ISO time"
        ) from None
    if when.tzinfo is None:
        raise InvalidInputError(f"--to {value!r} needs a timezone (e.g. 2026-01-01T00:00+00:00)")
    return when


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--to", "to", default="tail", show_default=True, help="tail, head, POSITION or TIME")
@click.option("--wait", is_flag=True, help="wait for running nodes to stop instead of refusing")
@click.option("--timeout", type=float, help="with --wait: give up after this many seconds")
def reset(app_spec: str, processor: str, to: str, wait: bool, timeout: float | None) -> None:
    """Reset a stopped processor: run its reset handlers and replay from --to."""
    app = load_app(app_spec)
    position = app.reset(processor, _parse_to(to), wait=wait, timeout=timeout)
    console.print(f"{processor}: reset; replays from position {position:,} on the next run")


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
    from .spark import replay as spark_replay

    app = load_app(app_spec)
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
    from .spark.export import export_parquet

    with open_store(url) as store:
        end = export_parquet(store, directory)
    console.print(f"exported positions 1..{end:,} to {directory}")


@main.command(name="dead-letters")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("processor")
@click.option("--retry", is_flag=True, help="re-process the parked events, in order per key")
@click.option("--discard", is_flag=True, help="drop the parked events")
def dead_letters(app_spec: str, processor: str, retry: bool, discard: bool) -> None:
    """List, retry or discard a processor's parked events."""
    if retry and discard:
        raise InvalidInputError("use either --retry or --discard")
    app = load_app(app_spec)
    if retry:
        handled, left = app.retry_dead_letters(processor)
        console.print(f"{processor}: {handled} event(s) handled, {left} still parked")
        return
    if discard:
        console.print(f"{processor}: discarded {app.discard_dead_letters(processor)} event(s)")
        return
    letters = app.dead_letter_list(processor)
    table = Table(title=f"{processor}: {len(letters)} dead letter(s)")
    for col in ("position", "key", "stream", "version", "type", "attempts", "error"):
        table.add_column(col)
    for d in letters:
        table.add_row(str(d.position), d.seq_key or "-", d.stream_id, str(d.version), d.type,
                      str(d.attempts), d.error[:80])  # fmt: skip
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    main()
