"""Declarative aggregations folded inside SQLite (processing/pushdown.py) give exactly what the
row path gives: the same aggregation run both ways over the same store (skewed keys, several
segments, filters, every operation, nulls and missing values, other types, republished
duplicates, a reset replay, a restart) has equal states, offsets, dropped counts and tokens;
and every range the pushdown cannot fold exactly takes the row path, with its errors."""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes.hashing import stable_hash
from eventlanes.processing.aggregating.pushdown import base as pushdown
from eventlanes.processing.aggregating.pushdown import build
from tests.processing_helpers import run_until_caught_up, wait_for
from tests.test_declarative import stored

E = el.NewEvent
ROOT = Path(__file__).resolve().parent.parent
FIELDS = {
    "events": el.count(),
    "ok": el.count(where={"status": "ok"}),
    "sevens": el.count(where={"n": 7}),
    "with_v": el.count("v"),
    "n": el.sum("n"),
    "n_ok": el.sum("n", where={"status": "ok", "big": False}),
    "lo": el.min("v"),
    "hi": el.max("v"),
    "first_v": el.first("v", int),
    "last_v": el.last("v", int, where={"big": True}),
    "lo_s": el.min("s", str),
    "hi_s": el.max("s", str),
    "first_s": el.first("s"),
    "last_s": el.last("s"),
    "last_big": el.last("big", bool),
    "first_o": el.first("o"),
}
#: what a range merged into the stored states inside the database takes (pushdown.placeable)
PLACEABLE = {out: op for out, op in FIELDS.items() if op.kind not in ("first", "last")}
NAMES = ["push", "rows"]


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of a few hundred positions, so a test folds many of them (and mixes them with
    ranges that take the row path)."""
    monkeypatch.setattr(pushdown, "SPAN", 700)
    monkeypatch.setattr(pushdown, "PLACE_SPAN", 700)
    monkeypatch.setattr(pushdown, "TEXT_SPAN", 150)


def define(app: el.App, fields: dict[str, Any] = FIELDS, segments: int = 4) -> None:
    for name in NAMES:
        app.aggregation(name, key="robot", on=["Fastened", "Loosened"], fields=fields,
                        segments=segments, persist_every=0.05, batch_size=97,
                        pushdown=name == "push")  # fmt: skip


def data(rng: random.Random) -> dict[str, Any]:
    d: dict[str, Any] = {"robot": f"r{int(rng.paretovariate(1.1)) % 300}",
                         "n": rng.randrange(-5, 12), "status": rng.choice(["ok", "ok", "no"]),
                         "big": rng.random() < 0.3}  # fmt: skip
    if (r := rng.random()) < 0.7:
        d["v"] = rng.randrange(-1000, 1000)
    elif r < 0.8:
        d["v"] = None  # null: skipped like a missing property
    if (r := rng.random()) < 0.6:
        d["s"] = rng.choice(["a", "b", "ü", 'q"uote', "zz", "é€"])
    elif r < 0.7:
        d["s"] = None
    if rng.random() < 0.3:
        d["o"] = rng.choice([{"x": [1, 2]}, 2.5, True, "t", [None]])  # str: as JSON text
    if rng.random() < 0.1:
        d["other"] = {"deep": [1, {"w": 3}], "at": "1e5"}
    return d


def load(store: el.EventStore, events: int, seed: int, chains: float = 0.0) -> None:
    """Skewed keys; other types interleaved; with ``chains``: that share of events are
    republished outputs, some appended twice (a republisher's crash window)."""
    rng = random.Random(seed)
    sent: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for i in range(events // 40):
        batch = []
        for j in range(40):
            d, meta = data(rng), {}
            if rng.random() < chains:
                if sent and rng.random() < 0.3:
                    d, meta = sent[rng.randrange(len(sent))]
                else:
                    meta = {
                        "source_chain": [
                            {
                                "source": "up",
                                "partition": "",
                                "offset": seed * 10**6 + i * 40 + j,
                                "out": 0,
                            }
                        ]
                    }
                    sent.append((d, meta))
            kind = rng.choice(["Fastened"] * 6 + ["Loosened", "Painted"])
            batch.append(E(kind, d, meta))
        store.append(f"cell-{i % 7}", batch)


def tokens(app: el.App, name: str) -> list[tuple[int, int, int]]:
    return sorted((s.segment.id, s.segment.mask, s.position) for s in app.status(name).segments)


def run(app: el.App) -> None:
    run_until_caught_up(app, 120, NAMES)


def assert_same(app: el.App) -> dict[str, tuple[Any, Any, int]]:
    want = stored(app, "rows")
    assert want
    assert stored(app, "push") == want
    assert tokens(app, "push") == tokens(app, "rows")
    return want


def aggregation(app: el.App, name: str) -> el.Aggregation:
    agg = app.get(name)
    assert isinstance(agg, el.Aggregation)
    return agg


@pytest.mark.parametrize("segments", [1, 4])
def test_pushdown_equals_the_row_path(tmp_path: Path, segments: int) -> None:
    app = el.App(f"sqlite:///{tmp_path}/p.db", claim_timeout=5)
    define(app, segments=segments)
    load(app.store, 4000, seed=segments)
    run(app)
    want = assert_same(app)
    push, rows = aggregation(app, "push"), aggregation(app, "rows")
    assert push.pushed_down > 2000 and rows.pushed_down == 0  # the pushdown ran, mostly
    hot = max(want, key=lambda k: want[k][0]["events"])
    assert want[hot][0]["events"] > 300 and want[hot][0]["first_o"] is not None
    # Continuing over stored states (a restart in the middle): tokens and states resumed.
    load(app.store, 2000, seed=10 + segments)
    run(app)
    assert assert_same(app) != want
    assert push.pushed_down > 3000


def test_republished_duplicates_take_the_row_path(tmp_path: Path) -> None:
    """Ranges with source chains are deduped event by event (the row path); the ranges before
    and after them are folded in SQL; duplicates are dropped alike."""
    app = el.App(f"sqlite:///{tmp_path}/c.db", claim_timeout=5)
    define(app)
    load(app.store, 1500, seed=1)
    load(app.store, 1500, seed=2, chains=0.5)
    load(app.store, 1500, seed=3)
    run(app)
    want = assert_same(app)
    assert sum(d for _, _, d, _ in want.values()) > 50
    assert any("up" in offsets for _, offsets, _, _ in want.values())
    assert 1500 < aggregation(app, "push").pushed_down < 4000


@pytest.mark.parametrize(
    ("fields", "segments"), [(FIELDS, 2), (PLACEABLE, 1)], ids=["in memory", "in place"]
)
def test_reset_replay_over_folded_inputs(
    tmp_path: Path, fields: dict[str, Any], segments: int
) -> None:
    """After a reset the states keep offsets past the token: the replayed inputs are dropped
    (by the row path: the pushdown refuses a range its states have seen, and a statement
    merging in place refuses their rows, writing nothing), the new ones folded."""
    app = el.App(f"sqlite:///{tmp_path}/r.db", claim_timeout=5)
    define(app, fields, segments=segments)
    load(app.store, 3000, seed=4)
    run(app)
    before = assert_same(app)
    folded = app.store.head()
    placed = aggregation(app, "push").placed
    for name in NAMES:
        app.reset(name, to=1000)
    load(app.store, 1000, seed=5)
    run(app)
    after = assert_same(app)
    dropped = sum(d for _, _, d, _ in after.values()) - sum(d for _, _, d, _ in before.values())
    replayed = sum(1 for e in app.store.iter_events(1000, until=folded) if e.type != "Painted")
    assert dropped == replayed > 1000
    assert all(s.position == app.store.head() for s in app.status("push").segments)
    # The new events, after the replay, merged in place where the fields and segments allow.
    assert (aggregation(app, "push").placed > placed) == (fields is PLACEABLE)


def raw_insert(
    path: Path, rows: list[tuple[str, bytes | str]], metadata: bytes | str = "{}"
) -> None:
    """Events written behind the store's back: (type, data as stored), with ``metadata``."""
    conn = sqlite3.connect(path)
    last = conn.execute("SELECT coalesce(max(position), 0) FROM el_events").fetchone()[0]
    for i, (kind, text) in enumerate(rows, 1):
        conn.execute(
            "INSERT INTO el_events (position, stream_id, version, type, data, metadata, "
            "recorded_at, routing_hash) VALUES (?, ?, 1, ?, CAST(? AS TEXT), "
            "CAST(? AS TEXT), 0, ?)",
            (last + i, f"raw-{last + i}", kind, text, metadata, stable_hash(f"raw-{last + i}")),
        )
    conn.commit()
    conn.close()


def errors(app: el.App, name: str) -> list[str]:
    """The segments' errors (the aggregation's name in them made neutral)."""
    found = [s.last_error for s in app.status(name).segments if s.last_error]
    return sorted(e.replace(f"'{name}'", "'agg'") for e in found)


def run_until_settled(app: el.App, timeout: float = 10.0) -> None:
    """Run until both aggregations are caught up or both recorded a failure (a stored row
    that fails the fold stops its segment: waiting for caught-up would wait out the timeout);
    whatever differs after ``timeout`` is left for the caller's comparison to report."""
    app.start(NAMES)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(errors(app, n) for n in NAMES):
            try:
                app.wait_until_caught_up(0.2, NAMES)
                return
            except TimeoutError:
                pass
    finally:
        app.stop()


def run_until_failed(app: el.App) -> None:
    """Run until both aggregations recorded their failure."""
    run_until_settled(app, timeout=30)
    assert all(errors(app, n) for n in NAMES), "no failure recorded"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"robot": "r1", "n": "2"}',
            r"event \d+ \(Fastened\): data property 'n' is '2', declared int",
        ),
        ('{"robot": "r1", "n": 1.5}', r"data property 'n' is 1.5, declared int"),
        ('{"robot": "r1", "n": true}', r"data property 'n' is True, declared int"),
        ('{"robot": "r1", "n": 9223372036854775808}', r"declared int \(64-bit\)"),
        ('{"n": 1}', r"no key property 'robot'"),
        ('{"robot": "r1", "n": 1, "x": 1e400}', r"not valid JSON"),
        ('{"robot": "r1", "n": 1,}', r"not valid JSON"),
        (b'{"robot": "r1", "n": 1, "s": "\xe9t\xe9"}', r"not valid UTF-8"),
    ],
)
def test_what_the_pushdown_cannot_fold_fails_as_on_the_row_path(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    app = el.App(f"sqlite:///{tmp_path}/f.db", claim_timeout=5)
    define(app, {"n": el.sum("n"), "events": el.count()}, segments=1)
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(50)])
    raw_insert(tmp_path / "f.db", [("Fastened", text)])
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(50)])
    run_until_failed(app)
    push, rows = errors(app, "push"), errors(app, "rows")
    assert push == rows
    assert re.search(message, push[0]), push


@pytest.mark.parametrize(
    "text",
    [
        '{"robot": "r1", "n": 1, "n": 5}',  # Python takes the last, SQLite the first
        '{"robot": "r1", "robot": "r2", "n": 2}',
        '{"robot": "r1", "\\u006e": 7}',  # an escaped name: the same property for Python
        '{"robot": "r\\"1", "n": 3}',  # a key with an escape
        '{"robot": 12, "n": 3}',  # a number as key: refused alike
        '{"robot": "r1", "n": 3, "deep": ' + "[" * 1500 + "]" * 1500 + "}",
        '{"robot": "r1", "n": 3, "deep": {"n": 4}}',  # a nested name: not the property
        '{"robot": "r1", "n": 3, "x": 1E+999}',  # infinity for SQLite, an error for orjson
        '{"robot": "r1", "n": 3, "x": ' + "7" * 5000 + "}",  # past Python's 4,300 digits
    ],
)
def test_json_read_differently_takes_the_row_path(tmp_path: Path, text: str) -> None:
    """Stored text that SQLite would read differently from Python (or not at all) is folded
    by rows: results equal the row path's, or both fail alike."""
    app = el.App(f"sqlite:///{tmp_path}/j.db", claim_timeout=5)
    define(app, {"n": el.sum("n"), "events": el.count(), "last_n": el.last("n", int)})
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(30)])
    raw_insert(tmp_path / "j.db", [("Fastened", text)])
    app.store.append("s", [E("Fastened", {"robot": "r2", "n": 1}) for _ in range(30)])
    run_until_settled(app)
    assert errors(app, "push") == errors(app, "rows")
    if not errors(app, "rows"):
        assert_same(app)


def test_pushdown_off_and_other_stores_take_the_row_path(tmp_path: Path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/o.db")
    app.aggregation("f", key="robot", on="Fastened", fields={"t": el.max("t", float)})
    app.aggregation("py", key="robot", initial=dict).on("Fastened")(lambda s, e: None)
    for name, decl in [("f", app.get("f")), ("py", app.get("py"))]:
        plan = build(getattr(decl, "declaration", None), [app.store], True)
        assert plan is None, name  # floats; Python folds
    with pytest.raises(el.InvalidInputError, match="pushdown must be True or False"):
        app.aggregation("x", key="robot", on="Fastened", fields={"n": el.count()}, pushdown=1)


def test_pushdown_while_events_arrive(tmp_path: Path) -> None:
    """A tailing aggregation: bursts appended while it runs, ranges ending at the head (an
    empty range there must not hide the events appended next)."""
    app = el.App(f"sqlite:///{tmp_path}/t.db", claim_timeout=5)
    define(app, segments=2)
    app.start(NAMES)
    try:
        for seed in range(12):
            load(app.store, 120, seed=seed)
            time.sleep(0.1)
        app.wait_until_caught_up(60, NAMES)
    finally:
        app.stop()
    assert_same(app)
    assert sum(v["events"] for v, _, _, _ in stored(app, "push").values()) > 1000
    assert aggregation(app, "push").pushed_down > 0


# -- traced events: metadata that holds a trace context, not a source chain ------------------
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_traced_events_are_still_folded_in_sqlite(tmp_path: Path, recorded_spans) -> None:
    """Appends made under a span carry a ``traceparent`` in their metadata: turning tracing on
    must not send a rebuild to the row path (their metadata is no source chain)."""
    from opentelemetry import trace

    app = el.App(f"sqlite:///{tmp_path}/t.db", claim_timeout=5)
    define(app)
    with trace.get_tracer("tests").start_as_current_span("import"):
        load(app.store, 4000, seed=5)
    assert all("traceparent" in e.metadata for e in app.store.read(limit=4000))
    run(app)
    assert_same(app)
    assert aggregation(app, "push").pushed_down > 2000  # the pushdown ran, mostly


def test_traced_events_with_chains_take_the_row_path(tmp_path: Path, recorded_spans) -> None:
    """Traced and chained (a republisher's outputs appended under a span): deduped event by
    event, the traced ranges around them folded in SQL, equal states either way."""
    from opentelemetry import trace

    app = el.App(f"sqlite:///{tmp_path}/c.db", claim_timeout=5)
    define(app)
    with trace.get_tracer("tests").start_as_current_span("import"):
        load(app.store, 1500, seed=1)
        load(app.store, 1500, seed=2, chains=0.5)
        load(app.store, 1500, seed=3)
    run(app)
    want = assert_same(app)
    assert sum(d for _, _, d, _ in want.values()) > 50
    assert 1500 < aggregation(app, "push").pushed_down < 4000


_CHAIN = '[{"source": "up", "partition": "", "offset": 1, "out": 0}]'


@pytest.mark.parametrize(
    "metadata",
    [
        # an escaped name that Python reads as source_chain
        f'{{"traceparent": "{TRACEPARENT}", "source\\u005fchain": {_CHAIN}}}',
        f'{{"traceparent": "{TRACEPARENT}", "source_chain": null}}',  # no chain for Python
        f'{{"source_chain": [], "source_chain": {_CHAIN}}}',  # named twice: Python takes the last
        f'{{"traceparent": "{TRACEPARENT}", "x": 1E+999}}',  # infinity for SQLite
        f'{{"traceparent": "{TRACEPARENT}",}}',  # not JSON
        '["traceparent"]',  # not an object
        f'{{"traceparent": "{TRACEPARENT}", "deep": {"[" * 1500 + "]" * 1500}}}',
        b'{"traceparent": "\xe9t\xe9"}',  # not UTF-8
    ],
)
def test_metadata_read_differently_takes_the_row_path(
    tmp_path: Path, metadata: str | bytes
) -> None:
    """Metadata that might hide a chain from SQLite, or that Python cannot read, is folded by
    rows: results equal the row path's, or both fail alike."""
    app = el.App(f"sqlite:///{tmp_path}/m.db", claim_timeout=5)
    define(app, {"n": el.sum("n"), "events": el.count()})
    traced = {"traceparent": TRACEPARENT}
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}, traced) for _ in range(30)])
    raw_insert(tmp_path / "m.db", [("Fastened", '{"robot": "r1", "n": 5}')] * 2, metadata)
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}, traced) for _ in range(30)])
    run_until_settled(app)
    assert errors(app, "push") == errors(app, "rows")
    if not errors(app, "rows"):
        assert_same(app)


# -- PostgreSQL: ranges read into Arrow and folded there (pushdown_postgres.py) -------------
def pg_app(pg_url: str) -> el.App:
    return el.App(f"{pg_url}?prefix=pd{random.randrange(10**9)}_", claim_timeout=5)


def test_arrow_fold_on_postgres_equals_the_row_path(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every operation, filters, nulls, other types, skewed keys, several segments; then
    republished duplicates and a value Python reads as a float (ranges with
    them take the row path); a restart over stored states."""
    caplog.set_level(logging.DEBUG, "eventlanes.aggregation")  # why a range took the rows
    app = pg_app(pg_url)
    fields = {k: v for k, v in FIELDS.items() if k != "first_o"}  # non-strings: row path
    define(app, fields)
    load(app.store, 3000, seed=21)
    run(app)
    want = assert_same(app)
    push, rows = aggregation(app, "push"), aggregation(app, "rows")
    assert push.pushed_down > 2000 and rows.pushed_down == 0
    before = push.pushed_down
    load(app.store, 1000, seed=22, chains=0.5)
    # (a number as key is refused on both paths: tests/test_keys.py)
    app.store.append("odd", [E("Fastened", {"robot": "12", "n": 3}),
                             E("Fastened", {"robot": "r1", "n": 2, "o": [1.50]})])  # fmt: skip
    # A range holding the chains or the odd events (ranges of 700 positions here) sends reads
    # by rows up to its end, and the first read at or past it tries a range again: where the
    # reads by rows end depends on which segments each read serves, so timing. The clean tail
    # is longer than a range plus a read by rows (388 events), so that try always comes before
    # the head. (With 1,000 events it did not, once under two suites' load: the row path,
    # from a read ending just short of the last refused range's end, took the whole tail.)
    load(app.store, 2000, seed=23)
    run(app)
    assert assert_same(app) != want
    assert sum(d for _, _, d, _ in stored(app, "push").values()) > 50  # duplicates dropped alike
    why = [r.getMessage() for r in caplog.records if "by rows" in r.getMessage()
           or "not merged in place" in r.getMessage()]  # fmt: skip
    assert push.pushed_down > before, why


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"robot": "r1", "n": "2"}, r"event \d+ \(Fastened\): data property 'n' is '2'"),
        ({"robot": "r1", "n": 1.5}, r"data property 'n' is 1.5, declared int"),
        ({"robot": "r1", "n": True}, r"data property 'n' is True, declared int"),
        ({"robot": "r1", "n": 2**63}, r"declared int \(64-bit\)"),
        ({"n": 1}, r"no key property 'robot'"),
    ],
)
def test_what_the_arrow_fold_cannot_fold_fails_as_on_the_row_path(
    pg_url: str, data: dict[str, Any], message: str
) -> None:
    app = pg_app(pg_url)
    define(app, {"n": el.sum("n"), "events": el.count()}, segments=1)
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(50)])
    app.store.append("s", [E("Fastened", data)])
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(50)])
    run_until_failed(app)
    push, rows = errors(app, "push"), errors(app, "rows")
    assert push == rows
    assert re.search(message, push[0]), push


# -- ranges merged into the stored states inside SQLite (one segment, placeable fields) -------
def test_ranges_merged_in_place_equal_the_row_path(tmp_path: Path) -> None:
    """One segment over every key, counts, sums and extremes: each range is folded and merged
    into the stored rows by one statement, with its token; a second catch-up merges into rows
    that exist. Several segments merge in memory (a range is read once for all of them)."""
    app = el.App(f"sqlite:///{tmp_path}/m.db", claim_timeout=5)
    define(app, PLACEABLE, segments=1)
    app.aggregation("four", key="robot", on=["Fastened", "Loosened"], fields=PLACEABLE,
                    segments=4, persist_every=0.05, batch_size=97)  # fmt: skip
    load(app.store, 4000, seed=21)
    run_until_caught_up(app, 120, [*NAMES, "four"])
    want = assert_same(app)
    assert stored(app, "four") == want
    push = aggregation(app, "push")
    assert push.placed > 3000  # a short range at the head, not yet due, merges in memory
    assert aggregation(app, "four").placed == 0 and aggregation(app, "four").pushed_down > 3000
    placed = push.placed
    load(app.store, 2000, seed=22)
    run(app)
    assert assert_same(app) != want
    assert push.placed > placed + 1000


def test_held_states_are_written_before_a_range_is_merged_in_place(tmp_path: Path) -> None:
    """Ranges with source chains are folded by rows into states held in memory; the range
    merged in place after them finds those states written (not lost, not counted twice)."""
    app = el.App(f"sqlite:///{tmp_path}/h.db", claim_timeout=5)
    define(app, PLACEABLE, segments=1)
    # Held in memory longer than the catch-up takes, unless a long range merged in place
    # writes them first (the short last range waits for its write to be due).
    aggregation(app, "push").persist_every = 2.0
    load(app.store, 1500, seed=23)
    load(app.store, 1500, seed=24, chains=0.5)
    load(app.store, 1500, seed=25)
    run(app)
    want = assert_same(app)
    assert sum(d for _, _, d, _ in want.values()) > 50
    assert 1500 < aggregation(app, "push").placed < 4000


def test_sums_past_64_bits_are_merged_in_memory_exactly(tmp_path: Path) -> None:
    """SQLite turns an integer sum that overflows into a float, and reads a stored integer
    past 64 bits as one: such a state is never merged in place (it would be rounded)."""
    app = el.App(f"sqlite:///{tmp_path}/b.db", claim_timeout=5)
    define(app, {"n": el.sum("n"), "hi": el.max("n"), "events": el.count()}, segments=1)
    big = 2**63 - 5
    for n in [big, 10, 7, big]:  # a range each: the sum passes 64 bits at the second
        app.store.append("s", [E("Fastened", {"robot": "r1", "n": n}),
                               *[E("Painted", {}) for _ in range(800)]])  # fmt: skip
        run(app)
    want = assert_same(app)
    assert want["r1"][0] == {"n": 2 * big + 17, "hi": big, "events": 4}
    assert aggregation(app, "push").placed == 1  # only the first range


def serve_placing(url: str) -> None:
    """A worker process: the in-place aggregation over small ranges, until killed."""
    pushdown.PLACE_SPAN = 300
    pushdown.TEXT_SPAN = 150
    app = el.App(url, claim_timeout=5)
    define(app, PLACEABLE, segments=1)
    app.start(["push"])
    while True:
        time.sleep(1)


def test_a_worker_killed_while_merging_in_place_merges_each_event_once(tmp_path: Path) -> None:
    """SIGKILLs at random moments of a catch-up merged in place, while events are appended:
    states and token are one transaction, so the restarted worker neither loses nor repeats
    an event (equal to the row path, nothing dropped)."""
    url = f"sqlite:///{tmp_path}/k.db"
    app = el.App(url, claim_timeout=1)
    define(app, PLACEABLE, segments=1)
    load(app.store, 4000, seed=28)
    code = f"from tests.test_declarative_pushdown import serve_placing; serve_placing({url!r})"
    rng = random.Random(28)
    log = tmp_path / "worker.log"
    for round_ in range(4):
        start = max((s.position for s in app.status("push").segments), default=0)
        load(app.store, 1600, seed=29 + round_)
        worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ),
                                  stderr=log.open("a"))  # fmt: skip
        try:
            wait_for(
                lambda start=start, worker=worker: worker.poll() is not None
                or any(s.position > start for s in app.status("push").segments),
                timeout=60, what="the worker's first range",
            )  # fmt: skip
            assert worker.poll() is None, log.read_text()[-3000:]
            load(app.store, 400, seed=39 + round_)  # appended while it merges
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    run(app)
    want = assert_same(app)
    assert sum(d for _, _, d, _ in want.values()) == 0
    assert sum(v["events"] for v, _, _, _ in want.values()) == sum(
        1 for e in app.store.iter_events() if e.type != "Painted"
    )


# -- PostgreSQL: each range's groups merged into the states inside the database -------------
@pytest.mark.parametrize(("segments", "seed"), [(4, 31), (1, 41)])
def test_ranges_merged_in_place_on_postgres_equal_the_row_path(
    pg_url: str, segments: int, seed: int
) -> None:
    """Each range merged into the states by one statement, with its token: with 4 segments
    its groups read into Arrow and copied into PostgreSQL (each segment its part), with one
    grouped by PostgreSQL itself into a temporary table and checked there. Text extremes
    compare by code point, as in Python; a second catch-up updates the rows; republished
    duplicates in between (merged in memory, by rows) are written before the next range is
    merged in place."""
    app = pg_app(pg_url)
    define(app, PLACEABLE, segments=segments)
    load(app.store, 3000, seed=seed)
    app.store.append("s", [E("Fastened", {"robot": "r1", "s": s}) for s in ["B", "a", "ä", "Z"]])
    run(app)
    want = assert_same(app)
    push = aggregation(app, "push")
    assert push.placed > 2000
    placed = push.placed
    load(app.store, 1000, seed=seed + 1, chains=0.5)
    load(app.store, 3000, seed=seed + 2)
    run(app)
    assert assert_same(app) != want
    assert push.placed > placed
    assert sum(d for _, _, d, _ in stored(app, "push").values()) > 50


def test_a_replay_and_sums_past_64_bits_are_not_merged_in_place_on_postgres(pg_url: str) -> None:
    """A sum leaving 64 bits and offsets at or past the range (a reset) fail the statement:
    nothing is written, and the range is merged in memory, as the row path folds it."""
    app = pg_app(pg_url)
    define(app, {"n": el.sum("n"), "hi": el.max("n"), "events": el.count()}, segments=1)
    big = 2**63 - 5
    for first in [[("r1", big)], [("r1", 10)], []]:  # a range each (Painted: not folded)
        app.store.append("s", [*[E("Fastened", {"robot": r, "n": n}) for r, n in first],
                               E("Fastened", {"robot": "r2", "n": 1}),
                               *[E("Painted", {}) for _ in range(700 - len(first))]])  # fmt: skip
        run(app)
    want = assert_same(app)
    assert want["r1"][0] == {"n": big + 10, "hi": big, "events": 2}  # past 64 bits: exact
    # The first range grouped and merged in PostgreSQL (its sum fits), the second merged in
    # memory (the stored sum would pass 64 bits), the third in place.
    assert aggregation(app, "push").placed == 3
    for name in NAMES:  # r2's last event replayed alone (r1 is before): refused for its offsets
        app.reset(name, to=1000)
    run(app)
    after = assert_same(app)
    assert after["r2"][0] == want["r2"][0] == {"n": 3, "hi": 1, "events": 3}
    assert after["r2"][2] == 1  # dropped as already folded


# -- PostgreSQL: one segment, ranges grouped in the database: what it must not group -------
def pg_append_raw(app: el.App, rows: list[tuple[str, str]], metadata: str = "{}") -> None:
    """Events appended as JSON text (``(type, data)``), as another client could: PostgreSQL
    reads it, Python never wrote it."""
    store = app.store
    with store.db.transaction() as conn:  # type: ignore[attr-defined]
        for i, (kind, text) in enumerate(rows):
            conn.execute(
                f"SELECT {store.events_table}_append(%s, NULL, %s, ARRAY[%s], "  # type: ignore[attr-defined]
                "ARRAY[%s::jsonb], ARRAY[%s::jsonb])",
                (f"raw-{i}-{random.randrange(10**9)}", stable_hash("raw"), kind, text, metadata),
            )


@pytest.mark.parametrize(
    "text",
    [
        '{"robot": "r1", "n": 1.0}',  # a float in Python: refused alike
        '{"robot": "r1", "n": 1e2}',  # 100 in PostgreSQL's text, an int in Python
        '{"robot": "r1", "n": true}',
        '{"robot": "r1", "n": "4"}',
        '{"robot": 12, "n": 3}',  # a number as key: refused alike
        '{"robot": "r1", "n": 4611686018427387904}',  # 2**62: twice passes 64 bits
        '{"robot": "r1", "n": 3, "s": 5}',  # a text minimum over a number's JSON text
        '{"robot": "r1", "n": 3, "deep": ' + "[" * 1500 + "]" * 1500 + "}",
        '{"robot": "r1", "n": 3, "x": 1e5000}',  # 5,001 digits in Python: past its limit
        '{"robot": "r1", "n": 3, "n": 9}',  # PostgreSQL keeps the last, as Python
        "[1, 2]",
    ],
)
def test_json_postgres_groups_differently_takes_the_row_path(pg_url: str, text: str) -> None:
    """Stored JSON that the grouping statement would read otherwise than Python reads
    PostgreSQL's text of it is folded by rows: the states equal the row path's, or both
    fail alike."""
    app = pg_app(pg_url)
    fields = {"n": el.sum("n"), "hi": el.max("n"), "events": el.count(),
              "lo_s": el.min("s", str), "ok": el.count(where={"status": "ok"})}  # fmt: skip
    define(app, fields, segments=1)
    app.store.append("s", [E("Fastened", {"robot": "r1", "n": 1}) for _ in range(30)])
    pg_append_raw(app, [("Fastened", text), ("Fastened", text)])
    app.store.append("s", [E("Fastened", {"robot": "r2", "n": 1, "status": "ok"})] * 30)
    app.store.append("s", [E("Painted", {})] * 700)  # a whole range: merged in place
    run_until_settled(app)
    assert errors(app, "push") == errors(app, "rows")
    if not errors(app, "rows"):
        assert_same(app)
        exact = "1e2" in text or '"n": 9' in text  # PostgreSQL's text reads alike
        assert aggregation(app, "push").placed == (62 if exact else 0)


def test_a_chain_under_an_escaped_name_takes_the_row_path_on_postgres(pg_url: str) -> None:
    """Metadata naming ``source_chain`` with an escape is a chain for Python: the range is
    deduped by rows (the second delivery dropped), as on the row path."""
    app = pg_app(pg_url)
    define(app, {"n": el.sum("n"), "events": el.count()}, segments=1)
    chain = '{"source_\\u0063hain": [{"source": "up", "partition": "", "offset": 7, "out": 0}]}'
    for _ in range(2):
        pg_append_raw(app, [("Fastened", '{"robot": "r1", "n": 5}')], metadata=chain)
    app.store.append("s", [E("Painted", {})] * 700)  # a whole range: merged in place
    run(app)
    want = assert_same(app)
    assert want["r1"][0] == {"n": 5, "events": 1}
