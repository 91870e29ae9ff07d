"""Versions of a processor side by side (blue/green), in one process: names and tables per
version, refusals where a version is declared, replays of what the old version had handled,
promote (refused until caught up, with every reason; readers switch), retire (refused while
serving or running; drops tokens, states, dead letters and tables), status, JSON and metrics,
and an app that never declares a version storing exactly what it stored before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.admin.health import MaxLag, processor_document
from eventlanes.cli import main
from eventlanes.names import validate_processor_name
from eventlanes.schema import roles
from tests import legacy_schema
from tests.conftest import _unique_prefix
from tests.processing_helpers import run_until_caught_up
from tests.test_schema import admin, as_role, grant_dml


def _defined(
    app: el.App, version: int, fail_on: int | None = None, ddl: bool = True, **options: Any
) -> Any:
    """Version ``version`` of processor ``orders``: rows in its own ``orders`` table, and a
    ``disallow_replay`` side effect (a row in the shared ``mails`` table)."""
    orders = app.processor("orders", version=version, tables=["orders"], **options)
    mails = app.db.table("mails")

    @orders.on("Placed")
    def project(event: el.Event, ctx: el.Context) -> None:
        if event.position == fail_on:
            raise RuntimeError(f"cannot project {event.position}")
        ctx.execute(f"INSERT INTO {ctx.table('orders')} (position) VALUES (?)", (event.position,))

    @orders.on("Placed")
    @el.disallow_replay
    def mail(event: el.Event, ctx: el.Context) -> None:
        ctx.execute(f"INSERT INTO {mails} (version, position) VALUES (?, ?)",
                    (version, event.position))  # fmt: skip

    if ddl:
        app.db.run_ddl([
            f"CREATE TABLE IF NOT EXISTS {mails} (version INTEGER, position BIGINT)",
            f"CREATE TABLE IF NOT EXISTS {orders.table('orders')} (position BIGINT)",
        ])  # fmt: skip
    return orders


def _place(app: el.App, n: int) -> list[int]:
    return [p for i in range(n) for p in app.store.append(f"o-{i}", [el.NewEvent("Placed")])]


def _mailed(app: el.App, version: int) -> list[int]:
    sql = f"SELECT position FROM {app.db.table('mails')} WHERE version = ? ORDER BY position"
    return [r[0] for r in app.db.query(app.db.sql(sql), (version,))]


def _positions(app: el.App, table: str) -> list[int]:
    return [r[0] for r in app.db.query(f"SELECT position FROM {table} ORDER BY position")]


# -- declaring versions --------------------------------------------------------------------
def test_versions_are_named_and_checked_where_they_are_declared(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/v.db?prefix=shop_")
    one = app.processor("orders", version=1, tables=["orders", "lines"])
    two = app.processor("orders", version=2, tables=["orders"])
    assert (one.name, two.name, two.base, two.version) == ("orders", "orders@v2", "orders", 2)
    assert one.table("orders") == "shop_orders" and two.table("orders") == "shop_orders__v2"
    assert app.get("orders@v2") is two and list(app.processors) == ["orders", "orders@v2"]
    for bad, message in [
        ({"name": "orders@v3"}, "a version is declared with version=N"),
        ({"version": 0}, "version must be a whole number"),
        ({"version": True}, "version must be a whole number"),
        ({"version": "3"}, "version must be a whole number"),
        ({"version": 3, "tables": "orders"}, "tables= is a list of table names"),
        ({"version": 3, "tables": ["Orders"]}, "invalid table name 'Orders'"),
        ({"version": 3, "tables": ["orders__v2"]}, "tables of processor versions"),
        ({"version": 2}, "'orders@v2' is already defined"),
    ]:
        options = {"name": "orders", **bad}
        with pytest.raises(el.InvalidInputError, match=message):
            app.processor(options.pop("name"), **options)
    with pytest.raises(ValueError, match="tables of processor versions"):
        two.table("orders__v3")  # reserved: it would be another version's table
    # Versions route alike and are of one kind; republishers have no versions.
    with pytest.raises(el.InvalidInputError, match="routes events by sequential, its version 1"):
        app.processor("orders", version=3, policy=el.sequential())
    with pytest.raises(el.InvalidInputError, match="versions of a processor must be of the same"):
        app.aggregation("orders", version=3, key="customer", on="Placed",
                        fields={"n": el.count()})  # fmt: skip
    with pytest.raises(el.InvalidInputError, match="a second version of a republisher would"):
        app.republisher("copy", version=2, to_stream="x")
    key = lambda event: event.data["customer"]  # noqa: E731 - one function object for both
    app.processor("mailer", policy=key)
    app.processor("mailer", version=2, policy=key)
    app.processor("per-customer", policy=el.by_data("customer"))
    app.processor("per-customer", version=2, policy=el.by_data("customer"))
    with pytest.raises(el.InvalidInputError, match="routes events by by_data"):
        app.processor("per-customer", version=3, policy=el.by_data("customer", fallback="none"))
    # Aggregations may change their key: their replays are told by the lowest position.
    app.aggregation("totals", key="customer", on="Placed", fields={"n": el.count()})
    agg = app.aggregation("totals", version=2, key="region", on="Placed",
                          fields={"n": el.count()})  # fmt: skip
    assert agg.name == "totals@v2" and agg.token_spec()[3:] == (("totals",), False)
    py = app.aggregation("py", version=2, key="k", initial=dict)
    assert py.downstream("per-day", key=str, initial=dict).name == "per-day@v2"
    # Stored names: only versions from 2 on carry @vN; users never write one.
    for name in ("orders@v1", "orders@v02", "orders@v", "@v2", "a@b"):
        with pytest.raises(el.InvalidInputError, match="invalid processor name"):
            validate_processor_name(name)
    with pytest.raises(el.InvalidInputError, match="no processor of this app declares table"):
        app.table("stock")
    app.processor("returns", tables=["orders"])
    with pytest.raises(el.InvalidInputError, match="declared by orders, returns: name the"):
        app.table("orders")


def test_an_app_that_never_declares_a_version_keeps_everything_as_it_was(store_url) -> None:
    legacy_schema.create(store_url)  # a store of the previous release: processor p at 1
    app = el.App(store_url)
    p = app.processor("p")
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=lambda: {"n": 0})
    table = app.db.table("handled")
    app.db.run_ddl([f"CREATE TABLE {table} (position BIGINT)"])

    @p.on_any
    def handle(event: el.Event, ctx: el.Context) -> None:
        assert ctx.table("handled") == table  # the name it always had
        ctx.execute(f"INSERT INTO {ctx.table('handled')} VALUES (?)", (event.position,))

    @totals.on_any
    def count(state: dict, event: el.Event) -> None:
        state["n"] += 1

    app.store.append("s", [el.NewEvent("C")])
    run_until_caught_up(app)
    assert _positions(app, table) == [2, 3]  # continued from its old token
    assert sorted(app.tokens.processors()) == ["p", "totals"]
    assert app.tokens.versions("p") == app.tokens.versions("totals") == []
    assert totals.get("s") == {"n": 3}
    assert app.table("handled", processor="p") == table
    doc = processor_document(app.status("p"), lambda _: None, MaxLag())
    assert (doc["base"], doc["version"], doc["serving"], doc["behind_events"]) == (
        "p", 1, True, None)  # fmt: skip
    app.close()


# -- blue/green in one process -------------------------------------------------------------
def test_blue_green_replays_promotes_and_retires(store_url) -> None:
    app = el.App(store_url, claim_timeout=2)
    v1 = _defined(app, 1, segments=2)
    _place(app, 30)
    run_until_caught_up(app)
    assert app.table("orders") == v1.table("orders") and app.serving("orders") is v1

    v2 = _defined(app, 2, segments=3)
    with pytest.raises(el.VersionError, match="'orders@v2' has not run yet"):
        app.promote("orders@v2")
    app.initialize("orders@v2")  # it starts here: the 30 events version 1 handled replay
    assert app.status("orders@v2").version == el.VersionView(
        "orders", 2, False, 1, 30, app.tokens.versions("orders")[0].started_at
    )
    _place(app, 10)
    run_until_caught_up(app)
    assert _mailed(app, 1) == list(range(1, 41))
    assert _mailed(app, 2) == list(range(31, 41))  # never for what version 1 had handled
    assert _positions(app, v2.table("orders")) == list(range(1, 41))  # built from history
    assert app.promote("orders") == "orders: readers of 'orders' already see version 1"
    assert app.promote("orders@v2") == (
        "orders@v2: promoted; readers of 'orders' now see version 2 (was version 1)")  # fmt: skip
    assert app.table("orders") == v2.table("orders") and app.serving("orders") is v2
    assert [app.status(n).version.serving for n in ("orders", "orders@v2")] == [False, True]
    # Back and forth: version 1 still runs, so it may serve again.
    app.promote("orders")
    assert app.table("orders", processor="orders") == v1.table("orders")
    app.promote("orders@v2")

    with pytest.raises(el.VersionError, match="readers of 'orders' see it"):
        app.retire("orders@v2")
    app.start(["orders"])
    try:
        with pytest.raises(el.VersionError, match=r"'orders': it is still running \("):
            app.retire("orders")
    finally:
        app.stop()
    plan = app.retire_plan("orders")
    assert (plan.segments, plan.tables, plan.serving) == (2, [v1.table("orders")], 2)
    assert app.retire("orders") == plan
    assert roles.tables_present(app.db, [v1.table("orders"), v2.table("orders")]) == [
        v2.table("orders")]  # fmt: skip
    with pytest.raises(el.VersionError, match="'orders' was retired"):
        app.start(["orders"])  # this app still defines it: refused, never replayed from 0
    assert app.tokens.claim("orders", 0, "an-old-node") is None
    with pytest.raises(el.VersionError, match="retired already"):
        app.retire("orders")
    _place(app, 3)
    run_until_caught_up(app, processors=["orders@v2"])
    assert _mailed(app, 2) == list(range(31, 44)) and _mailed(app, 1) == list(range(1, 41))
    app.close()


def test_promote_says_every_reason_until_caught_up(store_url) -> None:
    app = el.App(store_url, claim_timeout=2)
    _defined(app, 1)
    _defined(app, 2, fail_on=2, segments=2, on_error="dead_letter")
    _place(app, 4)
    run_until_caught_up(app, processors=["orders"])
    app.initialize("orders@v2")
    with pytest.raises(el.VersionError) as caught:
        app.promote("orders@v2")
    assert "not caught up: 2 of 2 segment(s) short of the head (4); the furthest behind" in str(
        caught.value)  # fmt: skip
    run_until_caught_up(app, processors=["orders@v2"])  # parks event 2
    app.pause("orders@v2")
    seg = app.tokens.status("orders@v2")[0].segment.id
    assert app.tokens.claim("orders@v2", seg, "n1", ignore_pause=True)
    app.tokens.fail("orders@v2", seg, "n1", "RuntimeError: the database said no")
    with pytest.raises(el.VersionError) as caught:
        app.promote("orders@v2")
    reasons = str(caught.value).split(": ", 1)[1].split("; ")
    assert reasons == [
        f"segment {app.tokens.status('orders@v2')[0].segment} is failing: RuntimeError: the "
        "database said no",
        "1 dead letter(s) parked (retry or discard them first)",
        "it is paused",
    ]
    assert app.table("orders") == app.db.table("orders")  # readers were not switched
    app.close()


def test_aggregation_versions_keep_states_of_their_own(store_url) -> None:
    app = el.App(store_url)
    v1 = app.aggregation("totals", key="customer", on="Placed", fields={"n": el.count()})
    for i in range(6):
        app.store.append(f"o-{i}", [el.NewEvent("Placed", {"customer": f"c{i % 2}", "amount": i})])
    run_until_caught_up(app)
    v2 = app.aggregation("totals", version=2, key="customer", on="Placed",
                         fields={"n": el.count(), "amount": el.sum("amount")})  # fmt: skip
    run_until_caught_up(app)
    assert v1.get("c0") == {"n": 3} and v2.get("c0") == {"n": 3, "amount": 6}
    assert app.serving("totals").get("c1") == {"n": 3}
    app.promote("totals@v2")
    assert app.serving("totals").get("c1") == {"n": 3, "amount": 9}
    assert app.retire("totals").states == 2
    assert v1.get("c0") is None and v2.get("c0") == {"n": 3, "amount": 6}
    app.close()


# -- status, JSON, metrics -----------------------------------------------------------------
def test_status_json_and_metrics_show_both_versions(store_url, monkeypatch) -> None:
    from tests.apps import versions_app

    app = versions_app.make_app(store_url)
    monkeypatch.setattr(versions_app, "app", app)  # what the CLI loads (imported before)
    versions_app.create_schema(app)
    for i in range(20):
        app.store.append(f"o-{i}", [el.NewEvent("Placed", {"customer": f"c{i}", "amount": 1})])
    run_until_caught_up(app, processors=["orders"])
    app.initialize("orders@v2")

    done = CliRunner().invoke(main, ["status", "tests.apps.versions_app:app", "--json"])
    doc = {p["name"]: p for p in json.loads(done.output)["processors"]}
    fields = ("base", "version", "serving", "behind_events")
    assert [tuple(doc[n][f] for f in fields) for n in doc] == [
        ("orders", 1, True, None), ("orders", 2, False, 20),
        ("totals", 1, True, None), ("totals", 2, False, None),  # neither has run: no positions
    ]  # fmt: skip
    url_doc = CliRunner().invoke(main, ["status", "--url", store_url, "--json"])
    by_url = {p["name"]: p for p in json.loads(url_doc.output)["processors"]}
    assert [tuple(by_url[n][f] for f in fields) for n in by_url] == [
        ("orders", 1, True, None), ("orders", 2, False, 20)]  # fmt: skip
    text = CliRunner().invoke(main, ["status", "tests.apps.versions_app:app", "orders@v2"])
    assert "orders@v2 (version 2 of orders: not serving, 20 behind the serving version)" in (
        text.output.replace("\n", " "))  # fmt: skip

    from eventlanes.admin.metrics import StatusCollector

    samples = {
        (s.name, s.labels.get("processor")): s.value
        for family in StatusCollector(app, ["orders", "orders@v2"]).collect()
        for s in family.samples
    }
    assert samples[("eventlanes_version_serving", "orders")] == 1.0
    assert samples[("eventlanes_version_serving", "orders@v2")] == 0.0
    assert samples[("eventlanes_version_behind_events", "orders@v2")] == 20.0
    assert ("eventlanes_version_behind_events", "orders") not in samples

    from jinja2 import Environment, FileSystemLoader

    from eventlanes.dashboard import HERE, snapshot

    page = Environment(loader=FileSystemLoader(HERE / "templates")).get_template("body.html")
    html = " ".join(page.render(status=snapshot(app), error=None).split())
    assert "version 2 of orders: not serving, 20 behind</span>" in html
    assert "version 1 of orders" not in html  # the serving version 1 looks as it always did
    app.close()


# -- production roles ----------------------------------------------------------------------
def test_a_dml_only_role_promotes_and_retires_keeping_the_tables(pg_url, role) -> None:

    prefix = _unique_prefix()
    owner = el.App(f"{pg_url}?prefix={prefix}")
    _defined(owner, 1)
    _defined(owner, 2)  # the owner creates the tables (deploy step)
    grant_dml(pg_url, role)
    app = el.App(as_role(pg_url, role, prefix), claim_timeout=2)
    _defined(app, 1, ddl=False)
    _defined(app, 2, ddl=False)
    _place(app, 3)
    run_until_caught_up(app)
    assert app.promote("orders@v2").startswith("orders@v2: promoted")  # DML only: no DDL
    with pytest.raises(el.VersionError, match=f"role '{role}' may not drop {prefix}orders "):
        app.retire("orders")
    assert app.tokens.status("orders")[0].owner is None  # refused before anything changed
    plan = app.retire("orders", keep_tables=True)
    assert (plan.tables, plan.kept) == ([], [f"{prefix}orders"])
    assert "keeps tables" in plan.summary() and app.tokens.retired("orders")
    admin(pg_url, f"DROP TABLE {prefix}orders")  # what the owner does afterwards
    owner.close()
    app.close()


# -- Spark ---------------------------------------------------------------------------------
def test_a_spark_replay_of_a_new_version_keeps_its_replays(spark, tmp_path) -> None:
    """Version 1 handled half of history (one of its two segments ran); version 2 (one
    segment) replayed on Spark mails exactly the other half, and its aggregation's states
    equal the local engine's."""
    app = el.App(f"sqlite:///{tmp_path}/spark.db", claim_timeout=5)
    _defined(app, 1, segments=2)
    for i in range(200):
        app.store.append(f"o-{i % 37}", [el.NewEvent("Placed", {"customer": f"c{i % 7}"})])
    app.start(["orders"], node_index=0, nodes=2)  # only 0/1 runs
    try:
        app.wait_for("orders", [e.position for e in app.store.read(limit=200)
                                if el.Segment(0, 1).matches(e.routing_hash)])  # fmt: skip
    finally:
        app.stop()
    handled = set(_mailed(app, 1))
    assert 0 < len(handled) < 200
    v2 = _defined(app, 2)
    app.aggregation("totals", key="customer", on="Placed", fields={"n": el.count()})
    app.aggregation("totals", version=2, key="customer", on="Placed", fields={"n": el.count()})
    app.initialize("orders@v2")
    el.spark.replay(app, "orders@v2", spark=spark)
    assert set(_mailed(app, 2)) == set(range(1, 201)) - handled
    assert _positions(app, v2.table("orders")) == list(range(1, 201))
    el.spark.replay(app, "totals@v2", spark=spark)
    run_until_caught_up(app, processors=["totals"])
    from eventlanes.testing import states

    assert states(app, "totals@v2") == states(app, "totals") != {}
    app.close()
