"""Run the eventlanes benchmarks: ``python benchmarks/run.py [store ...] [--quick]``.

Each benchmark prints a table. PostgreSQL runs on $EVENTLANES_TEST_POSTGRES_URL or on an
embedded server started for the run (fsync on).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BENCHMARKS = {
    "store": "benchmarks.bench_store",
    "tokens": "benchmarks.bench_tokens",
    "processors": "benchmarks.bench_processors",
    "latency": "benchmarks.bench_latency",
    "acks": "benchmarks.bench_acks",
    "metrics": "benchmarks.bench_metrics",
    "spark": "benchmarks.bench_spark",
    "aggregation": "benchmarks.bench_aggregation",
    "types": "benchmarks.bench_types",
    "postgres": "benchmarks.bench_postgres",
    "projection": "benchmarks.bench_projection",
    "kafka": "benchmarks.bench_kafka",
    "memory": "benchmarks.bench_memory",
    "rebuild": "benchmarks.bench_rebuild",
    "tracing": "benchmarks.bench_tracing",
    "upcast": "benchmarks.bench_upcast",
    "scale": "benchmarks.bench_scale",
    "segments": "benchmarks.bench_segments",
    "spark-keys": "benchmarks.bench_spark_keys",
    "windows": "benchmarks.bench_windows",
    "peers": "benchmarks.bench_peers",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "names", nargs="*", choices=[*BENCHMARKS, []], help="benchmarks to run (default: all)"
    )
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    backends = args.backend or ["sqlite", "postgres"]
    for name in args.names or list(BENCHMARKS):
        importlib.import_module(BENCHMARKS[name]).run(backends, quick=args.quick)


if __name__ == "__main__":
    main()
