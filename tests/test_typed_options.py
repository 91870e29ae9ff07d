"""The App's factories take their options as ``**options: Unpack[...]`` of one typed dict
(``eventlanes.processing.options``): editors complete them, mypy refuses a misspelled one, and
they cannot drift from the constructors they forward to."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from eventlanes.kafka.ingestor import Ingestor
from eventlanes.processing.aggregating.aggregation import Aggregation
from eventlanes.processing.options import (
    AggregationOptions,
    ProcessorOptions,
    RepublisherOptions,
    RunOptions,
)
from eventlanes.processing.processor import Processor
from eventlanes.processing.republisher import Republisher

ROOT = Path(__file__).resolve().parent.parent
SRC = Path(el.__file__).resolve().parent.parent

# Correct calls of every factory (each line must type-check), then one misspelled option per
# line, marked with the name mypy must report there.
SNIPPET = """\
import eventlanes as el

app = el.App("sqlite:///typed.db")
kafka = el.Kafka("localhost:9092")
app.processor("p", guarantee="at-least-once", segments=4, lanes=2, handler_timeout=5.0)
app.processor("q", policy=el.per_stream(), batch_size=10, mode="tracking", tables=["q"])
app.processor("o", sources={"old": "sqlite:///old.db"}, order=lambda e: e.recorded_at)
app.aggregation("a", key="robot", initial=lambda: {"n": 0}, persist_every=0.5, segments=2)
app.aggregation("d", key="robot", fields={"n": el.count()}, on="Reading", pushdown=False)
app.republisher("r", to_stream="out", segments=2, on_error="retry", version=1)
app.ingest("i", kafka, topic="t", type="Reading", batch_size=10, on_bad="dead_letter")
app.publisher("pub", el.KafkaSink(kafka, "out"), on="Reading", segments=2, batch_size=5)
app.run(["p"], grace=1.0, balance=True, metrics_port=None, on_ready=lambda: None)
app.processor("x1", segmentz=4)  # BAD segmentz
app.aggregation("x2", key="robot", persist_evry=1.0)  # BAD persist_evry
app.republisher("x3", to_stream="out", batchsize=5)  # BAD batchsize
app.ingest("x4", kafka, topic="t", on_bda="stop")  # BAD on_bda
app.publisher("x5", el.KafkaSink(kafka, "out"), segmnts=2)  # BAD segmnts
app.aggregation("x6", key="robot", guarantee="exactly-once")  # BAD guarantee
app.run(grace=1.0, node_idx=0)  # BAD node_idx
"""


def test_mypy_refuses_a_misspelled_option_and_accepts_the_real_ones(tmp_path: Path) -> None:
    snippet = tmp_path / "typed_app.py"
    snippet.write_text(SNIPPET)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir",
         str(tmp_path / "cache"), "--config-file", str(ROOT / "pyproject.toml"), str(snippet)],
        capture_output=True, text=True, cwd=tmp_path, timeout=240,
        env={**os.environ, "MYPYPATH": str(SRC)},  # the eventlanes these tests import
    )  # fmt: skip
    errors: dict[int, str] = {}
    for line in run.stdout.splitlines():
        found = re.match(r".*typed_app\.py:(\d+): error: (.*)", line)
        if found:
            errors[int(found[1])] = errors.get(int(found[1]), "") + found[2]
    expected = {
        number: marked.group(1)
        for number, text in enumerate(SNIPPET.splitlines(), start=1)
        if (marked := re.search(r"# BAD (\w+)", text))
    }
    assert run.returncode == 1, run.stdout + run.stderr
    assert set(errors) == set(expected), run.stdout  # the correct calls type-check
    for number, option in expected.items():
        assert f'"{option}"' in errors[number], run.stdout


@pytest.fixture
def app(tmp_path: Path) -> Any:
    app = el.App(f"sqlite:///{tmp_path / 'typed.db'}")
    yield app
    app.close()


def test_a_misspelled_option_still_fails_where_it_is_written(app: Any) -> None:
    kafka = el.Kafka("localhost:9092")
    calls = [
        ("segmentz", lambda: app.processor("p", segmentz=4)),
        ("persist_evry", lambda: app.aggregation("a", key="robot", initial=dict, persist_evry=1.0)),
        ("batchsize", lambda: app.republisher("r", to_stream="out", batchsize=5)),
        ("on_bda", lambda: app.ingest("i", kafka, topic="t", on_bda="stop")),
        ("segmnts", lambda: app.publisher("pub", el.KafkaSink(kafka, "out"), segmnts=2)),
        ("node_idx", lambda: app.run(grace=1.0, node_idx=0)),
        # not an option of these (the constructors refused it with a reason; now the factory
        # does, and mypy before it)
        ("guarantee", lambda: app.aggregation("g", key="robot", initial=dict, guarantee="x")),
        ("guarantee", lambda: app.republisher("h", to_stream="out", guarantee="exactly-once")),
    ]
    for option, call in calls:
        with pytest.raises(TypeError, match=f"'{option}'"):
            call()
    assert app.processors == {} and app.ingestors == {}  # nothing half-defined


def test_values_are_still_checked_by_the_constructors(app: Any) -> None:
    kafka = el.Kafka("localhost:9092")
    with pytest.raises(el.InvalidInputError, match="segment count"):
        app.processor("p", segments=0)
    with pytest.raises(el.InvalidInputError, match="persist_every"):
        app.aggregation("a", key="robot", initial=dict, persist_every=-1)
    with pytest.raises(el.InvalidInputError, match="versions are for projections"):
        app.republisher("r", to_stream="out", version=2)
    with pytest.raises(el.InvalidInputError, match="on_bad"):
        app.ingest("i", kafka, topic="t", on_bad="skip")
    with pytest.raises(el.InvalidInputError, match="second version of a publisher"):
        app.publisher("pub", el.KafkaSink(kafka, "out"), version=2)
    # the defaults are the constructors': what the factories pass on is what they would pick
    proc = app.processor("defaults")
    plain = Processor("plain", prefix=app.runtime.prefix, upcasters=app.runtime.upcasters)
    differ = ("base", "name", "handlers")
    assert {k: repr(v) for k, v in vars(proc).items() if k not in differ} == {
        k: repr(v) for k, v in vars(plain).items() if k not in differ
    }


def _keywords(fn: Any, *, leave_out: set[str] = frozenset()) -> dict[str, tuple[Any, str]]:
    """Keyword-only parameters: name -> (default, annotation text)."""
    params = inspect.signature(fn).parameters.values()
    return {
        p.name: (p.default, p.annotation)
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in leave_out
    }


def _positional(fn: Any) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


def _unpacked(fn: Any) -> Any:
    """The typed dict of ``fn``'s ``**options: Unpack[...]`` (None without one)."""
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    (found,) = typing.get_args(typing.get_type_hints(fn)["options"])
    return found


def _options(typed: Any) -> set[str]:
    return set(typed.__optional_keys__) | set(typed.__required_keys__)


# the App passes these to the constructors, from its runtime; a user passes none of them
FROM_THE_APP = {"prefix", "upcasters", "states", "stores", "windows"}
PROCESSOR = _options(ProcessorOptions)


def test_the_processor_factory_takes_the_constructors_options() -> None:
    assert _unpacked(el.App.processor) is ProcessorOptions is _unpacked(Processor.__init__)
    assert _positional(el.App.processor) == ["self", "name"]
    assert _positional(Processor.__init__) == ["self", "name"]
    assert set(_keywords(Processor.__init__)) == FROM_THE_APP & {"prefix", "upcasters"}
    assert not ProcessorOptions.__required_keys__  # each has a default
    # the checked value holds every option, and nothing else
    assert {f.name for f in dataclasses.fields(RunOptions)} == PROCESSOR
    assert len(PROCESSOR) == 18


def test_the_aggregation_factory_takes_the_constructors_options() -> None:
    own = _keywords(Aggregation.__init__, leave_out=FROM_THE_APP)
    # the aggregation routes by its key and promises its own guarantee: the processor's
    # policy= and guarantee= are not options of it (refused, see below); its initial= is the
    # state's, not the token's
    assert _unpacked(el.App.aggregation) is AggregationOptions is _unpacked(Aggregation.__init__)
    assert _options(AggregationOptions) == PROCESSOR - {"policy", "guarantee", "initial"}
    assert _keywords(el.App.aggregation) == own
    assert _positional(el.App.aggregation) == ["self", "name"]


def test_the_republisher_factory_takes_the_constructors_options() -> None:
    own = _keywords(Republisher.__init__, leave_out=FROM_THE_APP)
    assert _unpacked(el.App.republisher) is RepublisherOptions
    assert _unpacked(Republisher.__init__) is RepublisherOptions
    assert _options(RepublisherOptions) == PROCESSOR - {"guarantee"}
    assert _keywords(el.App.republisher) == own
    assert _positional(el.App.republisher) == ["self", "name"]


def test_the_publisher_factory_takes_the_processors_options_and_its_own() -> None:
    assert _unpacked(el.App.publisher) is ProcessorOptions
    assert set(_keywords(el.App.publisher)) == {"on", "key", "value"}
    assert _positional(el.App.publisher) == ["self", "name", "sink"]


def test_the_ingest_factory_lists_the_constructors_options() -> None:
    assert _unpacked(el.App.ingest) is None
    assert _keywords(el.App.ingest) == _keywords(Ingestor.__init__)
    assert _positional(el.App.ingest) == ["self", "name", "kafka"]
    assert _positional(Ingestor.__init__) == ["self", "runtime", "name", "kafka"]


def test_the_options_left_out_are_refused_by_the_constructors(app: Any) -> None:
    """What the aggregation and republisher factories do not list the constructors refuse,
    so leaving them out takes nothing a user could pass."""
    rt = app.runtime
    home = {"prefix": rt.prefix, "upcasters": rt.upcasters}
    states = {"states": lambda: rt.states, **home}
    with pytest.raises(el.InvalidInputError, match="the guarantee is 'aggregation'"):
        Aggregation("a", key="robot", initial=dict, guarantee="exactly-once", **states)
    with pytest.raises(TypeError, match="policy"):
        Aggregation("b", key="robot", initial=dict, policy=el.per_stream(), **states)
    with pytest.raises(el.InvalidInputError, match="the guarantee is 'at-least-once'"):
        Republisher("r", to_stream="out", guarantee="at-least-once", stores=rt.store_at, **home)


def test_run_lists_the_options_of_start() -> None:
    assert _unpacked(el.App.run) is None
    assert _keywords(el.App.run, leave_out={"grace"}) == _keywords(el.App.start)
    assert _positional(el.App.run) == ["self", "processors"] == _positional(el.App.start)
