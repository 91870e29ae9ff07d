"""``replay`` and ``export``: processors and aggregations replayed on Spark, a store's
events exported to Parquet for it."""

from __future__ import annotations

import click

from ..loader import load_app
from ..store import open_store
from ..tracing import configure_from_env
from .base import console, main, spark_kwargs, spark_options


@main.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option("--engine", type=click.Choice(["spark"]), default="spark", show_default=True)
@spark_options
@click.option("--parquet", help="read a Parquet export (path or file://, hdfs://, s3a:// URI)")
@click.option("--partitions", type=int, help="Spark partitions (default: the parallelism)")
@click.option("--wait", is_flag=True, help="wait for running nodes to stop instead of refusing")
@click.option(
    "--delta",
    metavar="URI",
    help="also write the aggregation's states to this Delta "
    "table (a path or s3://, abfss://, gs:// URI), the position in its commit",
)
@click.option(
    "--delta-option",
    "delta_options",
    multiple=True,
    metavar="K=V",
    help="a deltalake storage option (repeatable); credentials are better left to "
    "the environment (AWS_*, AZURE_STORAGE_*, GOOGLE_*)",
)
def replay(app_spec: str, names: tuple[str, ...], engine: str, master: str | None,
           remote: str | None, conf: tuple[str, ...], py_files: str, archives: str,
           parquet: str | None, partitions: int | None, wait: bool, delta: str | None,
           delta_options: tuple[str, ...]) -> None:  # fmt: skip
    """Replay processors or aggregations from the start on Spark (one after the other, on one
    session); the live processor then continues from the replay's end position."""
    from ..errors import InvalidInputError
    from ..spark import replay as spark_replay
    from ..spark.session import parse_conf

    app = load_app(app_spec)
    configure_from_env()
    for name in names:
        app.get(name)
    if delta and len(names) > 1:
        raise InvalidInputError("--delta names one table: replay one aggregation with it")
    options = parse_conf(delta_options, "--delta-option")
    spark = spark_kwargs(conf, py_files, archives, remote)
    for name in names:
        result = spark_replay(
            app, name, master=master, parquet=parquet, wait=wait, partitions=partitions,
            delta=delta, delta_options=options, **spark,
        )  # fmt: skip
        wrote = f"; written to the Delta table {delta}" if delta else ""
        console.print(
            f"{name}: Spark read and replayed {result.events:,} events up to position "
            f"{result.end:,} in {result.seconds:.1f} s ({result.keys:,} states{wrote}); every "
            "segment continues from there"
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
