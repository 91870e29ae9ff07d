"""The seed pipeline through Kafka (examples/kafka_screws.py, also `make demo`): readings
produced to a topic, ingested, normalised, summed per robot and per factory with workers
killed mid-way, totals published; the output topics' last values equal a plain fold of the
input topic, and what crashes published twice is counted and dropped downstream."""

from __future__ import annotations

import importlib
import json

from tests.kafka_helpers import create_topic


def test_screw_pipeline_through_kafka_with_crashes(tmp_path, kafka_broker, monkeypatch) -> None:
    b = kafka_broker.bootstrap
    topics = {"READINGS": create_topic(b, 4), "ROBOTS": create_topic(b, 2),
              "FACTORIES": create_topic(b, 1)}  # fmt: skip
    for name, topic in topics.items():
        monkeypatch.setenv(f"EVENTLANES_KAFKA_DEMO_{name}", topic)
    monkeypatch.setenv("EVENTLANES_KAFKA_DEMO_URL", f"sqlite:///{tmp_path}/pipeline.db")
    monkeypatch.setenv("EVENTLANES_KAFKA_DEMO_BOOTSTRAP", b)
    monkeypatch.setenv("EVENTLANES_KAFKA_DEMO_CRASH_DIR", str(tmp_path))
    import examples.kafka_screws as ks

    ks = importlib.reload(ks)  # its app reads the environment when imported
    try:
        ks.produce_readings(b, topics["READINGS"], 1500, seed=1)
        killed = ks.run_pipeline(1500, kill_at=(0.3, 0.6))
        assert len(killed) == 2
        # the crash window: robot totals acknowledged, not committed, published again
        ks.produce_readings(b, topics["READINGS"], 30, seed=2)
        ks.run_pipeline(1530, only=["readings-in", "normalise"])
        monkeypatch.setenv("EVENTLANES_KAFKA_DEMO_CRASH_AFTER", "1")
        ks = importlib.reload(ks)
        ks.run_pipeline(1530)
        assert ks.crashes() == 2
        reference = ks.plain_fold(ks.read_topic(b, topics["READINGS"]))
        assert {r: ks.robots.get(r) for r in reference["robots"]} == reference["robots"]
        assert {f: ks.factories.get(f) for f in reference["factories"]} == reference["factories"]
        out = {k: ks.read_topic(b, topics[k]) for k in ("ROBOTS", "FACTORIES")}
        last = {k: {m.key().decode(): json.loads(m.value()) for m in recs}
                for k, recs in out.items()}  # fmt: skip
        assert last == {"ROBOTS": reference["robots"], "FACTORIES": reference["factories"]}
        doubled = sum(ks.duplicates(recs) for recs in out.values())
        assert doubled > 0
        totals, dropped = ks.downstream(f"sqlite:///{tmp_path}/downstream.db", b)
        assert totals == reference
        assert dropped == doubled
    finally:
        ks.app.close()
