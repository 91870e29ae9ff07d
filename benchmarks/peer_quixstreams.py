"""The quixstreams side of ``benchmarks/bench_peers.py``: run by the Python of a virtualenv
of its own (quixstreams pins an older confluent-kafka than eventlanes), never imported by
eventlanes. Counts a topic's records per key per tumbling minute of the record timestamps
(``.final()``: each window once, when the partition's time passes its end plus the grace),
stops once no record came for ``--idle`` seconds, and writes the windows and its timings as
JSON: ``{"read", "seconds", "windows": [[key, start_ms, end_ms, count], ...]}``. ``seconds``:
from ``run()`` to the last input record folded (``first``: to the first)."""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from quixstreams import Application


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--topic", "--state-dir", "--out", "--guarantee"):
        parser.add_argument(name, required=True)
    parser.add_argument("--idle", type=float, default=5.0)
    args = parser.parse_args()
    app = Application(
        broker_address=args.bootstrap, consumer_group=f"bench-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest", state_dir=args.state_dir,
        processing_guarantee=args.guarantee, loglevel="WARNING",
    )  # fmt: skip
    seen = {"read": 0, "first": 0.0, "last": 0.0}
    windows: list[list[Any]] = []

    def mark(value: Any) -> None:
        seen["read"] += 1
        seen["last"] = time.monotonic()
        seen["first"] = seen["first"] or seen["last"]

    def keep(value: dict[str, Any], key: Any, timestamp: int, headers: Any) -> None:
        windows.append([key.decode(), value["start"], value["end"], value["value"]])

    sdf = app.dataframe(app.topic(args.topic, value_deserializer="json"))
    sdf = sdf.update(mark)
    sdf = sdf.tumbling_window(60_000).count().final()
    sdf.update(keep, metadata=True)
    started = time.monotonic()
    app.run(timeout=args.idle)
    with open(args.out, "w") as out:
        json.dump({"read": seen["read"], "seconds": seen["last"] - started,
                   "first": seen["first"] - started, "windows": windows}, out)  # fmt: skip


if __name__ == "__main__":
    main()
