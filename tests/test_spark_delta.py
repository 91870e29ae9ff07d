"""A Spark replay writes an aggregation's states to a Delta Lake table (deltalake), the
position in the same commit as the rows, before the store's states and tokens move: a replay
that dies between the two is finished by the next without a second commit; a table of
another store is refused before any work. Spark, DuckDB and Polars read the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes import DeltaWriteError
from eventlanes.lakehouse import DeltaStates
from eventlanes.lakehouse.delta import app_id
from eventlanes.processing.tables.staging import StagedStates
from tests.test_declarative import FIELDS, define, load

E = el.NewEvent


def rows(app: el.App, *names: str) -> dict[tuple[str, str], str]:
    """(aggregation, key) -> state JSON, as the store keeps them."""
    t = app.db.table("aggregates")
    found = app.db.query(f"SELECT aggregation, key, value FROM {t}")
    return {(a, k): v for a, k, v in found if a in names}


def table_rows(uri: str) -> dict[tuple[str, str], str]:
    from deltalake import DeltaTable

    table = DeltaTable(uri).to_pyarrow_table()
    cols = [table.column(c).to_pylist() for c in ("aggregation", "key", "state")]
    return {(a, k): s for a, k, s in zip(*cols, strict=True)}


def positions(uri: str, name: str, segments: int) -> list[int | None]:
    from deltalake import DeltaTable

    return [DeltaTable(uri).transaction_version(app_id(name, s)) for s in range(segments)]


def commits(uri: str) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(uri).history())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_replay_writes_its_states_to_delta_with_the_position_in_the_commit(
    spark, store_url: str, tmp_path: Path
) -> None:
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    app = el.App(store_url, claim_timeout=5)
    define(app)
    load(app.store, 1500, seed=4)
    for name in ("declared", "python"):
        uri = str(tmp_path / name)
        result = el.spark.replay(app, name, spark=spark, delta=uri)
        want = rows(app, name)
        assert len(want) == result.keys > 40
        assert table_rows(uri) == want
        assert positions(uri, name, 2) == [result.end] * 2 == [app.store.head()] * 2
        table = DeltaTable(uri).to_pyarrow_table()
        assert set(table.column("position").to_pylist()) == {result.end}
        if name == "declared":  # one typed column per field, equal to the state's
            got = table.select(list(FIELDS)).to_pylist()
            assert got == [{f: json.loads(s)[f] for f in FIELDS}
                           for s in table.column("state").to_pylist()]  # fmt: skip
            assert table.schema.field("n").type == "int64"
            assert table.schema.field("hi_t").type == "double"
            assert table.schema.field("first_s").type == "string"
        # Spark without a Delta jar (the table's current files, as Parquet), DuckDB, Polars
        files = DeltaTable(uri).file_uris()
        spark_rows = spark.read.parquet(*files).select("aggregation", "key", "state").collect()
        assert {(r[0], r[1]): r[2] for r in spark_rows} == want
        duck = duckdb.execute("SELECT aggregation, key, state FROM read_parquet(?)", [files])
        assert {(a, k): s for a, k, s in duck.fetchall()} == want
        frame = pl.read_delta(uri).select("aggregation", "key", "state")
        assert {(a, k): s for a, k, s in frame.iter_rows()} == want


def test_a_replay_that_dies_after_the_delta_commit_is_finished_by_the_next(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """Killed between the Delta commit and the store's move: the table is at the replay's end,
    the store as it was; the next replay to the same end commits the same rows again (it
    cannot know the fold is the same) and moves the store; one after more events replaces
    the rows."""
    from examples.screws import append_raw, build
    from tests.processing_helpers import run_until_caught_up

    app = el.App(f"sqlite:///{tmp_path}/events.db", claim_timeout=5)
    normalise, screws, factories = build(app)  # an aggregation and its downstream stage
    append_raw(app.store, 150, seed=6)
    run_until_caught_up(app, 60, [normalise.name])  # the aggregation's input, not folded
    names = (screws.name, factories.name)
    uri = str(tmp_path / "screws")
    segments = len(app.status(screws.name).segments)
    replace = StagedStates.replace

    def dies(self: StagedStates, *args: Any) -> None:
        raise SystemExit("killed before the store's move")

    monkeypatch.setattr(StagedStates, "replace", dies)
    with pytest.raises(SystemExit):
        el.spark.replay(app, screws.name, spark=spark, delta=uri)
    head = app.store.head()
    assert positions(uri, screws.name, segments) == [head] * segments
    assert {s.position for s in app.status(screws.name).segments} == {0}
    assert rows(app, *names) == {}  # the store moved nothing
    staged = table_rows(uri)
    assert {a for a, _ in staged} == set(names)
    monkeypatch.setattr(StagedStates, "replace", replace)
    result = el.spark.replay(app, screws.name, spark=spark, delta=uri)
    assert result.end == head and commits(uri) == 2
    assert rows(app, *names) == staged == table_rows(uri)
    assert {s.position for s in app.status(screws.name).segments} == {head}
    append_raw(app.store, 60, seed=7)
    run_until_caught_up(app, 60, [normalise.name])
    result = el.spark.replay(app, screws.name, spark=spark, delta=uri)
    assert result.end > head and commits(uri) == 3
    assert positions(uri, screws.name, segments) == [result.end] * segments
    assert table_rows(uri) == rows(app, *names) != staged


def test_a_delta_table_of_another_store_is_refused_before_any_work(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "counts")
    apps = []
    for n, events in (("a", 300), ("b", 100)):
        app = el.App(f"sqlite:///{tmp_path}/{n}.db", claim_timeout=5)
        app.aggregation("counts", key="robot", on="Fastened", fields={"n": el.count()})
        app.store.append("s", [E("Fastened", {"robot": f"r{i % 7}"}) for i in range(events)])
        apps.append(app)
    el.spark.replay(apps[0], "counts", spark=spark, delta=uri)
    before = table_rows(uri)
    with pytest.raises(
        DeltaWriteError,
        match=r"holds segment 0 at position 300, past this "
        r"store's head 100 .*nothing was written",
    ):
        el.spark.replay(apps[1], "counts", spark=spark, delta=uri)
    assert table_rows(uri) == before and commits(uri) == 1
    assert {s.position for s in apps[1].status("counts").segments} == {0}
    assert rows(apps[1], "counts") == {}


def test_what_a_delta_table_cannot_hold_is_refused_clearly(tmp_path: Path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/events.db")
    app.aggregation("odd", key="robot", on="Fastened", fields={"a b": el.count()})
    app.aggregation("clash", key="robot", on="Fastened", fields={"key": el.count()})
    app.processor("proj").on("Fastened")(lambda event, ctx: None)
    uri = str(tmp_path / "t")
    with pytest.raises(el.InvalidInputError, match=r"odd: field 'a b' cannot be a column"):
        el.spark.replay(app, "odd", delta=uri, master="local[1]")
    with pytest.raises(el.InvalidInputError, match=r"clash: field 'key' cannot be a column"):
        el.spark.replay(app, "clash", delta=uri, master="local[1]")
    with pytest.raises(el.InvalidInputError, match=r"'proj': a Delta table holds an aggreg"):
        el.spark.replay(app, "proj", delta=uri, master="local[1]")
    with pytest.raises(el.InvalidInputError, match=r"storage options without a Delta table"):
        el.spark.replay(app, "odd", delta_options={"a": "b"}, master="local[1]")
    with pytest.raises(el.InvalidInputError, match=r"location must be a path or URI"):
        DeltaStates(" ", "odd")
    assert not (tmp_path / "t").exists()  # refused before a session, a table or a claim


def test_a_write_stopped_part_way_commits_nothing(tmp_path: Path) -> None:
    """The rows stream into the commit: a state that does not fit its typed column, or fewer
    rows than were staged, found after some rows went out, must leave the table as it was."""
    decl = el.App(f"sqlite:///{tmp_path}/events.db").aggregation(
        "c", key="robot", on="Fastened", fields={"n": el.sum("n")}
    ).declaration  # fmt: skip
    uri = str(tmp_path / "t")
    target = DeltaStates(uri, "c", decl)
    good = [[("c", f"r{i}", json.dumps({"n": i})) for i in range(j, j + 50)] for j in (0, 50)]
    target.write(iter(good), [0, 1], end=7, count=100)
    bad = [good[0], [("c", "r9", json.dumps({"n": "nine"}))]]
    with pytest.raises(DeltaWriteError, match=r"keys 'r9' to 'r9'.* does not fit"):
        target.write(iter(bad), [0, 1], end=9, count=51)
    with pytest.raises(DeltaWriteError, match=r"100 states were read back but 101 were staged"):
        target.write(iter(good), [0, 1], end=9, count=101)
    assert commits(uri) == 1 and positions(uri, "c", 2) == [7, 7]
    assert len(table_rows(uri)) == 100


def test_a_continuous_run_keeps_the_table_current_and_finishes_a_lost_batch(
    spark, tmp_path: Path, monkeypatch
) -> None:
    """`run --engine spark --delta`: each micro-batch merges its changed states into the table,
    its end in the commit, before the store's commit. A batch lost between the two is covered
    by the next one (a longer batch here), and the table ends equal to the store. A table the
    store has not written first cannot follow it."""
    import eventlanes.spark.continuous as continuous
    from eventlanes.spark.continuous import ContinuousAggregation
    from eventlanes.tokens.claims import claim_all

    app = el.App(f"sqlite:///{tmp_path}/events.db", claim_timeout=5)
    app.aggregation("counts", key="robot", on="Fastened", segments=2,
                    fields={"n": el.count(), "ok": el.sum("ok")})  # fmt: skip

    def add(n: int, prefix: str) -> None:
        app.store.append("s", [E("Fastened", {"robot": f"{prefix}{i % 13}", "ok": i % 3})
                               for i in range(n)])  # fmt: skip

    add(200, "r")
    uri = str(tmp_path / "counts")
    first = r"holds no position for segment 0, and the store 0: replay counts with this table"
    with pytest.raises(DeltaWriteError, match=first):
        ContinuousAggregation(app, "counts", spark=spark, delta=uri).start()
    el.spark.replay(app, "counts", spark=spark, delta=uri)  # (start released its claims)
    add(60, "r")
    add(60, "new")  # keys the replay did not see

    def runner(max_rows: int | None) -> ContinuousAggregation:
        made = ContinuousAggregation(app, "counts", spark=spark, delta=uri, max_rows=max_rows)
        made.records = claim_all(app.tokens, "counts", made.owner)  # batches by hand
        return made

    def lose_a_batch() -> None:
        lost = runner(50)
        try:
            with monkeypatch.context() as m:

                def dies(*args: Any) -> None:
                    raise RuntimeError("killed before the store's commit")

                m.setattr(continuous, "save_states", dies)
                with pytest.raises(RuntimeError, match="killed"):
                    lost.run_batch()
        finally:
            lost.stop()

    lose_a_batch()  # (200, 250]: merged, not committed to the store
    assert positions(uri, "counts", 2) == [250, 250] and commits(uri) == 2
    assert {s.position for s in app.status("counts").segments} == {200}
    assert table_rows(uri) != rows(app, "counts")
    same = runner(50)  # the same batch again: the table holds it, the store takes it
    try:
        assert same.run_batch()
    finally:
        same.stop()
    assert {s.position for s in app.status("counts").segments} == {250} and commits(uri) == 2
    lose_a_batch()  # (250, 300]
    longer = runner(None)  # (250, 320]: its states cover every row the lost merge wrote
    try:
        assert longer.run_batch() and not longer.run_batch()
    finally:
        longer.stop()
    assert {s.position for s in app.status("counts").segments} == {320}
    assert positions(uri, "counts", 2) == [320, 320] and commits(uri) == 4
    assert table_rows(uri) == rows(app, "counts")
    assert len(rows(app, "counts")) == 26


def test_a_windowed_aggregation_is_refused_a_delta_table_before_any_work(
    spark, tmp_path: Path
) -> None:
    """A Delta table holds a keyed aggregation's states: a windowed one's replay with one said
    nothing and wrote no table (its windows went to the store only)."""
    app = el.App(f"sqlite:///{tmp_path}/events.db")
    app.aggregation("per-minute", key="robot", on="Fastened", fields={"n": el.count()},
                    window=el.tumbling("1m"))  # fmt: skip
    app.store.append("r1", [E("Fastened", {"robot": "r1"})])
    uri = str(tmp_path / "t")
    with pytest.raises(el.InvalidInputError, match=r"'per-minute' is windowed: .*Delta"):
        el.spark.replay(app, "per-minute", delta=uri, spark=spark)
    assert not (tmp_path / "t").exists()
    assert [s.token.position for s in app.tokens.status("per-minute")] == []  # nothing moved
    app.close()


def test_a_replay_at_the_same_position_with_a_changed_fold_rewrites_the_table(
    spark, tmp_path: Path
) -> None:
    """A replay replaces the store's states; run again at the same head (a fold fixed, a new
    field), it skipped the Delta commit because the table already held that position, and
    the table kept the old states while the store had the new ones."""
    url, uri = f"sqlite:///{tmp_path}/events.db", str(tmp_path / "totals")

    def app_with(step: int) -> el.App:
        app = el.App(url)
        agg = app.aggregation("totals", key="k", initial=lambda: {"n": 0})

        @agg.on("Hit")
        def hit(state: dict, event: el.Event) -> None:
            state["n"] += step

        return app

    first = app_with(1)
    first.store.append("s", [E("Hit", {"k": "a"}), E("Hit", {"k": "a"})])
    el.spark.replay(first, "totals", spark=spark, delta=uri)
    assert table_rows(uri) == rows(first, "totals") == {("totals", "a"): '{"n":2}'}
    first.close()
    second = app_with(10)
    el.spark.replay(second, "totals", spark=spark, delta=uri)
    assert rows(second, "totals") == {("totals", "a"): '{"n":20}'}
    assert table_rows(uri) == rows(second, "totals")
    second.close()
