"""A Spark job as a user submits it (the README's recipe; tests run it on a real cluster):

    spark-submit --master spark://HOST:7077 --py-files eventlanes.zip \\
        spark_job.py shop.app:app NAME [NAME...] [--parquet URI]

The session is the one spark-submit configured; eventlanes ships the app's own modules.
"""

from __future__ import annotations

import argparse

from pyspark.sql import SparkSession

from eventlanes import spark as els
from eventlanes.loader import load_app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("app")
    parser.add_argument("names", nargs="+")
    parser.add_argument("--parquet", help="replay a Parquet export (path or URI)")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("eventlanes-replay").getOrCreate()
    app = load_app(args.app)
    for name in args.names:
        result = els.replay(app, name, spark=spark, parquet=args.parquet)
        print(f"{name}: read {result.events} events up to {result.end}")
    spark.stop()


if __name__ == "__main__":
    main()
