"""Every handler kind is run correctly or refused where it is defined: ``async def`` handlers
are awaited in the batch's transaction, and every function a user hands over (handlers, folds,
keys, mappings, policies...) is checked for its shape when it is registered."""

from __future__ import annotations

import asyncio
import functools
import re
import warnings
from typing import Any

import pytest

import eventlanes as el
from eventlanes.callables import check
from eventlanes.policies import SequencingPolicy
from tests.processing_helpers import run_until_caught_up, wait_for


def _app_with_rows(url: str) -> el.App:
    app = el.App(url)
    app.db.run_ddl([f"CREATE TABLE {app.db.table('rows')} (stream TEXT, version INTEGER)"])
    return app


def _rows(app: el.App) -> list[tuple[Any, ...]]:
    table = app.db.table("rows")
    return [tuple(r) for r in app.db.query(f"SELECT stream, version FROM {table} ORDER BY 1, 2")]


def test_async_handlers_on_an_exactly_once_processor_write_with_the_token(store_url: str) -> None:
    """Before: accepted, "coroutine was never awaited", the token moved past every event and
    no row was written. Now each is awaited in the batch's transaction."""
    app = _app_with_rows(store_url)
    table = app.db.table("rows")
    proc = app.processor("proj", segments=2)
    batches: list[int] = []

    @proc.on("Added")
    async def add(event: el.Event, ctx: el.Context) -> None:
        await asyncio.sleep(0)  # really suspended, then resumed
        p = ctx.param
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", (event.stream_id, event.version))

    async def _later(event: el.Event, ctx: el.Context) -> None:
        await asyncio.sleep(0)
        p = ctx.param
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", ("later", event.version))

    @proc.on("Later")
    def later(event: el.Event, ctx: el.Context) -> Any:
        return _later(event, ctx)  # a plain def returning a coroutine: awaited too

    @proc.on_batch("Added")
    async def count(events: list[el.Event], ctx: el.Context) -> None:
        await asyncio.sleep(0)
        batches.append(len(events))

    for s in range(4):
        app.store.append(f"s{s}", [el.NewEvent("Added") for _ in range(3)])
    app.store.append("l", [el.NewEvent("Later")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "never awaited" would fail the test
        run_until_caught_up(app)
    want = sorted([(f"s{s}", v) for s in range(4) for v in (1, 2, 3)] + [("later", 1)])
    assert _rows(app) == want
    assert sum(batches) == 12
    app.close()


def test_an_async_handler_that_fails_rolls_its_batch_back(store_url: str) -> None:
    """The awaited writes are in the batch's transaction: a failure after them (dead-letter
    mode) leaves no row of the failed event, and the rest of the key waits behind it."""
    app = _app_with_rows(store_url)
    table = app.db.table("rows")
    proc = app.processor("proj", on_error="dead_letter")

    @proc.on("Added")
    async def add(event: el.Event, ctx: el.Context) -> None:
        p = ctx.param
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", (event.stream_id, event.version))
        await asyncio.sleep(0)
        if event.data.get("bad"):
            raise ValueError("bad event")

    app.store.append("ok", [el.NewEvent("Added"), el.NewEvent("Added")])
    app.store.append("ko", [el.NewEvent("Added", {"bad": True}), el.NewEvent("Added")])
    run_until_caught_up(app)
    assert _rows(app) == [("ok", 1), ("ok", 2)]
    parked = app.dead_letter_list("proj")
    assert [(d.seq_key, d.position) for d in parked] == [("ko", 3), ("ko", 4)]
    assert "ValueError: bad event" in parked[0].error
    app.close()


def test_async_reset_handlers_and_dead_letter_retries_are_awaited(store_url: str) -> None:
    app = _app_with_rows(store_url)
    table = app.db.table("rows")
    proc = app.processor("proj", on_error="dead_letter")
    fixed: list[bool] = []

    @proc.on("Added")
    async def add(event: el.Event, ctx: el.Context) -> None:
        if not fixed:
            raise ValueError("not yet")
        p = ctx.param
        ctx.execute(f"INSERT INTO {table} VALUES ({p}, {p})", (event.stream_id, event.version))

    @proc.on_reset
    async def clear(ctx: el.Context) -> None:
        await asyncio.sleep(0)
        ctx.execute(f"DELETE FROM {table}")

    app.store.append("a", [el.NewEvent("Added")])
    run_until_caught_up(app)
    assert _rows(app) == [] and len(app.dead_letter_list("proj")) == 1
    fixed.append(True)
    assert app.retry_dead_letters("proj") == (1, 0)
    assert _rows(app) == [("a", 1)]
    app.reset("proj")
    assert _rows(app) == []
    run_until_caught_up(app)
    assert _rows(app) == [("a", 1)]
    app.close()


def test_an_async_republisher_mapping_is_awaited(tmp_path) -> None:
    app = el.App(f"sqlite:///{tmp_path}/r.db")
    rep = app.republisher("copy", to_stream="copies")

    @rep.on("In")
    async def copy(event: el.Event) -> el.NewEvent:
        await asyncio.sleep(0)
        return el.NewEvent("Out", {"n": event.data["n"]})

    app.store.append("in", [el.NewEvent("In", {"n": i}) for i in range(3)])
    run_until_caught_up(app)
    assert [e.data["n"] for e in app.store.read_stream("copies")] == [0, 1, 2]
    app.close()


def test_a_handler_returning_a_generator_fails_visibly(tmp_path) -> None:
    """A generator's body never runs: refused where it is defined, and failing (not dropped)
    when a plain def returns one."""
    app = el.App(f"sqlite:///{tmp_path}/g.db")
    proc = app.processor("gen")
    with pytest.raises(el.InvalidInputError, match=r"handler .*gen_handler is a generator"):

        @proc.on("E")
        def gen_handler(event: el.Event, ctx: el.Context) -> Any:
            yield event

    def inner(event: el.Event) -> Any:
        yield event

    @proc.on("E")
    def sneaky(event: el.Event, ctx: el.Context) -> Any:
        return inner(event)

    app.store.append("s", [el.NewEvent("E")])
    app.start()
    try:
        view = wait_for(
            lambda: (v := app.status("gen")).segments[0].last_error and v, what="the failure"
        )
    finally:
        app.stop()
    assert view.segments[0].position == 0  # the token did not move past it
    assert "returned a generator: its body never ran" in view.segments[0].last_error
    app.close()


# -- shapes checked at definition ------------------------------------------------------------
def test_a_one_argument_handler_is_refused_at_definition(tmp_path) -> None:
    """Before: accepted, then a TypeError at run time, retried forever."""
    app = el.App(f"sqlite:///{tmp_path}/a.db")
    proc = app.processor("users")
    with pytest.raises(el.InvalidInputError) as caught:

        @proc.on("PartAdded")
        def add_part(event: el.Event) -> None:
            pass

    message = str(caught.value)
    assert "processor 'users': handler" in message and "add_part(event)" in message
    assert "should look like `def add_part(event, ctx)`" in message
    assert not app.get("users").handlers  # nothing was registered


def _proc(tmp_path: Any, **options: Any) -> tuple[el.App, el.Processor]:
    app = el.App(f"sqlite:///{tmp_path}/s.db")
    return app, app.processor("p", **options)


def test_swapped_arguments_are_refused_naming_both(tmp_path) -> None:
    app, proc = _proc(tmp_path)
    with pytest.raises(el.InvalidInputError, match=r"parameter 'ctx' gets the event, not the ctx"):
        proc.on("E")(lambda ctx, event: None)
    agg = app.aggregation("a", key="k", initial=dict)
    with pytest.raises(el.InvalidInputError, match=r"'event' gets the state, not the event"):

        @agg.on("E")
        def fold(event: Any, state: Any) -> None:
            pass

    # A fold registered on a processor by mistake: its 'event' would get the context.
    with pytest.raises(el.InvalidInputError, match=r"'event' gets the ctx, not the event"):
        proc.on_any(lambda state, event: None)


async def _async_one(event: Any) -> Any:
    return event


def _two(a: Any, b: Any) -> None:
    pass


def _none() -> Any:
    return {}


BAD: list[tuple[str, Any]] = [
    # (what is defined, the message it gets)
    ("on_batch one arg", r"on_batch handler .*cannot be called as .*\(events, ctx\)"),
    ("on_reset two args", r"on_reset handler _two\(a, b\) cannot be called as _two\(ctx\)"),
    ("key two args", r"aggregation 'a': key _two\(a, b\) cannot be called as _two\(event\)"),
    ("key async", r"aggregation 'a': key _async_one is an async def"),
    ("initial with arg", r"aggregation 'a': initial _async_one is an async def"),
    ("initial one arg", r"initial .*cannot be called as .*\(\)"),
    ("fold async", r"aggregation 'a': fold _async_one is an async def: folds update the state"),
    ("fold on_any one arg", r"aggregation 'a': fold .*cannot be called as .*\(state, event\)"),
    ("stage key", r"aggregation 'down': key _two\(a, b\)"),
    ("stage fold", r"stage 'down': fold _none\(\) cannot be called as _none\(state, event\)"),
    ("mapping two args", r"republisher 'r': mapping _two\(a, b\) cannot be called"),
    ("to_stream async", r"republisher 'r2': to_stream _async_one is an async def"),
    ("policy two args", r"processor 'q': sequencing policy _two\(a, b\) cannot be called"),
    ("policy async", r"sequencing policy _async_one is an async def"),
    ("order async", r"processor 'o': order= _async_one is an async def"),
    ("order no args", r"processor 'o2': order= _none\(\) cannot be called as _none\(event\)"),
    ("handler not callable", r"processor 'p': handler must be a function taking \(event, ctx\)"),
]


def _define(case: str, app: el.App, proc: el.Processor) -> None:
    agg = app.aggregation("a", key="k", initial=dict)
    if case == "on_batch one arg":
        proc.on_batch("E")(lambda events: None)
    elif case == "on_reset two args":
        proc.on_reset(_two)
    elif case == "key two args":
        app.processors.pop("a")
        app.aggregation("a", key=_two, initial=dict)
    elif case == "key async":
        app.processors.pop("a")
        app.aggregation("a", key=_async_one, initial=dict)
    elif case == "initial with arg":
        app.processors.pop("a")
        app.aggregation("a", key="k", initial=_async_one)
    elif case == "initial one arg":
        app.processors.pop("a")
        app.aggregation("a", key="k", initial=lambda x: {})
    elif case == "fold async":
        agg.on("E")(_async_one)
    elif case == "fold on_any one arg":
        agg.on_any(lambda state: None)
    elif case == "stage key":
        agg.downstream("down", key=_two, initial=dict)
    elif case == "stage fold":
        agg.downstream("down", key=lambda e: "k", initial=dict).on("E")(_none)
    elif case == "mapping two args":
        app.republisher("r", to_stream="x").on("E")(_two)
    elif case == "to_stream async":
        app.republisher("r2", to_stream=_async_one)
    elif case == "policy two args":
        app.processor("q", policy=_two)
    elif case == "policy async":
        app.processor("q2", policy=_async_one)
    elif case == "order async":
        app.processor("o", order=_async_one)
    elif case == "order no args":
        app.processor("o2", order=_none)
    elif case == "handler not callable":
        proc.on("E")(42)  # type: ignore[arg-type]
    else:
        raise AssertionError(case)


@pytest.mark.parametrize(("case", "message"), BAD, ids=[c for c, _ in BAD])
def test_each_kind_of_function_is_checked_where_it_is_defined(tmp_path, case, message) -> None:
    app, proc = _proc(tmp_path)
    with pytest.raises(el.InvalidInputError, match=message):
        _define(case, app, proc)


class _Handler:
    def __call__(self, event: Any, ctx: Any) -> None:
        pass

    def method(self, event: Any, ctx: Any) -> None:
        pass


def _with_default(event: Any, ctx: Any, extra: int = 1) -> None:
    pass


def _varargs(*args: Any, **kwargs: Any) -> None:
    pass


def _three(prefix: str, event: Any, ctx: Any) -> None:
    pass


def test_valid_callables_of_every_shape_are_accepted(tmp_path) -> None:
    """partial, bound methods, callable objects, builtins without a signature, *args,
    defaults, async callable objects where async runs."""
    app, proc = _proc(tmp_path)
    for handler in (
        functools.partial(_three, "x"),
        _Handler().method,
        _Handler(),
        _with_default,
        _varargs,
        lambda e, c: None,
        print,  # a builtin: its signature is (*args, ...)
    ):
        proc.on("E")(handler)

    class AsyncHandler:
        async def __call__(self, event: Any, ctx: Any) -> None:
            pass

    proc.on("E")(AsyncHandler())
    agg = app.aggregation("a", key=str, initial=dict)  # builtins without a signature
    agg.on("E")(functools.partial(lambda tag, state, event: None, "t"))
    app.aggregation("b", key=lambda e: e.stream_id, initial=functools.partial(dict, n=0))
    app.processor("q", policy=functools.partial(lambda field, e: e.data[field], "k"))
    app.processor("o", order=lambda e: e.position, sources={"old": "sqlite:///old.db"})
    assert len(proc.handlers.for_type("E")) == 8


def test_check_refuses_async_callable_objects_where_nothing_awaits() -> None:
    class AsyncKey:
        async def __call__(self, event: Any) -> str:
            return "k"

    with pytest.raises(el.InvalidInputError, match="AsyncKey object is an async def"):
        check(AsyncKey(), "key", ("event",))
    check(AsyncKey(), "handler", ("event",), awaited=True)


def test_a_key_function_returning_a_coroutine_is_an_error_not_a_key() -> None:
    """A plain def returning a coroutine would route by the coroutine's text: a different
    key each time."""

    def key(event: Any) -> Any:
        return _async_one(event)

    policy = SequencingPolicy(key, "custom")
    event = el.Event(7, "s", 1, "E", {}, {}, 0, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the coroutine is never awaited
        with pytest.raises(el.InvalidInputError, match="key of event 7 is coroutine"):
            policy.key(event)


def test_options_an_executor_would_ignore_are_refused(tmp_path) -> None:
    """Before: accepted and ignored (an aggregation in dead-letter mode retried instead,
    lanes and pipeline did nothing)."""
    app = el.App(f"sqlite:///{tmp_path}/o.db")
    agg = {"key": "k", "initial": dict}
    cases = [
        (lambda: app.aggregation("a1", on_error="dead_letter", **agg), "aggregation 'a1': dead"),
        (lambda: app.aggregation("a2", lanes=2, **agg), "aggregation 'a2': lanes=2 are for"),
        (lambda: app.republisher("r1", to_stream="x", lanes=2), "republisher 'r1': lanes=2"),
        (lambda: app.aggregation("a3", pipeline=True, **agg), "aggregation 'a3': pipeline=True"),
        (lambda: app.republisher("r2", to_stream="x", pipeline=True), "'r2': pipeline=True"),
        (
            lambda: app.processor("p1", guarantee="at-least-once", pipeline=True),
            "processor 'p1': pipeline=True",
        ),
    ]
    for define, message in cases:
        with pytest.raises(el.InvalidInputError, match=re.escape(message)):
            define()
    assert list(app.processors) == []


def test_a_republisher_on_any_mapping_runs_for_every_event(tmp_path) -> None:
    """Before: ``@rep.on_any`` registered a processor handler the republisher never called."""
    app = el.App(f"sqlite:///{tmp_path}/any.db")
    target = el.open_store(f"sqlite:///{tmp_path}/copies.db?prefix=cp_")  # not its own input again
    rep = app.republisher("all", to_stream="copies", to_store=target)

    @rep.on_any
    def copy(event: el.Event) -> el.NewEvent:
        return el.NewEvent("Copy", {"of": event.type})

    app.store.append("in", [el.NewEvent("A"), el.NewEvent("B")])
    run_until_caught_up(app)
    assert [e.data["of"] for e in target.read_stream("copies")] == ["A", "B"]
    target.close()
    app.close()
