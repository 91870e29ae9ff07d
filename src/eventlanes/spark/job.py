"""The Spark job eventlanes ships, for ``spark-submit``: a bulk replay of processors of an app.

::

    JOB="$(python -m eventlanes.spark.job --print-path)"
    spark-submit --master spark://HOST:7077 --py-files eventlanes.zip \\
        "$JOB" shop:app revenue [NAME...] [--parquet URI]

The session is the one ``spark-submit`` configured (``getOrCreate``); eventlanes ships the app's
own modules to the executors itself. Prints one line per processor replayed and exits non-zero
with the error when a replay fails (nothing written then).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class _PrintPath(argparse.Action):
    def __call__(
        self, parser: Any, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        print(__file__)
        parser.exit()


def main(argv: Sequence[str] | None = None) -> None:
    """Replay each named processor of the app (``module:app`` or ``path/file.py:app``)."""
    parser = argparse.ArgumentParser(
        prog="eventlanes.spark.job", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--print-path", nargs=0, action=_PrintPath,
        help="print this file's path (spark-submit's job argument) and exit",
    )  # fmt: skip
    parser.add_argument("app", help="the app: module:app or path/to/file.py:app")
    parser.add_argument("names", nargs="+", help="processors to replay")
    parser.add_argument("--parquet", help="replay a Parquet export (path or URI)")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    # absolute: spark-submit runs this file as a script, outside its package
    from eventlanes import spark as els
    from eventlanes.loader import load_app

    spark = SparkSession.builder.appName("eventlanes-replay").getOrCreate()
    try:
        app = load_app(args.app)
        for name in args.names:
            result = els.replay(app, name, spark=spark, parquet=args.parquet)
            print(f"{name}: read {result.events} events up to {result.end}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
