"""Spark failures a user meets before any job runs: a master that cannot be reached, executors
whose Python lacks what PySpark's Arrow path needs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eventlanes as el

ROOT = Path(__file__).resolve().parent.parent


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


@pytest.mark.parametrize("where", ["unreachable:7077", "closed"])
def test_an_unreachable_spark_master_is_one_line_naming_it(tmp_path, where: str) -> None:
    master = f"spark://{where if where != 'closed' else f'127.0.0.1:{_closed_port()}'}"
    url = f"sqlite:///{tmp_path}/events.db"
    el.open_store(url).close()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "replay", "tests.apps.spark_app:app", "screws",
         "--master", master],
        cwd=ROOT, env={**os.environ, "EVENTLANES_TEST_APP_URL": url},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith(f"error: cannot reach the Spark master {master}: "), lines[0]
    assert elapsed < 30  # Spark's own client gave up after about a minute, naming nothing


def _fold(state: dict, event: el.Event) -> None:
    state["n"] += 1


def test_preflight_names_what_the_executors_python_lacks(spark, tmp_path, monkeypatch) -> None:
    """A session whose executors run a Python without pyarrow and pandas (as a user-built
    session with PYSPARK_PYTHON set to such a Python would): one line naming both, before any
    job or write."""
    venv = tmp_path / "bare"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    app = el.App(f"sqlite:///{tmp_path}/events.db")
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=lambda: {"n": 0})
    totals.on_any(_fold)
    app.store.append("s", [el.NewEvent("E")])
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(python))  # what executors run
    with pytest.raises(el.SparkJobError) as caught:
        el.spark.replay(app, "totals", spark=spark)
    assert str(caught.value).startswith(
        f"the executors' Python ({python}) lacks pyarrow (ModuleNotFoundError: No module named "
        "'pyarrow'), pandas (ModuleNotFoundError: No module named 'pandas'): "
    ), caught.value
    assert app.status("totals").position == 0 and totals.get("s") is None  # nothing written
    monkeypatch.undo()  # the driver's own Python has both: the same replay runs
    assert el.spark.replay(app, "totals", spark=spark).events == 1
    assert totals.get("s") == {"n": 1}
    app.close()


def test_executors_read_sqlite_without_a_second_sqlite_library(
    spark, tmp_path, monkeypatch
) -> None:
    """Before: executors read a SQLite store through the ADBC driver, which bundles its own
    SQLite library; closing it dropped the POSIX locks of the executor's own connections to
    the file (a write lock among them), and a malformed store was seen once after replays.
    Now an executor that cannot import any ADBC module replays a SQLite store: nothing on
    that path loads a second library. (PostgreSQL's reads still need theirs: the preflight
    names it.)"""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Lacks:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0].startswith('adbc_driver'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Lacks())\n"
    )
    python = tmp_path / "python-without-adbc"  # this Python, with every ADBC driver gone
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="{block}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    app = el.App(f"sqlite:///{tmp_path}/events.db")
    totals = app.aggregation("totals", key=lambda e: e.stream_id, initial=lambda: {"n": 0})
    totals.on_any(_fold)
    app.store.append("s", [el.NewEvent("E")] * 3)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", str(python))
    assert el.spark.replay(app, "totals", spark=spark).events == 3
    assert totals.get("s") == {"n": 3}
    app.close()


def test_an_aggregation_of_several_sources_is_refused_on_spark_before_any_work(
    spark, tmp_path
) -> None:
    """Spark reads the app's own store. An aggregation with ``sources=`` was replayed (and run
    by micro-batches) from that store alone: its states missed the other store's events, and
    its token was written without a position for it, as if there were none. Refused now,
    nothing written."""
    from eventlanes.spark.continuous import ContinuousAggregation

    other = f"sqlite:///{tmp_path}/other.db"
    app = el.App(f"sqlite:///{tmp_path}/main.db")
    agg = app.aggregation("counts", key="k", initial=lambda: {"n": 0},
                          sources={"legacy": other})  # fmt: skip

    @agg.on("Hit")
    def hit(state: dict, event: el.Event) -> None:
        state["n"] += 1

    app.store.append("s1", [el.NewEvent("Hit", {"k": "a"})])
    with el.open_store(other) as legacy:
        legacy.append("s2", [el.NewEvent("Hit", {"k": "a"})] * 2)
    why = r"'counts' reads several sources .*: Spark reads this app's store only"
    with pytest.raises(el.InvalidInputError, match=why):
        el.spark.replay(app, "counts", spark=spark)
    with pytest.raises(el.InvalidInputError, match=why):
        ContinuousAggregation(app, "counts", spark=spark)
    assert agg.get("a") is None and app.tokens.status("counts") == []
    app.close()
