"""Closed windows published (issue 33), to a real broker (the session's Tansu): each window
once when it closes and once per amendment, open ones never; the source chain comes from the
log alone, so a second run over a copy of the store publishes every window with the same root
and an eventlanes consumer drops each repeat (counted), as after a crash."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import eventlanes as el
from eventlanes.processing.windowing.publish import partition
from tests.kafka_helpers import create_topic, read_all, run_until_ingested
from tests.processing_helpers import run_until_caught_up, wait_for

E = el.NewEvent
BASE_MS = 1_700_000_040_000  # a minute's start
ROBOTS = ["r0", "r1", "r2", "r3"]


def inputs() -> list[E]:
    """Ten seconds apart over five minutes, some two minutes late (amended), and a last input
    far later that closes every earlier window."""
    rng = random.Random(5)
    events = []
    for i in range(30):
        late = i % 7 == 6
        at = BASE_MS + i * 10_000 - (120_000 if late else 0)
        events.append(E("ScrewAttempted", {"robot": rng.choice(ROBOTS), "ok": rng.random() < 0.7,
                                           "at": at}))  # fmt: skip
    events.append(E("ScrewAttempted", {"robot": "r0", "ok": True, "at": BASE_MS + 600_000}))
    return events


def upstream(path: Path, kafka: el.Kafka, topic: str) -> tuple[el.App, el.Aggregation]:
    app = el.App(f"sqlite:///{path}", claim_timeout=2)
    agg = app.aggregation(
        # one segment, a write per batch of 5: what each write publishes is the same in both
        # runs (a window closed and amended in one write is published once, amended)
        "screws", key="robot", on="ScrewAttempted", persist_every=0, batch_size=5,
        fields={"ok": el.count(where={"ok": True}), "n": el.count()},
        window=el.hopping("1m", every="30s"), time=el.event_time("at", unit="ms"), late="amend",
        publish=el.KafkaSink(kafka, topic), retain="1d",
    )  # fmt: skip
    return app, agg


def published(bootstrap: str, topic: str) -> list[tuple[str, dict[str, Any], list[Any]]]:
    out = []
    for records in read_all(bootstrap, topic, 2).values():
        for m in records:
            headers = dict(m.headers())
            chain = json.loads(headers["el-source-chain"])
            assert headers["type"] == b"WindowResult" and headers["aggregation"] == b"screws"
            out.append((m.key().decode(), json.loads(m.value()), chain))
    return out


def test_closed_windows_are_published_once_and_a_republish_is_dropped_downstream(
    tmp_path: Path, kafka_broker: Any
) -> None:
    b = kafka_broker.bootstrap
    topic, kafka = create_topic(b, 2), el.Kafka(b)
    with el.open_store(f"sqlite:///{tmp_path}/up.db") as store:
        for i, e in enumerate(inputs()):
            store.append(f"cell-{i % 3}", [e])
    shutil.copy(tmp_path / "up.db", tmp_path / "copy.db")  # the same log, nothing folded yet
    app, agg = upstream(tmp_path / "up.db", kafka, topic)
    run_until_caught_up(app)
    first = published(b, topic)
    windows = {(r, w.start_us): w for r in ROBOTS for w in agg.windows(r)}
    closed = {k for k, w in windows.items() if w.final}
    assert closed and len(closed) < len(windows)  # the last input's window stays open
    # every closed window published, with its latest revision last; open ones never
    assert {(key, v["start_us"]) for key, v, _ in first} == closed
    revisions = Counter((key, v["start_us"]) for key, v, _ in first)
    assert any(n > 1 for n in revisions.values())  # amended: published again
    latest = {(key, v["start_us"]): v for key, v, _ in first}
    for k in closed:
        w = windows[k]
        assert latest[k]["value"] == w.value and latest[k]["revision"] == w.revision
        assert latest[k]["final"] and latest[k]["end_us"] == w.end_us
    # each key's roots grow, in the order published (a consumer drops what does not)
    for key in ROBOTS:
        roots = [(c[0]["offset"], c[0]["out"]) for k, _, c in first if k == key]
        assert roots == sorted(roots) and len(set(roots)) == len(roots)
        assert all(c[0]["partition"] == partition(key) for k, _, c in first if k == key)

    again, _ = upstream(tmp_path / "copy.db", kafka, topic)  # as a run after a crash would
    run_until_caught_up(again)
    both = published(b, topic)  # the same records again: the same roots, the same values
    shown = sorted(json.dumps(r, sort_keys=True) for r in first)
    assert sorted(json.dumps(r, sort_keys=True) for r in both) == sorted(shown + shown)

    down = el.App(f"sqlite:///{tmp_path}/down.db", claim_timeout=2)
    down.ingest("in", kafka, topic=topic, trust_chains=["screws"])
    per_robot = down.aggregation("per-robot", key=lambda e: e.data["key"], initial=dict)

    @per_robot.on("WindowResult")
    def keep(state: dict[str, Any], event: el.Event) -> None:  # the latest revision wins
        state[str(event.data["start_us"])] = [event.data["revision"], event.data["value"]]

    run_until_ingested(down, len(both))
    assert per_robot.dropped() == len(first)  # every repeat
    for robot in ROBOTS:
        want = {str(s): [w.revision, w.value] for (r, s), w in windows.items()
                if r == robot and w.final}  # fmt: skip
        assert (per_robot.get(robot) or {}) == want


def test_on_close_events_are_appended_with_each_closed_window(tmp_path: Path) -> None:
    """What on_close returns is appended in the write that closes (or amends) the window:
    once per close and per amendment, whatever restarts; a failing one stops its segment,
    naming the window, and nothing of that write is kept."""
    url = f"sqlite:///{tmp_path}/alarms.db"

    def define(app: el.App, fail: bool = False) -> el.Aggregation:
        agg = app.aggregation(
            "screws", key="robot", on="ScrewAttempted", persist_every=0, batch_size=5,
            fields={"ok": el.count(where={"ok": True}), "n": el.count()},
            window=el.tumbling("1m"), time=el.event_time("at", unit="ms"), late="amend",
            retain="1d",
        )  # fmt: skip

        @agg.on_close
        def alarm(window: el.WindowResult) -> list[el.NewEvent]:
            if fail and window.revision:
                raise ValueError("no pager")
            if window.value["n"] - window.value["ok"] < 1:
                return []
            return [E("Failures", {"key": window.key, "start_us": window.start_us,
                                   "failed": window.value["n"] - window.value["ok"],
                                   "revision": window.revision})]  # fmt: skip

        return agg

    app = el.App(url, claim_timeout=2)
    agg = define(app)
    for i, e in enumerate(inputs()):
        app.store.append(f"cell-{i % 3}", [e])
    run_until_caught_up(app)
    run_until_caught_up(app)  # again: nothing more
    alarms = [e for e in app.store.iter_events(types=["Failures"])]
    want = sorted(
        (r, w.start_us, w.value["n"] - w.value["ok"], w.revision)
        for r in ROBOTS for w in agg.windows(r)
        if w.final and w.value["n"] > w.value["ok"]
    )  # fmt: skip
    latest = {(e.data["key"], e.data["start_us"]): e for e in alarms}
    got = sorted((*k, e.data["failed"], e.data["revision"]) for k, e in latest.items())
    assert want and got == want
    assert all(e.stream_id == f"screws:{e.data['key']}" for e in alarms)
    seen = Counter((e.data["key"], e.data["start_us"], e.data["revision"]) for e in alarms)
    assert max(seen.values()) == 1 and any(rev for _, _, rev in seen)  # amended: again

    failing = el.App(f"sqlite:///{tmp_path}/failing.db", claim_timeout=2)
    agg = define(failing, fail=True)
    for i, e in enumerate(inputs()):
        failing.store.append(f"cell-{i % 3}", [e])
    failing.start()
    try:
        wait_for(lambda: failing.status("screws").segments[0].errors > 0, timeout=30,
                 what="the failing on_close")  # fmt: skip
    finally:
        failing.stop()
    (segment,) = failing.status("screws").segments
    assert "on_close alarm failed for the window [" in (segment.last_error or "")
    assert "ValueError: no pager" in (segment.last_error or "")
    stored = {e.data["start_us"] for e in failing.store.iter_events(types=["Failures"])}
    assert stored and all(w.revision == 0 for r in ROBOTS for w in agg.windows(r))
    assert segment.position < failing.store.head()  # the failing write moved nothing


def test_windows_of_several_keys_published_out_of_position_order_are_all_kept(
    tmp_path: Path, kafka_broker: Any
) -> None:
    """Two segments write (and publish) in any order: a consumer key fed by windows of
    several keys must keep a window closed at position 10 that comes after one closed at 20.
    One chain partition per key makes each key's roots grow on their own."""
    from eventlanes.processing.tables.windows import Win
    from eventlanes.processing.windowing.publish import closed_windows, window_records

    b = kafka_broker.bootstrap
    topic, kafka = create_topic(b, 1), el.Kafka(b)
    sink = el.KafkaSink(kafka, topic)
    minute = 60_000_000
    later = closed_windows([("r2", 0, Win(minute, {"n": 2}, 0, 20))])  # segment B, first
    earlier = closed_windows([("r1", 0, Win(minute, {"n": 1}, 0, 10))])  # segment A, after
    sink.publish(window_records("screws", later))
    sink.publish(window_records("screws", earlier))
    down = el.App(f"sqlite:///{tmp_path}/down.db", claim_timeout=2)
    down.ingest("in", kafka, topic=topic, trust_chains=["screws"])
    fleet = down.aggregation("fleet", key=lambda e: "all", initial=lambda: {"n": 0})

    @fleet.on("WindowResult")
    def add(state: dict[str, int], event: el.Event) -> None:
        state["n"] += event.data["value"]["n"]

    run_until_ingested(down, 2)
    assert fleet.get("all") == {"n": 3} and fleet.dropped() == 0


def test_a_downstream_stage_folds_each_closed_window_once_whatever_fails(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Closed and amended windows feed a downstream stage before the write that closes them
    commits; a write that fails after that feeds them again when it is retried, and the stage
    drops each repeat by its chain: it ends with every window's latest revision, once."""
    from eventlanes.processing.windowing.executor import WindowExecutor

    app = el.App(f"sqlite:///{tmp_path}/stage.db", claim_timeout=2)
    agg = app.aggregation(
        "screws", key="robot", on="ScrewAttempted", persist_every=0, batch_size=5,
        fields={"ok": el.count(where={"ok": True}), "n": el.count()},
        window=el.hopping("1m", every="30s"), time=el.event_time("at", unit="ms"),
        late="amend", retain="1d",
    )  # fmt: skip
    per_robot = agg.downstream("per-robot", key=lambda e: e.data["key"], initial=dict)

    @per_robot.on("WindowResult")
    def keep(state: dict[str, Any], event: el.Event) -> None:
        state[str(event.data["start_us"])] = [event.data["revision"], event.data["value"]]

    failures = {"left": 2}
    write_more = WindowExecutor.write_more

    def fails_after_the_stage(self: WindowExecutor, conn: Any, st: Any) -> None:
        open_ = self.open.get(st.segment.id, {})
        closing = any(open_[k][s].closed_at is not None for k, s in self.touched[st.segment.id])
        if closing and failures["left"]:
            failures["left"] -= 1
            raise OSError("the disk is full")
        write_more(self, conn, st)

    monkeypatch.setattr(WindowExecutor, "write_more", fails_after_the_stage)
    for i, e in enumerate(inputs()):
        app.store.append(f"cell-{i % 3}", [e])
    run_until_caught_up(app, timeout=60)
    assert failures["left"] == 0 and per_robot.dropped() > 0  # failed, fed again, dropped
    amended = 0
    for robot in ROBOTS:
        final = [w for w in agg.windows(robot) if w.final]
        amended += sum(w.revision for w in final)
        want = {str(w.start_us): [w.revision, w.value] for w in final}
        assert (per_robot.get(robot) or {}) == want, robot
    assert amended  # amendments fed the stage too
