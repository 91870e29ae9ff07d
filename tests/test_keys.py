"""One key encoding: the key of a state (aggregations, stages, declared fields, Spark) is a
string, as it is; any other value is refused where the fold runs, naming the event and the
key's type, so 5 and "5" are never folded into one state. States stored before read back."""

from __future__ import annotations

import time
from typing import Any

import pytest

import eventlanes as el
from tests.processing_helpers import run_until_caught_up

E = el.NewEvent


def count(state: dict, event: el.Event) -> None:
    state["n"] += 1


def errors(app: el.App, name: str) -> list[str]:
    return [s.last_error for s in app.status(name).segments if s.last_error]


def run_until_failed(app: el.App, names: list[str], timeout: float = 20.0) -> None:
    app.start(names)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(errors(app, n) for n in names):
            time.sleep(0.05)
    finally:
        app.stop()
    assert all(errors(app, n) for n in names), "no failure recorded"


def two_aggregations(url: str) -> tuple[el.App, el.Aggregation, el.Aggregation]:
    app = el.App(url, claim_timeout=5)
    by_lambda = app.aggregation("by-lambda", key=lambda e: e.data["robot"],
                                initial=lambda: {"n": 0}, persist_every=0.05)  # fmt: skip
    by_field = app.aggregation("by-field", key="robot", initial=lambda: {"n": 0},
                               persist_every=0.05)  # fmt: skip
    by_lambda.on("Fastened")(count)
    by_field.on("Fastened")(count)
    return app, by_lambda, by_field


def test_an_int_key_is_refused_never_merged_with_its_text(store_url: str) -> None:
    """Before: 5 and "5" were folded into one state "5" (n == 2)."""
    app, by_lambda, by_field = two_aggregations(store_url)
    app.store.append("s", [E("Fastened", {"robot": "5"})])
    run_until_caught_up(app, 30, ["by-lambda", "by-field"])
    app.store.append("s", [E("Fastened", {"robot": 5})])
    run_until_failed(app, ["by-lambda", "by-field"])
    for agg in (by_lambda, by_field):
        assert agg.get("5") == {"n": 1}
        (error,) = errors(app, agg.name)
        assert "event 2 (Fastened)" in error and "is int 5" in error, error
        assert "must be a string" in error
    app.close()


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "bool True"), (1.5, "float 1.5"), ({"a": 1}, "dict {'a': 1}"), ([1], "list [1]")],
)
def test_a_lambda_key_and_a_property_key_refuse_alike(
    store_url: str, value: Any, shown: str
) -> None:
    """Before: True was stored as "True" by a lambda key and as "true" by key="robot"."""
    app, by_lambda, by_field = two_aggregations(store_url)
    app.store.append("s", [E("Fastened", {"robot": value})])
    run_until_failed(app, ["by-lambda", "by-field"])
    got = [errors(app, n)[0].replace(f"'{n}'", "'agg'") for n in ("by-lambda", "by-field")]
    assert got[0] == got[1], got
    assert f"is {shown}" in got[0], got
    for text in ("True", "true", "1.5", '{"a": 1}', "{'a': 1}", "[1]"):
        assert by_lambda.get(text) is None and by_field.get(text) is None
    app.close()


def test_a_missing_or_null_key_is_refused_alike(store_url: str) -> None:
    """Before: key="robot" folded {"robot": null} into a state named "null"."""
    app = el.App(store_url, claim_timeout=5)
    by_lambda = app.aggregation("by-lambda", key=lambda e: e.data.get("robot"),
                                initial=lambda: {"n": 0}, persist_every=0.05)  # fmt: skip
    by_field = app.aggregation("by-field", key="robot", initial=lambda: {"n": 0},
                               persist_every=0.05)  # fmt: skip
    by_lambda.on("Fastened")(count)
    by_field.on("Fastened")(count)
    app.store.append("s", [E("Fastened", {"robot": None})])
    run_until_failed(app, ["by-lambda", "by-field"])
    for agg in (by_lambda, by_field):
        (error,) = errors(app, agg.name)
        assert "event 1 (Fastened)" in error and "key is None" in error, error
        assert agg.get("null") is None and agg.get("None") is None
    app.close()


def test_get_refuses_what_cannot_be_a_key(store_url: str) -> None:
    """Before: get(5) was None on SQLite while state "5" existed, a raw psycopg error
    (text = smallint) on PostgreSQL."""
    app, by_lambda, _ = two_aggregations(store_url)
    stage = by_lambda.downstream("totals", key=lambda out: out.data["k"], initial=dict)
    app.store.append("s", [E("Fastened", {"robot": "5"})])
    run_until_caught_up(app, 30, ["by-lambda"])
    assert by_lambda.get("5") == {"n": 1}  # a string key reads back as it always did
    for bad in (5, 5.0, True, None, b"5", ("5",)):
        with pytest.raises(el.InvalidInputError, match=r"by-lambda.*a key is a string, got"):
            by_lambda.get(bad)  # type: ignore[arg-type]
        with pytest.raises(el.InvalidInputError, match=r"totals.*a key is a string, got"):
            stage.get(bad)  # type: ignore[arg-type]
    app.close()


def test_a_stage_key_that_is_not_a_string_is_refused(store_url: str) -> None:
    """Before: the stage's key was str() of it: 5 and "5" one downstream state."""
    app = el.App(store_url, claim_timeout=5)
    agg = app.aggregation("up", key="robot", initial=lambda: {"n": 0}, persist_every=0.05)

    @agg.on("Fastened")
    def emit(state: dict, event: el.Event) -> list[el.NewEvent]:
        state["n"] += 1
        return [E("Counted", {"k": event.data["line"]})]

    totals = agg.downstream("totals", key=lambda out: out.data["k"], initial=lambda: {"n": 0})
    totals.on("Counted")(count)
    app.store.append("s", [E("Fastened", {"robot": "r1", "line": "7"})])
    run_until_caught_up(app, 30, ["up"])
    app.store.append("s", [E("Fastened", {"robot": "r1", "line": 7})])
    run_until_failed(app, ["up"])
    (error,) = errors(app, "up")
    assert "stage 'totals'" in error and "is int 7" in error, error
    assert totals.get("7") == {"n": 1}
    app.close()


@pytest.mark.parametrize("pushdown", [True, False])
def test_a_declared_key_that_is_not_a_string_is_refused(store_url: str, pushdown: bool) -> None:
    """Before: a number as a declared key was folded under its JSON text ("5" with "5")."""
    app = el.App(store_url, claim_timeout=5)
    agg = app.aggregation("declared", key="robot", on="Fastened", fields={"n": el.count()},
                          persist_every=0.05, pushdown=pushdown)  # fmt: skip
    app.store.append("s", [E("Fastened", {"robot": "5"}) for _ in range(3)])
    run_until_caught_up(app, 30, ["declared"])
    app.store.append("s", [E("Fastened", {"robot": 5})])
    run_until_failed(app, ["declared"])
    (error,) = errors(app, "declared")
    assert "event 4 (Fastened)" in error and "is int 5" in error, error
    assert agg.get("5") == {"n": 3}
    app.close()


def test_states_stored_before_read_back(store_url: str) -> None:
    """A previous release stored an int key 5 as "5" (and True as "True" or "true"): those
    rows stay, read back by their text, and a key function that renders its key as text on
    purpose (``str(...)``) goes on folding into them."""
    app = el.App(store_url, claim_timeout=5)
    old = app.aggregation("robots", key=lambda e: str(e.data["robot"]),
                          initial=lambda: {"n": 0}, persist_every=0.05)  # fmt: skip
    old.on("Fastened")(count)
    table = app.db.table("aggregates")
    with app.db.transaction() as conn:  # rows as the previous release wrote them
        for key in ("5", "True", "true"):
            conn.execute(
                app.db.sql(
                    f"INSERT INTO {table} (aggregation, key, value, offsets, dropped, "
                    "updated_at) VALUES (?, ?, ?, ?, 0, 0)"
                ),
                ("robots", key, '{"n": 4}', "{}"),
            )
    assert old.get("5") == old.get("True") == old.get("true") == {"n": 4}
    app.store.append("s", [E("Fastened", {"robot": 5})])
    run_until_caught_up(app, 30, ["robots"])
    assert old.get("5") == {"n": 5}
    app.close()


def test_spark_refuses_a_key_that_is_not_a_string_as_the_local_engine(spark, tmp_path) -> None:
    """Before: Spark folded 5 into state "5" (the key's text, with the string "5"): a lambda
    key, key="robot" and a declared key alike. Now each replay fails naming the event, and
    writes nothing."""
    app = el.App(f"sqlite:///{tmp_path}/s.db", claim_timeout=5)
    aggs = {}
    for name, key in (("lam", lambda e: e.data["robot"]), ("fld", "robot")):
        aggs[name] = app.aggregation(name, key=key, initial=lambda: {"n": 0}, segments=4)
        aggs[name].on("Fastened")(count)
    aggs["dec"] = app.aggregation("dec", key="robot", on="Fastened", fields={"n": el.count()},
                                  segments=4)  # fmt: skip
    robots = [f"r{i % 7}" for i in range(30)] + ["5"]
    app.store.append("s", [E("Fastened", {"robot": r}) for r in robots])
    names = ["lam", "fld", "dec"]
    for name in names:
        el.spark.replay(app, name, spark=spark)
    want = {r: {"n": robots.count(r)} for r in set(robots)}
    for name in names:
        assert {r: aggs[name].get(r) for r in want} == want, name
    app.store.append("s", [E("Fastened", {"robot": 5})])
    for name in names:
        with pytest.raises(el.InvalidInputError, match=r"event 32 \(Fastened\).*int.*string"):
            el.spark.replay(app, name, spark=spark)
        assert aggs[name].get("5") == {"n": 1}, name
    app.close()
