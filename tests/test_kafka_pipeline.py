"""The seed pipeline through Kafka (examples/kafka_screws.py, also `make demo`): readings
produced to a topic, ingested, normalised, summed per robot and per factory, and ok/failed
counted per robot per minute of the readings' own time, with workers killed mid-way; totals
and closed minutes published. The output topics' last values equal a plain fold of the input
topic, every minute once; what crashes published twice is counted and dropped downstream."""

from __future__ import annotations

import importlib
import json
from collections import defaultdict

import eventlanes as el
from tests.kafka_helpers import create_topic


def test_screw_pipeline_through_kafka_with_crashes(tmp_path, kafka_broker, monkeypatch) -> None:
    b = kafka_broker.bootstrap
    topics = {"READINGS": create_topic(b, 4), "ROBOTS": create_topic(b, 2),
              "FACTORIES": create_topic(b, 1), "MINUTES": create_topic(b, 2)}  # fmt: skip
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
        opened = [w for r in map(str, range(6)) for w in ks.minutes.windows(r)]
        assert opened and not any(w.final for w in opened)  # within the lateness: all open
        # the closer, alone in the log: every minute so far closes when it is folded
        ks.produce_closer(b, topics["READINGS"])
        ks.run_pipeline(1501, only=["readings-in", "normalise"])
        # readings late for the closed minutes; the crash window: totals and closed minutes
        # acknowledged by the broker, not committed, published again
        ks.produce_readings(b, topics["READINGS"], 30, seed=2)
        ks.run_pipeline(1531, only=["readings-in", "normalise"])
        monkeypatch.setenv("EVENTLANES_KAFKA_DEMO_CRASH_AFTER", "1")
        ks = importlib.reload(ks)
        ks.run_pipeline(1531)
        assert ks.crashes() == 2 and ks.crashes("minute-crash") == 1
        readings = ks.read_topic(b, topics["READINGS"])
        reference = ks.plain_fold(readings)
        assert {r: ks.robots.get(r) for r in reference["robots"]} == reference["robots"]
        assert {f: ks.factories.get(f) for f in reference["factories"]} == reference["factories"]
        out = {k: ks.read_topic(b, topics[k]) for k in ("ROBOTS", "FACTORIES")}
        last = {k: {m.key().decode(): json.loads(m.value()) for m in recs}
                for k, recs in out.items()}  # fmt: skip
        assert last == {"ROBOTS": reference["robots"], "FACTORIES": reference["factories"]}
        doubled = sum(ks.duplicates(recs) for recs in out.values())
        assert doubled > 0

        # per robot per minute: every reading of the topic folded on time or kept late, once
        assert ks.minutes_accounted(ks.app) == ks.plain_minutes(readings)
        # late: exactly the inputs after the closer in the log, whatever the partitions'
        # interleaving; every input read is folded, late or a duplicate
        fastened = list(ks.app.store.iter_events(types=["ScrewsFastened"]))
        closer = next(e.position for e in fastened if e.data["at"] == ks.BASE_MS + ks.CLOSER_MS)
        late = {e.position for e in ks.minutes.late_events()}
        assert late == {e.position for e in fastened if e.position > closer} and late
        counts = ks.minutes.window_counts()
        assert counts["late"] == len(late)
        assert counts["folded"] + counts["late"] + counts["duplicate"] == len(fastened)
        # each closed minute published once (one source chain), equal to the store's
        final = {(r, w.start_us): w.value for r in map(str, range(6))
                 for w in ks.minutes.windows(r) if w.final}  # fmt: skip
        minute_records = ks.read_topic(b, topics["MINUTES"])
        chains: dict[tuple[str, int], set[bytes]] = defaultdict(set)
        for m in minute_records:
            v = json.loads(m.value())
            assert v["final"] and v["revision"] == 0
            assert v["value"] == final[(v["key"], v["start_us"])]
            chains[(v["key"], v["start_us"])].add(dict(m.headers())[el.kafka.CHAIN_HEADER])
        assert set(chains) == set(final) and all(len(c) == 1 for c in chains.values())
        minutes_doubled = ks.duplicates(minute_records)
        assert minutes_doubled > 0  # the forced crash after the closing publish

        totals, dropped = ks.downstream(f"sqlite:///{tmp_path}/downstream.db", b)
        assert {k: totals[k] for k in ("robots", "factories")} == reference
        assert totals["minutes"] == {f"{r}/{s}": v for (r, s), v in final.items()}
        assert dropped == doubled + minutes_doubled
    finally:
        ks.app.close()
