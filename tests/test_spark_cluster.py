"""The Spark pipeline on a real standalone cluster (tests/spark_cluster.py), the way Spark users
run it: CLI replays with --master, a spark-submit job with its own session and --py-files, a
Parquet export given as a file:// URI, the continuous runner while events are appended. The
executors cannot import eventlanes or the app by themselves. Every result equals a plain Python
fold of the same events; a store the executors cannot see is an error that changes nothing.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import eventlanes as el
from tests.processing_helpers import Logged, assert_exactly_once_in_order

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.cluster_app:app"
E = el.NewEvent


def fill(url: str, events: int, seed: int = 1) -> None:
    store = el.open_store(url)
    rng = random.Random(seed)
    try:
        for i in range(events // 100):
            batch = [E("Measured", {"k": f"k{rng.randrange(300)}", "v": rng.randrange(9)})
                     for _ in range(100)]  # fmt: skip
            store.append(f"s-{i % 37}", batch)
    finally:
        store.close()


def plain_fold(url: str, until: int | None = None) -> dict[str, dict[str, int]]:
    """What the aggregations of tests/apps/cluster_app.py must hold: a plain loop."""
    want: dict[str, dict[str, int]] = {}
    with el.open_store(url) as store:
        for event in store.iter_events(batch_size=10_000):
            if event.type == "Measured" and (until is None or event.position <= until):
                s = want.setdefault(event.data["k"], {"sum": 0, "n": 0, "last": 0})
                s["sum"] += event.data["v"]
                s["n"] += 1
                s["last"] = event.position
    return want


def states(app: el.App, name: str) -> dict[str, Any]:
    table = app.db.table("aggregates")
    sql = app.db.sql(f"SELECT key, value FROM {table} WHERE aggregation = ?")
    return {k: json.loads(v) for k, v in app.db.query(sql, (name,))}


def tokens(app: el.App, name: str) -> list[tuple[int, int]]:
    return sorted((s.segment.id, s.token.position) for s in app.tokens.status(name))


def cli(cluster: Any, *args: str, url: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = cluster.driver_env(EVENTLANES_TEST_APP_URL=url)
    return subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def open_app(url: str) -> el.App:
    from tests.apps.cluster_app import define

    return define(el.App(url, claim_timeout=5))


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("error:")]


def test_cli_replays_an_aggregation_and_a_projection(spark_cluster, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 20_000)
    app = open_app(url)
    from tests.apps.cluster_app import create_schema

    table = create_schema(app)
    args = ["replay", APP, "totals", "recorder", "--master", spark_cluster.master,
            *spark_cluster.cli_conf()]  # fmt: skip
    started = time.time()
    result = cli(spark_cluster, *args, url=url)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "totals: Spark read and replayed 20,000 events" in result.stdout
    assert "recorder: Spark read and replayed 20,000 events" in result.stdout
    assert states(app, "totals") == plain_fold(url)
    assert assert_exactly_once_in_order(app, table) == 20_000
    assert (
        {p for _, p in tokens(app, "totals")} == {p for _, p in tokens(app, "recorder")} == {20_000}
    )
    # the replay's partitions ran in the executors of both Workers
    ran = spark_cluster.tasks_by_worker(started)
    assert len(ran) == 2 and all(n > 0 for n in ran.values()), ran


def docs_recipe() -> str:
    """The console block of docs/how-to/spark-cluster.md that calls spark-submit, as a script."""
    from tests.docs_examples import console_commands

    text = (ROOT / "docs" / "how-to" / "spark-cluster.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "spark-submit" in b]
    script = "\n".join(command for command, _ in console_commands(block))
    return script


def test_docs_spark_submit_recipe_replays_a_file_uri_export(spark_cluster, tmp_path) -> None:
    """The docs' recipe, run as written: eventlanes as a --py-files zip, the job the wheel
    ships (eventlanes.spark.job, its own session from getOrCreate), a Parquet export given as a
    file:// URI; the app's module ships by itself."""
    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 10_000)
    recipe = docs_recipe().replace("shop:app revenue", f"{APP} by_function")
    recipe = recipe.replace('--master "$MASTER"', '--master "$MASTER" $CONF')
    export = f"file://{tmp_path}/export"
    bin_dir = str(Path(sys.executable).parent)  # python, eventlanes and spark-submit
    env = spark_cluster.driver_env(
        EVENTLANES_TEST_APP_URL=url, SHOP_URL=url, EXPORT=export, MASTER=spark_cluster.master,
        CONF=" ".join(spark_cluster.cli_conf()), PYSPARK_DRIVER_PYTHON=sys.executable,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )  # fmt: skip
    result = subprocess.run(["bash", "-euc", recipe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert (tmp_path / "export" / "_eventlanes.json").is_file()  # not a folder named file:
    with zipfile.ZipFile(tmp_path / "eventlanes.zip") as z:
        assert "eventlanes/processing/__init__.py" in z.namelist()
    assert "by_function: read 10000 events up to 10000" in result.stdout
    app = open_app(url)
    assert states(app, "by_function") == plain_fold(url)
    assert {p for _, p in tokens(app, "by_function")} == {10_000}


def test_continuous_runner_on_the_cluster_with_appends_and_a_sigkill(
    spark_cluster, tmp_path
) -> None:
    """`run --engine spark` with the executors' Python from a packed environment
    (--archives, PYSPARK_PYTHON=./environment/bin/python: not a path on the driver), events
    appended while it runs; SIGKILLed mid-run (batches planned, maybe half written) and
    started again: it resumes from its tokens and the states are exact."""
    from tests.spark_cluster import pack_environment

    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 5_000)
    app = open_app(url)
    archive = pack_environment(spark_cluster.root)
    env = spark_cluster.driver_env(
        EVENTLANES_TEST_APP_URL=url, PYSPARK_PYTHON="./environment/bin/python"
    )
    starts = iter(range(2))

    def start() -> Logged:
        return Logged(
            [sys.executable, "-m", "eventlanes.cli", "run", APP, "--engine", "spark",
             "--master", spark_cluster.master, *spark_cluster.cli_conf(),
             "--archives", f"{archive}#environment", "--trigger", "0.5"],
            tmp_path, f"runner-{next(starts)}", cwd=ROOT, env=env,
        )  # fmt: skip

    def position(name: str = "totals") -> int:
        if logged.process.poll() is not None:
            raise AssertionError(f"the runner exited: {logged.out()}{logged.err()[-3000:]}")
        return min((p for _, p in tokens(app, name)), default=0)

    logged = start()
    try:
        try:
            logged.wait_working(lambda: position() > 0, "the first micro-batch")
            for seed in range(3, 6):  # appended while the query runs
                fill(url, 1_000, seed=seed)
                time.sleep(0.3)
            logged.wait_working(lambda: position() > 5_000, "a micro-batch of the appended")
            logged.process.send_signal(signal.SIGKILL)  # mid-run
            logged.process.wait()
            fill(url, 1_000, seed=6)
            logged = start()
            logged.wait_working(lambda: position() == 9_000, "the rest, after the restart")
            logged.wait_working(lambda: position("by_function") == 9_000,
                                "the second aggregation")  # fmt: skip
        except AssertionError as exc:  # a wait that timed out: what the driver said meanwhile
            raise AssertionError(f"{exc}\nthe runner's log:\n{logged.err()[-6000:]}") from None
    finally:
        logged.process.send_signal(signal.SIGTERM)
        logged.process.wait(60)
    out, err = logged.out(), logged.err()
    assert "spark: running totals, by_function; not running recorder" in out, out + err[-3000:]
    assert states(app, "totals") == states(app, "by_function") == plain_fold(url)


def test_relative_sqlite_url_on_a_cluster_is_refused_and_changes_nothing(
    spark_cluster, tmp_path
) -> None:
    """Executors resolve a relative path in their own working directory: an empty store there.
    Once it printed success and deleted every state; now nothing is written."""
    fill(f"sqlite:///{tmp_path}/events.db", 2_000)
    app = open_app(f"sqlite:///{tmp_path}/events.db")
    app.start(["totals"])
    try:
        app.wait_until_caught_up(60, ["totals"])
    finally:
        app.stop()
    before = states(app, "totals"), tokens(app, "totals")
    assert before[0] == plain_fold(f"sqlite:///{tmp_path}/events.db")
    env = spark_cluster.driver_env(EVENTLANES_TEST_APP_URL="sqlite:///events.db")
    result = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "replay", APP, "totals", "--master",
         spark_cluster.master, *spark_cluster.cli_conf()],
        cwd=tmp_path, env={**env, "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{ROOT}"},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    (line,) = error_lines(result)
    assert "relative SQLite path" in line
    assert (states(app, "totals"), tokens(app, "totals")) == before


def test_executors_that_cannot_open_the_store_fail_fast_and_change_nothing(
    spark_cluster, pg_url, tmp_path
) -> None:
    """A PostgreSQL store, and executors without psycopg: one clear line, before any write."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}prefix=cluster_{os.getpid()}_"
    fill(url, 1_000)
    app = open_app(url)
    app.start(["totals"])
    try:
        app.wait_until_caught_up(60, ["totals"])
    finally:
        app.stop()
    before = states(app, "totals"), tokens(app, "totals")
    started = time.monotonic()
    result = cli(spark_cluster, "replay", APP, "totals", "--master", spark_cluster.master,
                 *spark_cluster.cli_conf(), url=url)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    (line,) = error_lines(result)
    assert "executors cannot open the store" in line and "psycopg" in line, line
    assert "Traceback" not in result.stdout + result.stderr
    # Fast: the preflight's own message (above) says it failed before any read or retry. The
    # bound only catches a hang: the command took 32 s alone and 98 s beside three busy test
    # workers on two cores, so it is not a measure of speed.
    assert time.monotonic() - started < 180
    assert (states(app, "totals"), tokens(app, "totals")) == before


def test_debug_shows_the_trace(spark_cluster, tmp_path) -> None:
    env = spark_cluster.driver_env(EVENTLANES_TEST_APP_URL="sqlite:///events.db")
    result = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "--debug", "replay", APP, "totals", "--master",
         spark_cluster.master],
        cwd=tmp_path, env={**env, "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{ROOT}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "relative SQLite path" in result.stderr
