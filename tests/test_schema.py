"""The versioned schema: ``eventlanes migrate``, production roles with DML only, stores of the
previous release, stores older or newer than the code, many processes opening at once."""

from __future__ import annotations

import multiprocessing
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from eventlanes.schema import migrations
from tests import legacy_schema
from tests.conftest import _unique_prefix

ROOT = Path(__file__).resolve().parent.parent


def _psycopg():
    import psycopg

    return psycopg


def admin(pg_url: str, *statements: str) -> list[tuple]:
    """Run statements as the server's superuser (the role that owns the tables)."""
    rows: list[tuple] = []
    with _psycopg().connect(pg_url, autocommit=True) as conn:
        for statement in statements:
            cur = conn.execute(statement)
            rows = cur.fetchall() if cur.description else []
    return rows


def relations(pg_url: str, prefix: str) -> list[str]:
    rows = admin(pg_url, f"SELECT relname FROM pg_class WHERE relname LIKE '{prefix}%' "
                         "AND relkind IN ('r', 'S') ORDER BY 1")  # fmt: skip
    return [r[0] for r in rows]


def as_role(pg_url: str, role: str, prefix: str) -> str:
    """The URL of the same database for ``role`` (with a password: it must never be shown)."""
    _, rest = pg_url.split("@", 1)
    return f"postgresql://{role}:s3cret@{rest}?prefix={prefix}"


def grant_dml(pg_url: str, role: str) -> None:
    """The grants of docs/how-to/postgresql.md (Roles and migrations), run by the owner as
    written there: the DML privileges on the tables there are and on those the owner creates
    later."""
    page = (ROOT / "docs" / "how-to" / "postgresql.md").read_text()
    block = re.search(r"```sql\n(.*?)```", page, flags=re.S)
    assert block is not None, "docs/how-to/postgresql.md has no sql block"
    statements = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert statements and all(s.endswith(" TO app;") for s in statements)
    admin(pg_url, *(s.replace(" TO app;", f" TO {role}") for s in statements))


#: the code's schema version, and every migration it applies (tests below add one more: NEXT)
LATEST = migrations.latest()
APPLIED_ALL = ", ".join(f"{m.version} {m.name}" for m in migrations.MIGRATIONS)
ALL_VERSIONS = [(m.version, m.name) for m in migrations.MIGRATIONS]


def versions(url: str) -> list[tuple[int, str]]:
    with el.open_store(url, create=False) as store:
        table = store.db.table("schema_migrations")
        rows = store.db.query(f"SELECT version, name FROM {table} ORDER BY version")
    return [(int(v), n) for v, n in rows]


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eventlanes.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def app_file(folder: Path, url: str) -> str:
    """``eventlanes run``'s argument for an app of one processor on ``url``."""
    (folder / "prod_app.py").write_text(
        f"import eventlanes as el\napp = el.App({url!r})\np = app.processor('p')\n"
        "p.on_any(lambda event, ctx: None)\n"
    )
    return f"{folder}/prod_app.py:app"


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in lines[0]
    return lines[0]


# -- production roles ----------------------------------------------------------------------------
def test_a_dml_only_role_is_told_to_migrate_and_then_runs_the_app(pg_url, role, tmp_path):
    prefix = _unique_prefix()
    owner_url, app_url = f"{pg_url}?prefix={prefix}", as_role(pg_url, role, prefix)
    with pytest.raises(el.SchemaError) as caught:
        el.open_store(app_url)
    message = str(caught.value)
    assert f"has no eventlanes tables, this eventlanes needs schema version {LATEST}" in message
    assert f"role '{role}' may not create tables in schema 'public'" in message
    assert f"eventlanes migrate postgresql://{role}:***@" in message and "s3cret" not in message
    assert relations(pg_url, prefix) == []  # nothing was tried
    # Not a raw InsufficientPrivilege traceback with exit code 1:
    line = one_error_line(cli("run", app_file(tmp_path, app_url), "--no-progress"))
    assert "may not create tables" in line and "eventlanes migrate" in line

    done = CliRunner().invoke(main, ["migrate", owner_url])
    assert done.exit_code == 0, done.output
    assert f"no eventlanes tables -> schema version {LATEST} (applied {APPLIED_ALL})" in done.output
    projection = f"{prefix}handled"
    admin(pg_url, f"CREATE TABLE {projection} (position BIGINT, stream_id TEXT)")
    grant_dml(pg_url, role)

    app = el.App(app_url, claim_timeout=3)
    orders = app.processor("orders", segments=2, on_error="dead_letter")
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=lambda: {"n": 0},
                             persist_every=0.1)  # fmt: skip

    @orders.on_any
    def handle(event: el.Event, ctx: el.Context) -> None:
        if event.stream_id == "bad":
            raise RuntimeError("refused")
        ctx.execute(f"INSERT INTO {projection} VALUES (%s, %s)",
                    (event.position, event.stream_id))  # fmt: skip

    @totals.on_any
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1

    try:
        for i in range(6):
            app.store.append(f"s-{i % 3}", [el.NewEvent("Ordered", {"n": i})])
        app.store.append("bad", [el.NewEvent("Ordered")])
        app.start()
        app.wait_until_caught_up(60)
        app.stop()
        assert app.db.query(f"SELECT count(*) FROM {projection}") == [(6,)]
        assert [d.stream_id for d in app.dead_letter_list("orders")] == ["bad"]
        assert totals.get("s-0") == {"n": 2} and app.status("orders").caught_up
        assert [m.summary() for m in app.migrate()] == [  # current: nothing to do, no DDL
            f"postgresql://{role}:***@{pg_url.split('@', 1)[1]}?prefix={prefix}: schema "
            f"version {LATEST}, up to date (nothing to do)"
        ]
    finally:
        app.close()
    line = one_error_line(cli("migrate", app_url.replace(prefix, _unique_prefix())))
    assert f"role '{role}' may not create tables in schema 'public'" in line


def test_a_role_that_cannot_read_the_tables_gets_one_clear_line(pg_url, role) -> None:
    prefix = _unique_prefix()
    el.migrate(f"{pg_url}?prefix={prefix}")
    url = as_role(pg_url, role, prefix)
    unreadable = f"role {role!r} may not read {prefix}schema_migrations of store "
    with pytest.raises(el.SchemaError, match=unreadable):
        el.open_store(url)
    admin(pg_url, f"GRANT SELECT ON {prefix}schema_migrations TO {role}")
    seq = f"{prefix}events_position_seq"
    line = one_error_line(cli("info", url))  # reads only
    assert f"role '{role}' lacks privileges on store 'postgresql://{role}:***@" in line
    assert f"SELECT on {prefix}events, SELECT on {seq}. Grant " in line
    every = f"SELECT on {prefix}events, INSERT on {prefix}events, USAGE on {seq}, SELECT on {seq}"
    with pytest.raises(el.SchemaError, match=every):
        el.open_store(url)
    # Reading needs SELECT only.
    admin(pg_url, f"GRANT SELECT ON {prefix}events, {prefix}events_position_seq TO {role}")
    with el.open_store(url, create=False) as reader:
        assert reader.head() == 0
    with pytest.raises(el.SchemaError, match=f"INSERT on {prefix}events, USAGE on "):
        el.open_store(url)  # writing needs more
    with pytest.raises(el.SchemaError, match=f"SELECT on {prefix}tokens, SELECT on {prefix}nodes"):
        el.open_token_store(el.open_store(url, create=False).db)


# -- stores of the previous release --------------------------------------------------------------
def test_a_store_of_the_previous_release_is_adopted(store_url: str) -> None:
    legacy_schema.create(store_url)
    with el.open_store(store_url) as store:
        assert [(e.position, e.type, e.data) for e in store.read()] == [
            (1, "A", {}), (2, "B", {"n": 2})]  # fmt: skip
        tokens = el.open_token_store(store.db)
        assert tokens.token("p", 0) == el.Token(1)
        assert store.append("s", [el.NewEvent("C")], expected_version=2) == [3]
    assert versions(store_url) == ALL_VERSIONS
    if store_url.startswith("sqlite"):  # a current store's open reads only
        path = store_url.split("///", 1)[1]
        watcher = sqlite3.connect(path)
        before = watcher.execute("PRAGMA data_version").fetchone()
        el.open_token_store(el.open_store(store_url).db).db.close()
        assert watcher.execute("PRAGMA data_version").fetchone() == before
        watcher.close()


def test_a_dml_role_on_a_store_of_the_previous_release_is_told_to_migrate(pg_url, role) -> None:
    prefix = _unique_prefix()
    owner_url = f"{pg_url}?prefix={prefix}"
    legacy_schema.create(owner_url)
    grant_dml(pg_url, role)
    with pytest.raises(el.SchemaError) as caught:
        el.open_store(as_role(pg_url, role, prefix))
    assert "has tables of an eventlanes release from before schema versions" in str(caught.value)
    assert "may not create tables in schema 'public'" in str(caught.value)
    assert "eventlanes migrate" in str(caught.value)
    # Where every role may create tables (public before PostgreSQL 15), altering ours still
    # needs their owner: nothing is tried either.
    admin(pg_url, f"GRANT CREATE ON SCHEMA public TO {role}")
    with pytest.raises(el.SchemaError, match=f"role '{role}' does not own {prefix}aggregates, "):
        el.open_store(as_role(pg_url, role, prefix))
    assert f"{prefix}schema_migrations" not in relations(pg_url, prefix)
    done = CliRunner().invoke(main, ["migrate", owner_url])
    assert done.exit_code == 0
    assert f"before schema versions -> schema version {LATEST}" in done.output
    with el.open_store(as_role(pg_url, role, prefix)) as store:
        assert store.head() == 2 and store.append("s", [el.NewEvent("C")]) == [3]


# -- stores older or newer than the code ---------------------------------------------------------
def _add_extra_table(db, conn) -> None:
    conn.execute(f"CREATE TABLE {db.table('extra')} (n INTEGER)")


NEXT = migrations.Migration(LATEST + 1, "extra_table", _add_extra_table)


def test_a_store_older_than_the_code_is_migrated_or_refused_and_a_newer_one_refused(
    store_url: str, monkeypatch
) -> None:
    el.open_store(store_url).close()
    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, NEXT))
    older = (
        f"has schema version {LATEST}, this eventlanes needs schema version {LATEST + 1} "
        rf"\(pending: {LATEST + 1} extra_table\)"
    )
    with pytest.raises(el.SchemaError, match=older + ": run `eventlanes migrate"):
        el.open_store(store_url, create=False)
    done = CliRunner().invoke(main, ["migrate", "--check", store_url])
    assert done.exit_code == 1 and f"(pending: {LATEST + 1} extra_table)" in done.output
    with el.open_store(store_url) as store:  # a role that may: migrated at open
        assert store.db.query(f"SELECT count(*) FROM {store.db.table('extra')}") == [(0,)]
    assert versions(store_url) == [*ALL_VERSIONS, (LATEST + 1, "extra_table")]
    done = CliRunner().invoke(main, ["migrate", "--check", store_url])
    assert done.exit_code == 0 and f"schema version {LATEST + 1}, up to date" in done.output
    monkeypatch.undo()  # an older eventlanes meets the store
    for create in (True, False):
        with pytest.raises(el.SchemaError, match=f"has schema version {LATEST + 1}, newer than "
                           rf"this eventlanes \(it knows versions up to {LATEST}\)"):  # fmt: skip
            el.open_store(store_url, create=create)
    assert CliRunner().invoke(main, ["migrate", store_url]).exit_code == 2


def test_a_dml_role_on_a_store_older_than_the_code_is_refused_before_any_ddl(
    pg_url, role, monkeypatch
) -> None:
    prefix = _unique_prefix()
    el.migrate(f"{pg_url}?prefix={prefix}")
    grant_dml(pg_url, role)
    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, NEXT))
    with pytest.raises(el.SchemaError) as caught:
        el.open_store(as_role(pg_url, role, prefix))
    assert f"has schema version {LATEST}, this eventlanes needs schema version {LATEST + 1}" in str(
        caught.value
    )
    assert f"{prefix}extra" not in relations(pg_url, prefix)
    result = el.migrate(f"{pg_url}?prefix={prefix}")
    assert [m.version for m in result.applied] == [LATEST + 1]
    with el.open_store(as_role(pg_url, role, prefix)) as store:
        assert store.head() == 0


# -- concurrency ---------------------------------------------------------------------------------
def _open_and_append(url: str, barrier, results) -> None:
    try:
        barrier.wait(60)
        store = el.open_store(url)
        tokens = el.open_token_store(store.db)
        tokens.initialize("p", segments=2)
        store.append("s", [el.NewEvent("E")])
        store.close()
        results.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {exc}")


def test_many_processes_open_a_new_store_at_once(store_url: str) -> None:
    n = 4
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open_and_append, args=(store_url, barrier, results))
             for _ in range(n)]  # fmt: skip
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert outcomes == ["ok"] * n
    assert versions(store_url) == ALL_VERSIONS
    with el.open_store(store_url) as store:
        assert store.count() == n


def test_app_migrate_covers_a_token_store_in_another_database(tmp_path) -> None:
    events, tokens = f"sqlite:///{tmp_path}/events.db", f"sqlite:///{tmp_path}/tokens.db"
    app = el.App(events, token_store=tokens)
    done = app.migrate()
    assert [(m.before.describe(), m.version) for m in done] == [
        ("no eventlanes tables", LATEST), ("no eventlanes tables", LATEST)]  # fmt: skip
    assert versions(events) == versions(tokens) == ALL_VERSIONS
    assert [m.applied for m in app.migrate()] == [(), ()]
    app.close()


def test_a_token_store_in_another_database_is_refused_what_commits_with_its_token(
    tmp_path,
) -> None:
    """Exactly-once processors and aggregations commit their writes with their token, in the
    store's database: with the tokens elsewhere, each batch rolled back as a lost claim and
    ran again, its side effects repeated for ever, and status showed no error. They are
    refused at start now; an at-least-once processor runs there as before."""
    events, tokens = f"sqlite:///{tmp_path}/events.db", f"sqlite:///{tmp_path}/tokens.db"
    app = el.App(events, token_store=tokens)
    app.migrate()
    seen: list[int] = []
    app.processor("p").on("Hit")(lambda event, ctx: seen.append(event.position))
    app.aggregation("c", key="k", on="Hit", fields={"n": el.count()})
    app.processor("lanes", guarantee="at-least-once").on("Hit")(
        lambda event, ctx: seen.append(-event.position)
    )
    app.store.append("s", [el.NewEvent("Hit", {"k": "a"})])
    for name, kind in [("p", "processor"), ("c", "aggregation")]:
        with pytest.raises(
            el.InvalidInputError,
            match=f"{kind} '{name}' is exactly-once: .* token_store= is another",
        ):
            app.start([name])
        assert not app.running
    assert seen == []
    app.start(["lanes"])
    try:
        app.wait_until_caught_up(30, ["lanes"])
    finally:
        app.stop()
    assert seen == [-1]
    app.close()
