"""Declarative aggregations: equal to the same aggregation written as a Python fold, on skewed
keys with republished duplicates, on the local engine and on a Spark replay; strict types;
clear errors for bad declarations; ``persist_every`` honoured."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

import eventlanes as el
from eventlanes.processing.aggregating.declarative import FieldTypeError
from eventlanes.processing.tables.states import Entry
from tests.processing_helpers import run_until_caught_up

E = el.NewEvent
FIELDS = {
    "events": el.count(),
    "ok": el.count(where={"status": "ok"}),
    "with_v": el.count("v"),
    "n": el.sum("n"),
    "n_ok": el.sum("n", where={"status": "ok", "big": False}),
    "lo": el.min("v"),
    "hi": el.max("v"),
    "first_s": el.first("s"),
    "last_s": el.last("s"),
    "hi_t": el.max("t", float),
}


def by_hand(state: dict, event: el.Event) -> None:
    """The same aggregation as FIELDS, as a Python fold."""
    d = event.data
    state["events"] += 1
    ok = d.get("status") == "ok"
    state["ok"] += ok
    state["n"] += d["n"]
    if ok and d.get("big") is False:
        state["n_ok"] += d["n"]
    v = d.get("v")
    if v is not None:
        state["with_v"] += 1
        state["lo"] = v if state["lo"] is None else min(state["lo"], v)
        state["hi"] = v if state["hi"] is None else max(state["hi"], v)
    s = d.get("s")
    if s is not None:
        state["first_s"] = s if state["first_s"] is None else state["first_s"]
        state["last_s"] = s
    t = d.get("t")
    if t is not None:
        state["hi_t"] = float(t) if state["hi_t"] is None else max(state["hi_t"], float(t))


def define(app: el.App) -> tuple[el.Aggregation, el.Aggregation]:
    declared = app.aggregation("declared", key="robot", on="Fastened", fields=FIELDS,
                               segments=2, persist_every=0.05, batch_size=300)  # fmt: skip
    python = app.aggregation(
        "python", key="robot", initial=lambda: {f: op.initial for f, op in FIELDS.items()},
        segments=2, persist_every=0.05, batch_size=300,
    )  # fmt: skip
    python.on("Fastened")(by_hand)
    return declared, python


def load(store: el.EventStore, events: int, seed: int, chains: bool = True) -> None:
    """Skewed keys (a few hot robots, many cold ones); some events are re-appended outputs of
    a republisher that crashed (same root as an earlier output: dropped), some come from a
    repartitioned source, some are of another type, some lack optional properties.
    ``chains=False``: no source chain, some metadata of other kinds instead."""
    rng = random.Random(seed)
    roots: list[dict[str, Any]] = []
    for i in range(events // 50):
        batch = []
        for _ in range(50):
            robot = f"r{int(rng.paretovariate(1.2)) % 400}"
            data: dict[str, Any] = {"robot": robot, "n": rng.randrange(-5, 50),
                                    "status": rng.choice(["ok", "ok", "failed"]),
                                    "big": rng.random() < 0.3}  # fmt: skip
            if rng.random() < 0.8:
                data["v"] = rng.randrange(-1000, 1000)
            if rng.random() < 0.7:
                data["s"] = rng.choice(["a", "b", "ü", 'q"uote'])
            if rng.random() < 0.5:
                data["t"] = rng.choice([rng.random() * 100, rng.randrange(100)])
            meta: dict[str, Any] = {}
            r = rng.random()
            if not chains:
                meta = {"user": "u"} if r < 0.15 else {}
            elif r < 0.25:  # a republished output (root in an upstream source)
                hop = {"source": "up", "partition": rng.choice(["", "", "p1"]),
                       "offset": i * 50 + len(batch), "out": rng.randrange(2)}  # fmt: skip
                roots.append({"robot": robot, "hop": hop, "data": data})
                meta = {"source_chain": [hop]}
            elif r < 0.30 and roots:  # the crash window: an earlier output appended again
                old = rng.choice(roots[-200:])
                data, meta = {**old["data"]}, {"source_chain": [old["hop"]]}
            batch.append(E("Fastened" if rng.random() > 0.05 else "Other", data, meta))
        store.append(f"cell-{i % 13}", batch)


def stored(app: el.App, name: str) -> dict[str, tuple[Any, Any, int]]:
    t = app.db.table("aggregates")
    rows = app.db.query(
        app.db.sql(f"SELECT key, value, offsets, dropped, dropped_by FROM {t} "
                   "WHERE aggregation = ?"), (name,)
    )  # fmt: skip
    return {k: (json.loads(v), json.loads(o), d, b and json.loads(b)) for k, v, o, d, b in rows}


def run(app: el.App, names: list[str]) -> None:
    run_until_caught_up(app, 120, names)


def test_declared_equals_the_python_fold_on_the_local_engine(store_url: str) -> None:
    app = el.App(store_url, claim_timeout=5)
    declared, python = define(app)
    load(app.store, 3000, seed=1)
    run(app, ["declared", "python"])
    want = stored(app, "python")
    assert stored(app, "declared") == want
    assert declared.dropped() == python.dropped() > 0
    hot = max(want, key=lambda k: want[k][0]["events"])
    assert declared.get(hot) == want[hot][0] and want[hot][0]["events"] > 100
    # Folding on, with the states already stored (and kept in memory while held).
    load(app.store, 1000, seed=2)
    run(app, ["declared", "python"])
    assert stored(app, "declared") == stored(app, "python") != want


def test_declared_equals_the_python_fold_on_a_spark_replay(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/d.db", claim_timeout=5)
    declared, python = define(app)
    plain = app.aggregation("plain", key="robot", on=["Fastened"], fields=FIELDS)
    load(app.store, 2000, seed=3)
    run(app, ["python"])
    result = el.spark.replay(app, "declared", spark=spark)
    assert result.end == app.store.head()
    want = stored(app, "python")
    assert stored(app, "declared") == want
    assert declared.dropped() == python.dropped() > 0
    assert all(s.position == result.end for s in app.status("declared").segments)
    # The live processor continues from the replay's end: no gap, no double count.
    load(app.store, 500, seed=4)
    run(app, ["declared", "python"])
    assert stored(app, "declared") == stored(app, "python")
    # No chain at all (the groupBy-only plan), from a Parquet export.
    app2 = el.App(f"sqlite:///{tmp_path}/plain.db", claim_timeout=5)
    plain = app2.aggregation("plain", key="robot", on="Fastened", fields=FIELDS)
    check = app2.aggregation(
        "check", key="robot", initial=lambda: {f: op.initial for f, op in FIELDS.items()}
    )
    check.on("Fastened")(by_hand)
    rng = random.Random(5)
    for i in range(20):
        app2.store.append(f"s{i}", [E("Fastened", {"robot": f"r{rng.randrange(30)}", "n": i,
                                                   "v": rng.randrange(9), "s": str(i)})
                                    for _ in range(40)])  # fmt: skip
    run(app2, ["check"])
    export = tmp_path / "export"
    el.spark.export_parquet(app2.store, str(export))
    el.spark.replay(app2, "plain", spark=spark, parquet=str(export))
    assert stored(app2, "plain") == stored(app2, "check")
    del plain


def test_types_are_strict_on_both_paths(spark, tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/t.db")
    agg = app.aggregation("t", key="robot", on="Fastened", fields={"n": el.sum("n")})
    app.store.append(
        "s", [E("Fastened", {"robot": "r", "n": 1}), E("Fastened", {"robot": "r", "n": "2"})]
    )
    decl = agg.declaration
    assert decl is not None
    events = app.store.read(0, 10)
    with pytest.raises(
        FieldTypeError, match=r"event 2 \(Fastened\): data property 'n' is '2', declared int"
    ):
        decl.fold_batch(events, decl.keys(events), {"r": Entry(decl.initial())}, "x")  # type: ignore[attr-defined]
    with pytest.raises(FieldTypeError):
        decl.fold(decl.initial(), events[1])
    with pytest.raises(Exception, match="n"):  # Spark's from_json in FAILFAST mode
        el.spark.replay(app, "t", spark=spark)
    assert agg.get("r") is None  # nothing written


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fields": {"n": "sum"}}, "must be el.count"),
        ({"fields": {}}, "non-empty dict"),
        ({"fields": {1: el.count()}}, "state field names must be strings"),
        ({"fields": {"n": el.count()}, "on": None}, "on= must name"),
        ({"fields": {"n": el.count()}, "on": ["A", ""]}, "on= must name"),
        ({"fields": {"n": el.count()}, "key": lambda e: 1}, "key must be a data property"),
        ({"fields": {"n": el.count()}, "initial": dict}, "drop initial="),
        ({"fields": {"n": el.sum("v"), "m": el.first("v")}}, "'v' is used as int and as str"),
        ({"fields": {"n": el.count(where={"robot": 1})}}, "'robot' is used as str and as int"),
    ],
)
def test_bad_declarations(tmp_path, options: dict, message: str) -> None:
    app = el.App(f"sqlite:///{tmp_path}/b.db")
    kwargs = {"key": "robot", "on": "Fastened", **options}
    with pytest.raises(el.InvalidInputError, match=message):
        app.aggregation("bad", **kwargs)


def test_bad_operations() -> None:
    with pytest.raises(el.InvalidInputError, match="property name must be a string"):
        el.sum(3)  # type: ignore[arg-type]
    with pytest.raises(el.InvalidInputError, match="property name"):
        el.max("a.b")
    with pytest.raises(el.InvalidInputError, match="order of additions"):
        el.sum("n", float)
    with pytest.raises(el.InvalidInputError, match="type must be one of int"):
        el.sum("n", str)
    with pytest.raises(el.InvalidInputError, match="type must be one of int, float, str"):
        el.min("n", bool)
    with pytest.raises(el.InvalidInputError, match="where"):
        el.count(where={"a": [1]})
    with pytest.raises(el.InvalidInputError, match="where must be a non-empty dict"):
        el.count(where={})


def test_python_folds_are_refused_on_a_declared_aggregation(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/r.db")
    agg = app.aggregation("d", key="robot", on="Fastened", fields={"n": el.count()})
    with pytest.raises(el.InvalidInputError, match="is declarative"):
        agg.on("Fastened")
    with pytest.raises(el.InvalidInputError, match="is declarative"):
        agg.downstream("x", key=lambda o: 1, initial=dict)


def test_persist_every_is_honoured_when_caught_up(tmp_path) -> None:
    """A trickle of events, each batch followed by an idle read: states (and the token) are
    written once persist_every has passed, not after every batch; stopping writes them."""
    app = el.App(f"sqlite:///{tmp_path}/p.db", claim_timeout=3)
    agg = app.aggregation("slow", key="robot", on="Fastened", fields={"n": el.count()},
                          persist_every=3600)  # fmt: skip
    app.start()
    try:
        for _ in range(15):
            app.store.append("s", [E("Fastened", {"robot": "r"})])
            time.sleep(0.1)
        time.sleep(1.5)  # coordinator rounds (every second) and idle reads pass
        assert agg.get("r") is None
        assert all(s.position == 0 for s in app.status("slow").segments)
    finally:
        app.stop()
    assert agg.get("r") == {"n": 15}  # letting go writes what is held
