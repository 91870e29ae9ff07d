"""The screw pipeline through Kafka, used by `make demo` and tests/test_kafka_pipeline.py:
`eventlanes run examples.kafka_screws:app --processes 2`.

readings topic --ingest--> RawScrews --normalise (republisher)--> ScrewsFastened
--screws-per-robot (aggregation)--> robot totals topic, and --(fold outputs)-->
screws-per-factory (a downstream stage) --> factory totals topic; ScrewsFastened
--screws-per-minute (a windowed aggregation: ok and failed per robot per minute of the
readings' own time) --> robot minutes topic, each window once, when the log's clock closes it.

Every state written is published (key: robot or factory; value: the totals) before it and its
token commit, so a crash between the two publishes it again, with the same source chain.
EVENTLANES_KAFKA_DEMO_CRASH_AFTER=N makes a worker kill itself (SIGKILL) right after its N-th
acknowledged publish of robot totals, before they commit, while fewer than
EVENTLANES_KAFKA_DEMO_CRASHES marker files exist in EVENTLANES_KAFKA_DEMO_CRASH_DIR: the
crash window, forced, so the output topics always hold duplicates to drop. The minutes' sink
does the same once, on its first publish of closed windows.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import eventlanes as el

env = os.environ.get
URL = env("EVENTLANES_KAFKA_DEMO_URL", "sqlite:///demo-data/kafka.db")
BOOTSTRAP = env("EVENTLANES_KAFKA_DEMO_BOOTSTRAP", "127.0.0.1:9092")
READINGS = env("EVENTLANES_KAFKA_DEMO_READINGS", "screw-readings")
ROBOTS = env("EVENTLANES_KAFKA_DEMO_ROBOTS", "robot-totals")
FACTORIES = env("EVENTLANES_KAFKA_DEMO_FACTORIES", "factory-totals")
MINUTES = env("EVENTLANES_KAFKA_DEMO_MINUTES", "robot-minutes")
CRASH_AFTER = int(env("EVENTLANES_KAFKA_DEMO_CRASH_AFTER", "0"))
CRASHES = int(env("EVENTLANES_KAFKA_DEMO_CRASHES", "2"))
CRASH_DIR = env("EVENTLANES_KAFKA_DEMO_CRASH_DIR", "")
#: the readings' own time (``at``, epoch milliseconds): reading i of a run is at BASE_MS plus
#: i * STEP_MS, up to DISORDER_MS out of order (a robot's clock, the network)
BASE_MS, STEP_MS, DISORDER_MS = 1_767_225_600_000, 100, 3_000
#: a topic's partitions are read in any interleaving, so a reading may reach the log well
#: after later ones: the lateness covers a whole run's span, and a reading far later
#: (:func:`produce_closer`) closes the windows
LATENESS, CLOSER_MS = "1h", 3 * 3_600_000


class _CrashingSink(el.KafkaSink):
    """Publishes, then (the N-th time, ``crashes`` times in all, each leaving a marker file
    named ``marker``-n) dies before the states and token commit."""

    def __init__(self, kafka: el.Kafka, topic: str, marker: str, crashes: int) -> None:
        super().__init__(kafka, topic)
        self.marker, self.crashes, self.calls = marker, crashes, 0

    def publish(self, records: list[Any]) -> None:
        super().publish(records)
        self.calls += bool(records)  # a write with nothing closed publishes nothing
        if CRASH_AFTER and CRASH_DIR and self.calls == CRASH_AFTER:
            for n in range(self.crashes):
                try:
                    fd = os.open(Path(CRASH_DIR) / f"{self.marker}-{n}", os.O_CREAT | os.O_EXCL)
                except FileExistsError:
                    continue
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)  # acknowledged, not committed


def build(app: el.App, kafka: el.Kafka) -> tuple[el.Aggregation, el.Stage, el.Aggregation]:
    app.ingest("readings-in", kafka, topic=READINGS, type="RawScrews", batch_size=500)
    normalise = app.republisher(
        "normalise", to_stream=lambda e: f"robot-{e.data['robot']}", segments=2, batch_size=100
    )
    robots = app.aggregation(
        "screws-per-robot", key=lambda e: str(e.data["robot"]),  # numbered: a key is text
        initial=lambda: {"ok": 0, "failed": 0}, persist_every=0.2, segments=2,
        publish=_CrashingSink(kafka, ROBOTS, "crash", CRASHES),
    )  # fmt: skip
    factories = robots.downstream(
        "screws-per-factory", key=lambda out: out.data["factory"], initial=lambda: {"ok": 0},
        publish=el.KafkaSink(kafka, FACTORIES),
    )  # fmt: skip
    minutes = app.aggregation(
        "screws-per-minute", key=lambda e: str(e.data["robot"]),
        initial=lambda: {"ok": 0, "failed": 0}, persist_every=0.2, segments=2,
        window=el.tumbling("1m"), time=el.event_time("at", unit="ms"), lateness=LATENESS,
        retain="1d", publish=_CrashingSink(kafka, MINUTES, "minute-crash", 1),
    )  # fmt: skip

    @normalise.on("RawScrews")
    def split_results(event: el.Event) -> list[el.NewEvent]:
        robot = event.data["robot"]
        at = event.data["at"]
        return [el.NewEvent("ScrewsFastened", {"robot": robot, "ok": ok, "failed": failed,
                                               "at": at})
                for ok, failed in event.data["results"]]  # fmt: skip

    @robots.on("ScrewsFastened")
    def add(state: dict, event: el.Event) -> el.NewEvent:
        state["ok"] += event.data["ok"]
        state["failed"] += event.data["failed"]
        factory = f"factory-{event.data['robot'] % 3}"
        return el.NewEvent("RobotOk", {"factory": factory, "ok": event.data["ok"]})

    @factories.on("RobotOk")
    def add_factory(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]

    @minutes.on("ScrewsFastened")
    def add_minute(state: dict, event: el.Event) -> None:
        state["ok"] += event.data["ok"]
        state["failed"] += event.data["failed"]

    return robots, factories, minutes


app = el.App(URL, claim_timeout=1.5)
robots, factories, minutes = build(app, el.Kafka(BOOTSTRAP))
PROCESSORS = ("normalise", "screws-per-robot", "screws-per-minute")


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "linger.ms": 5, "log.connection.close": False})  # fmt: skip


def produce_readings(bootstrap: str, topic: str, n: int, seed: int) -> None:
    """``n`` raw readings, keyed by robot, from a plain idempotent producer; reading i at
    ``BASE_MS + i * STEP_MS``, up to ``DISORDER_MS`` later (so a second call's readings fall
    in the first one's minutes)."""
    rng = random.Random(seed)
    producer = _producer(bootstrap)
    for i in range(n):
        robot = rng.randrange(6)
        results = [[rng.randrange(9), rng.randrange(2)] for _ in range(rng.randint(1, 3))]
        at = BASE_MS + i * STEP_MS + rng.randrange(DISORDER_MS)
        value = json.dumps({"robot": robot, "results": results, "at": at}).encode()
        producer.produce(topic, value, f"robot-{robot}".encode())
        producer.poll(0)
    assert producer.flush(60) == 0


def produce_closer(bootstrap: str, topic: str) -> None:
    """One reading of nothing fastened, ``CLOSER_MS`` after the others: once in the log, the
    clock passes the end of every earlier minute plus the lateness, and they close."""
    producer = _producer(bootstrap)
    value = {"robot": 0, "results": [[0, 0]], "at": BASE_MS + CLOSER_MS}
    producer.produce(topic, json.dumps(value).encode(), b"robot-0")
    assert producer.flush(60) == 0


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of the topic (all partitions, each in offset order)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-check",
                         "enable.auto.commit": False, "log.connection.close": False})  # fmt: skip
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    records: list[Any] = []
    for p in partitions:
        consumer.assign([TopicPartition(topic, p, 0)])
        idle = 0
        while idle < 3:
            batch = [m for m in consumer.consume(10_000, timeout=0.3) if m.error() is None]
            records += batch
            idle = 0 if batch else idle + 1
    consumer.close()
    return records


def plain_fold(readings: list[Any]) -> dict[str, dict[str, Any]]:
    """The reference: the totals of the input topic, folded by a plain loop."""
    robots: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0, "failed": 0})
    factories: dict[str, dict[str, int]] = defaultdict(lambda: {"ok": 0})
    for m in readings:
        reading = json.loads(m.value())
        for ok, failed in reading["results"]:
            robots[str(reading["robot"])]["ok"] += ok
            robots[str(reading["robot"])]["failed"] += failed
            factories[f"factory-{reading['robot'] % 3}"]["ok"] += ok
    return {"robots": dict(robots), "factories": dict(factories)}


def minute_of(at_ms: int) -> int:
    """The start of the minute holding ``at_ms``, in microseconds (as windows report it)."""
    return (at_ms - at_ms % 60_000) * 1000


def plain_minutes(readings: list[Any]) -> dict[tuple[str, int], dict[str, int]]:
    """The reference: ok and failed per robot per minute of the input topic, by a plain loop
    (the closer's minute, still open, left out)."""
    out: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: {"ok": 0, "failed": 0})
    for m in readings:
        reading = json.loads(m.value())
        if reading["at"] == BASE_MS + CLOSER_MS:
            continue
        for ok, failed in reading["results"]:
            cell = out[(str(reading["robot"]), minute_of(reading["at"]))]
            cell["ok"] += ok
            cell["failed"] += failed
    return dict(out)


def minutes_accounted(app: el.App) -> dict[tuple[str, int], dict[str, int]]:
    """Per robot and minute, the closed window's value plus the late inputs kept for it: every
    input of the log, folded on time or late, once."""
    out: dict[tuple[str, int], dict[str, int]] = {}
    agg = app.get("screws-per-minute")
    for robot in map(str, range(6)):
        for w in agg.windows(robot):
            if w.final:
                out[(robot, w.start_us)] = dict(w.value)
    late = {e.position: e for e in agg.late_events()}
    for event in app.store.iter_events(types=["ScrewsFastened"]):
        if event.position in late:
            ((start, _end),) = late[event.position].windows
            cell = out.setdefault((str(event.data["robot"]), start), {"ok": 0, "failed": 0})
            cell["ok"] += event.data["ok"]
            cell["failed"] += event.data["failed"]
    return out


def duplicates(records: list[Any]) -> int:
    """Records published again: the same key with the same source chain as an earlier one."""
    seen: set[tuple[bytes, bytes]] = set()
    again = 0
    for m in records:
        chain = dict(m.headers() or ()).get(el.kafka.CHAIN_HEADER, b"")
        if (m.key(), chain) in seen:
            again += 1
        seen.add((m.key(), chain))
    return again


def downstream(url: str, bootstrap: str, timeout: float = 120.0) -> tuple[dict[str, Any], int]:
    """The other side: an eventlanes app ingests the three output topics and keeps the latest
    total per key and the latest result per robot and minute, its aggregations dropping what
    was published twice. Returns (latest values per topic: ``robots``, ``factories`` and
    ``minutes``, keyed ``robot/start_us``; duplicates dropped)."""
    import time

    other = el.App(url, claim_timeout=1.5)
    kafka = el.Kafka(bootstrap)
    # the totals' chains lead back to the readings topic, or to the robots stage; a closed
    # window's to the windowed aggregation (the log that closed it): trusted
    trust = [READINGS, "screws-per-robot", "screws-per-minute"]
    other.ingest("robot-totals-in", kafka, topic=ROBOTS, type="RobotTotal", trust_chains=trust)
    other.ingest(
        "factory-totals-in", kafka, topic=FACTORIES, type="FactoryTotal", trust_chains=trust
    )
    other.ingest("minutes-in", kafka, topic=MINUTES, type="RobotMinute", trust_chains=trust)
    latest = other.aggregation("latest", key=lambda e: f"{e.type}/{e.stream_id}",
                               initial=dict, persist_every=0.1)  # fmt: skip
    per_minute = other.aggregation(
        "per-minute", key=lambda e: f"{e.data['key']}/{e.data['start_us']}", initial=dict,
        persist_every=0.1,
    )  # fmt: skip

    @latest.on("RobotTotal", "FactoryTotal")
    def keep(state: dict, event: el.Event) -> None:
        state.clear()
        state.update(event.data)

    @per_minute.on("RobotMinute")
    def keep_minute(state: dict, event: el.Event) -> None:
        state.clear()
        state.update(event.data["value"])

    counts = {t: len(read_topic(bootstrap, t)) for t in (ROBOTS, FACTORIES, MINUTES)}
    other.start()
    try:
        deadline = time.monotonic() + timeout
        while other.store.count() < sum(counts.values()):
            if time.monotonic() > deadline:
                raise TimeoutError("the output topics were not ingested in time")
            time.sleep(0.1)
        other.wait_until_caught_up(timeout)
    finally:
        other.stop()
    table = other.aggregate_states.table
    totals: dict[str, dict[str, Any]] = {"robots": {}, "factories": {}, "minutes": {}}
    sql = other.db.sql(f"SELECT aggregation, key FROM {table} WHERE aggregation IN (?, ?)")
    for name, key in other.db.query(sql, ("latest", "per-minute")):
        if name == "per-minute":
            totals["minutes"][key] = per_minute.get(key)
            continue
        kind, robot = key.split("/", 1)
        totals["robots" if kind == "RobotTotal" else "factories"][robot] = latest.get(key)
    dropped = latest.dropped() + per_minute.dropped()
    other.close()
    return totals, dropped


def crashes(marker: str = "crash") -> int:
    """Forced crashes so far (one marker file each) of the totals' sink (or the minutes':
    ``marker="minute-crash"``)."""
    return len(list(Path(CRASH_DIR).glob(f"{marker}-*"))) if CRASH_DIR else 0


def run_pipeline(
    readings: int,
    processes: int = 2,
    only: list[str] | None = None,
    kill_at: tuple[float, ...] = (),
    timeout: float = 300.0,
) -> list[int]:
    """Run the pipeline (or ``only`` these parts) in ``processes`` worker processes, as `run
    --processes` does, until all ``readings`` are ingested and handled and the forced crashes
    happened. ``kill_at``: SIGKILL a worker when that share of the readings is ingested.
    Returns the pids it killed (the forced crashes leave marker files: :func:`crashes`)."""
    import time

    from eventlanes.cli.supervisor import Supervisor

    names = only or ["readings-in", *PROCESSORS]
    supervisor = Supervisor("examples.kafka_screws:app", processes, names, max_restarts=10)
    killed: list[int] = []
    kills = list(kill_at)
    deadline = time.monotonic() + timeout

    def tick() -> None:
        ingested = app.ingest_status("readings-in").position
        alive = [c for c in supervisor.children if c.is_alive()]
        if kills and ingested >= kills[0] * readings and len(alive) == processes:
            kills.pop(0)
            alive[0].kill()  # SIGKILL mid-way: its claims stay until they time out
            killed.append(alive[0].pid or 0)
        done = (
            ingested >= readings
            and all(app.status(n).caught_up for n in names if n in PROCESSORS)
            and crashes() >= (CRASHES if CRASH_AFTER else 0)
            and not kills
        )
        if done or time.monotonic() > deadline:
            supervisor.stop()

    supervisor.run(tick, interval=0.1)
    return killed
