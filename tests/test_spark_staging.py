"""A Spark replay's states reach the store a bounded part at a time: staged beside the states,
then moved in with every segment's token by one transaction. In many parts they equal the
local engine's; a replay killed while it stages leaves the states and tokens as they were, and
the next replay finishes the work."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

import eventlanes as el
import eventlanes.spark.staging
from eventlanes.processing.tables.staging import StagedStates
from tests.processing_helpers import Logged
from tests.test_declarative import define, load, run, stored
from tests.test_spark import states

E = el.NewEvent
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_states_in_many_parts_equal_the_local_engine_and_replace_the_old_ones(
    spark, store_url: str, monkeypatch
) -> None:
    app = el.App(store_url, claim_timeout=5)
    define(app)
    load(app.store, 1500, seed=3)
    run(app, ["declared", "python"])
    want = stored(app, "python")
    assert len(want) > 40  # enough keys for many parts
    table = app.db.table("aggregates")
    ghost = app.db.sql(f"INSERT INTO {table} (aggregation, key, value, offsets, dropped, "
                       "updated_at) VALUES (?, 'ghost', '1', '{}', 0, 0)")  # fmt: skip
    with app.db.transaction() as conn:  # a state no event makes: the replay must remove it
        for name in ("declared", "python"):
            conn.execute(ghost, (name,))
    if app.db.backend == "postgresql":  # what a replay killed while staging leaves behind
        leftover = StagedStates(app.aggregate_states, "declared").__enter__()
        leftover.add([("declared", "ghost", "1", "{}", 0, None)])
    monkeypatch.setattr(eventlanes.spark.staging, "PART", 40)  # parts of at most about 40 states
    for name in ("declared", "python"):
        result = el.spark.replay(app, name, spark=spark)
        assert result.keys == len(want) and result.events == app.store.count()
        assert stored(app, name) == want
        assert {s.position for s in app.status(name).segments} == {app.store.head()}
    if app.db.backend == "postgresql":  # the unlogged stage is gone with the replay
        left = app.db.query("SELECT count(*) FROM pg_tables WHERE tablename LIKE ?",
                            (app.db.table("replay_") + "%",))  # fmt: skip
        assert left == [(0,)]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_an_aggregation_and_its_downstream_stage_are_staged_apart_and_move_together(
    spark, store_url: str, monkeypatch
) -> None:
    """Two plans (the aggregation's, its stage's) stage into one stage; on PostgreSQL each is
    a job of the executors whose tasks must not replace the other job's rows."""
    from examples.screws import append_raw, build
    from tests.processing_helpers import run_until_caught_up

    app = el.App(store_url, claim_timeout=5)
    _, screws, factories = build(app)
    append_raw(app.store, 150, seed=5)
    run_until_caught_up(app)
    want = {name: states(app, name) for name in (screws.name, factories.name)}
    monkeypatch.setattr(eventlanes.spark.staging, "PART", 4)
    result = el.spark.replay(app, screws.name, spark=spark)
    assert result.keys == sum(len(v) for v in want.values())
    assert {name: states(app, name) for name in want} == want


@pytest.mark.xdist_group("spark")
def test_a_replay_killed_while_it_stages_changes_nothing_and_the_next_one_finishes(
    spark_connect, tmp_path
) -> None:
    """SIGKILL once a part is staged: the states and tokens are the last run's, exactly; the
    next replay, writing a Delta table too, is killed once the table is committed: the store
    is still as it was; the one after commits the same rows to the table again and moves it. On
    the session's Spark Connect server (its thin clients start no JVM), in parts of 3 states
    (tests/apps/staged_app.py)."""
    url = f"sqlite:///{tmp_path}/events.db"
    app = el.App(url, claim_timeout=3)
    counts = app.aggregation("counts", key="robot", on="Fastened",
                             fields={"n": el.count(), "ok": el.sum("ok")})  # fmt: skip
    app.store.append("s", [E("Fastened", {"robot": f"r{i % 24}", "ok": i % 3}) for i in range(240)])
    run(app, ["counts"])
    original = stored(app, "counts")
    with app.db.transaction() as conn:  # the replay must put this state back
        sql = f"UPDATE {app.db.table('aggregates')} SET value = ? WHERE key = 'r0'"
        conn.execute(app.db.sql(sql), ('{"n":0,"ok":0}',))
    before = stored(app, "counts"), [s.position for s in app.status("counts").segments]
    env = spark_connect.driver_env(EVENTLANES_TEST_APP_URL=url)

    delta = str(tmp_path / "counts.delta")

    def replay(name: str, *more: str, **extra: str) -> Logged:
        # --wait: a killed replay's claim stays until it expires (claim_timeout=3); the next
        # one, started at once, waits for that (without it: refused, "is running", when it
        # starts within 3 s of the kill, as it does on an idle machine)
        return Logged([sys.executable, "-m", "eventlanes.cli", "replay",
                       "tests.apps.staged_app:app", "counts", "--remote", spark_connect.url,
                       "--wait", *more],
                      tmp_path, name, cwd=ROOT, env={**env, **extra})  # fmt: skip

    first = replay("killed")
    try:
        first.wait_working(lambda: "parts of the states staged" in first.err()
                           or first.process.poll() is not None, "a part")  # fmt: skip
        assert first.process.poll() is None, first.err()[-2000:]
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    finally:
        if first.process.poll() is None:
            first.process.kill()
    assert "Spark read and replayed" not in first.out()
    assert (stored(app, "counts"), [s.position for s in app.status("counts").segments]) == before
    second = replay("delta", "--delta", delta, EVENTLANES_TEST_KILL_BEFORE_MOVE="1")
    assert second.process.wait(300) == -signal.SIGKILL, second.err()[-2000:]
    assert (stored(app, "counts"), [s.position for s in app.status("counts").segments]) == before
    from deltalake import DeltaTable

    table = DeltaTable(delta)
    segments = [s.segment.id for s in app.status("counts").segments]
    assert [table.transaction_version(f"eventlanes/counts/{s}") for s in segments] == [240] * len(
        segments
    )
    rows = table.to_pyarrow_table().select(["key", "state"]).to_pylist()
    assert {r["key"]: json.loads(r["state"]) for r in rows} == {k: v[0] for k, v in
                                                                 original.items()}  # fmt: skip
    third = replay("finished", "--delta", delta)
    assert third.process.wait(300) == 0, third.err()[-2000:]
    assert "8 of 8 parts of the states staged (24 states)" in third.err()
    assert "24 states written to the Delta table" in third.err()  # again: same rows
    assert stored(app, "counts") == original != before[0]
    assert {s.position for s in app.status("counts").segments} == {240}
    assert len(DeltaTable(delta).history()) == 2
    rows = DeltaTable(delta).to_pyarrow_table().select(["key", "state"]).to_pylist()
    assert {r["key"]: json.loads(r["state"]) for r in rows} == {k: v[0] for k, v in
                                                                 original.items()}  # fmt: skip
    assert counts.dropped() == 0


def test_a_role_that_may_only_write_rows_replays_on_spark(
    spark, pg_url: str, role: str, tmp_path: Path
) -> None:
    """The production role of docs/how-to/postgresql.md (rows only, no CREATE in the schema):
    the replay stages in a temporary table of its own connection, through the driver (the
    executors cannot see it), and its states equal the local engine's; before this, the
    replay failed with PostgreSQL's raw "permission denied for schema public"."""
    import uuid

    from tests.test_schema import admin, as_role, grant_dml

    prefix = f"r{uuid.uuid4().hex[:8]}_"
    el.open_store(f"{pg_url}?prefix={prefix}").close()  # migrated by the owner
    grant_dml(pg_url, role)
    app = el.App(as_role(pg_url, role, prefix), claim_timeout=5)
    define(app)
    load(app.store, 600, seed=8)
    run(app, ["declared", "python"])
    want = stored(app, "python")
    for name in ("declared", "python"):  # a Delta table too: read back from the stage
        result = el.spark.replay(app, name, spark=spark, delta=str(tmp_path / name))
        assert result.keys == len(want) and stored(app, name) == want
        from deltalake import DeltaTable

        table = DeltaTable(str(tmp_path / name)).to_pyarrow_table()
        assert table.num_rows == len(want)
    created = admin(pg_url, f"SELECT count(*) FROM pg_tables WHERE tablename LIKE '{prefix}%' "
                            "AND tableowner <> current_user")  # fmt: skip
    assert created == [(0,)]  # the role created no table of its own
