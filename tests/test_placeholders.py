"""One placeholder style on both backends: ``?`` in ``ctx.execute``, ``ctx.executemany`` and
``app.db.query``, translated for PostgreSQL where it is a placeholder and nowhere else."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import eventlanes as el
from eventlanes.db.placeholders import for_psycopg, scan, translated
from tests.conftest import _unique_prefix
from tests.processing_helpers import context_in

PROCESSORS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "processors.md"

SAME = [  # no ? placeholder: psycopg gets the statement as written
    "SELECT 1",
    "SELECT '?' , \"a?b\" FROM t",
    "SELECT E'it\\'s ?' , e'\\\\' , 'x'' ?'",
    "SELECT $$ ? $$, $tag$ it's ? $tag$",
    "SELECT 1 -- why? \n, 2 /* what? /* nested ? */ still ? */",
    "SELECT doc ? 'k' FROM t",
    "SELECT doc ?| array['a', 'b'], doc ?& array['c'] FROM t",
    "SELECT doc @? '$.a ? (@ > 1)' FROM t",
    "SELECT (doc->'x') ? 'k', doc['y'] ? 'k', '{}'::jsonb ? 'k'",
    "SELECT p ?- q, p ?# q, p ?-| q, p ?|| q FROM g",
    "SELECT * FROM t WHERE v = %s AND doc ? 'k'",
    "SELECT a$b$ ? 'k' FROM t",
]
#: psycopg's form of statements written with ?: each %s was a ? placeholder, each %% a %
TRANSLATED = [
    "INSERT INTO parts (usr, part) VALUES (%s, %s)",
    "SELECT * FROM t WHERE a=%s AND b>=%s",
    "SELECT * FROM t WHERE doc ? %s",
    "SELECT * FROM t WHERE doc ?| %s AND x IN (%s)",
    "SELECT %s::jsonb ? 'k'",
    "SELECT * FROM t LIMIT %s OFFSET %s",
    "SELECT CASE WHEN %s THEN %s ELSE %s END",
    "SELECT x BETWEEN %s AND %s, y LIKE %s ESCAPE %s",
    "SELECT 'a%%' || %s, 7 %% 2 -- 100%%?",
    "SELECT %s /* ? */ , '?', \"?\", $$?$$, E'\\'?'",
    "UPDATE t SET n = n + %s WHERE k = %s RETURNING %s",
    "SELECT substring(s FROM %s FOR %s), trim(BOTH %s FROM s)",
    "SELECT x FROM t WHERE %s-1 < x",
]


@pytest.mark.parametrize("sql", SAME)
def test_statements_without_placeholders_are_left_as_written(sql: str) -> None:
    assert scan(sql)[0] == []
    assert translated(sql) == sql


@pytest.mark.parametrize("want", TRANSLATED)
def test_placeholders_are_translated_and_nothing_else(want: str) -> None:
    sql = want.replace("%s", "?").replace("%%", "%")
    assert translated(sql) == want


def test_what_cannot_be_translated_safely_is_refused() -> None:
    with pytest.raises(el.InvalidInputError, match="mixes \\? and %s placeholders"):
        translated("SELECT ? , %s")
    with pytest.raises(el.InvalidInputError, match="numbered placeholders"):
        translated("SELECT ?1")
    with pytest.raises(el.InvalidInputError, match="unterminated '-quoted text"):
        translated("SELECT 'open ?")
    with pytest.raises(el.InvalidInputError, match="unterminated \\$\\$ quote"):
        translated("SELECT $$ ?")
    # %s inside a literal is text, not a placeholder: no mix.
    assert translated("SELECT ?, '%s'") == "SELECT %s, '%%s'"
    # x%step is a modulo, not a %s placeholder.
    assert translated("SELECT x%step + ? FROM t") == "SELECT x%%step + %s FROM t"


def test_statements_without_parameters_keep_psycopgs_escape_or_go_as_written() -> None:
    assert for_psycopg("SELECT 'a%%'", ()) == ("SELECT 'a%%'", ())  # psycopg's %% escape
    assert for_psycopg("SELECT 'a%'", ()) == ("SELECT 'a%'", None)  # as written
    assert for_psycopg("SELECT %s", (1,)) == ("SELECT %s", (1,))


def _query(app: el.App, sql: str, params: tuple = ()) -> list[tuple]:
    with app.db.transaction() as conn:
        return [tuple(r) for r in context_in(app, conn).execute(sql, params).fetchall()]


def test_question_marks_run_the_same_on_both_backends(store_url: str) -> None:
    app = el.App(store_url)
    t = app.db.table("things")
    app.db.run_ddl([f'CREATE TABLE {t} (k TEXT, "we?ird" TEXT, n INTEGER)'])
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        ctx.execute(f"INSERT INTO {t} (k, \"we?ird\", n) VALUES (?, 'lit?', ?)", ("a", 1))
        ctx.executemany(
            f"INSERT INTO {t} VALUES (?, ?, ?) -- rows?", [("b", "x", 2), ("c%", "y", 3)]
        )
    rows = _query(app, f"SELECT k, \"we?ird\", n, '?' FROM {t} WHERE k LIKE ? OR n = ? ORDER BY k",
                  ("c%", 1))  # fmt: skip
    assert rows == [("a", "lit?", 1, "?"), ("c%", "y", 3, "?")]
    assert app.db.query(f"SELECT count(*) FROM {t} WHERE n > ? /* ? */", (1,)) == [(2,)]
    assert _query(app, f"SELECT k FROM {t} WHERE k LIKE 'c%' AND n % 2 = 1") == [("c%",)]
    app.close()


def test_postgresql_operators_with_question_marks_stay_operators(pg_url: str) -> None:
    app = el.App(f"{pg_url}?prefix={_unique_prefix()}")
    t = app.db.table("docs")
    app.db.run_ddl([f"CREATE TABLE {t} (id INTEGER, doc JSONB)"])
    with app.db.transaction() as conn:
        ctx = context_in(app, conn)
        ctx.executemany(f"INSERT INTO {t} VALUES (?, ?::jsonb)",
                        [(1, '{"a": 1, "b": 2}'), (2, '{"a": 5}'), (3, '{"c": 1}')])  # fmt: skip
    ids = lambda sql, params=(): [r[0] for r in _query(app, sql, params)]  # noqa: E731
    assert ids(f"SELECT id FROM {t} WHERE doc ? ? ORDER BY id", ("a",)) == [1, 2]
    assert ids(f"SELECT id FROM {t} WHERE doc ?| array['b', 'c'] AND id > ? ORDER BY id", (0,)) == [
        1,
        3,
    ]
    assert ids(f"SELECT id FROM {t} WHERE doc ?& ?::text[] ORDER BY id", (["a", "b"],)) == [1]
    assert ids(f"SELECT id FROM {t} WHERE doc @? '$.a ? (@ > 2)' AND id <> ?", (9,)) == [2]
    assert ids(f"SELECT id FROM {t} WHERE doc ? 'c'") == [3]
    app.close()


def _first_python_block(page: Path) -> str:
    found = re.search(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert found is not None
    return found.group(1)


def test_the_docs_processors_block_runs_unchanged_on_postgresql(pg_url: str) -> None:
    """Before: "the query has 0 placeholders but 2 parameters were passed", retried forever.
    Only the URL is changed."""
    block = _first_python_block(PROCESSORS_PAGE)
    sqlite_url = 'f"sqlite:///{tempfile.mkdtemp()}/shop.db"'
    assert sqlite_url in block
    with _fresh_database(pg_url) as url:  # the block's table has no prefix: a database of its own
        out = io.StringIO()
        scope: dict = {"__name__": "readme"}
        try:
            with contextlib.redirect_stdout(out):
                code = compile(block.replace(sqlite_url, repr(url)), str(PROCESSORS_PAGE), "exec")
                exec(code, scope)
        finally:
            if "app" in scope:
                scope["app"].close()
    assert out.getvalue().strip() == "[('front-wheel',), ('car',)]"


@contextlib.contextmanager
def _fresh_database(pg_url: str) -> Iterator[str]:
    import psycopg

    name = f"readme_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(pg_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
