"""The Spark pipeline on Spark Connect (a local server, tests/spark_connect.py): CLI replays with
--remote from the store and from a Parquet export, `run --engine spark --remote`, a Kafka topic
read by Spark, and the read-count check that refuses a run that did not read everything. The
server's executors cannot import eventlanes or the app: what they run is shipped
(``addArtifacts``). Clients run in processes of their own (a Connect session cannot share a
process with the classic ``spark`` fixture's); the Python-API cases run this module as a script.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import eventlanes as el
from tests.processing_helpers import Logged, assert_exactly_once_in_order, wait_for
from tests.test_spark_cluster import fill, open_app, plain_fold, states, tokens

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.cluster_app:app"

pytestmark = pytest.mark.xdist_group("spark")


def cli(server: Any, *args: str, url: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = server.driver_env(EVENTLANES_TEST_APP_URL=url)
    return subprocess.run([sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def script(server: Any, *args: str, timeout: float = 180) -> dict[str, Any]:
    """This module's ``main`` in a client process of its own; what it printed last (JSON)."""
    done = subprocess.run([sys.executable, "-m", "tests.test_spark_connect", server.url, *args],
                          cwd=ROOT, env=server.driver_env(), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_cli_replays_on_connect_equal_the_local_fold(spark_connect, tmp_path) -> None:
    """An aggregation keyed in the JVM, one keyed by the app's Python function (its module,
    which the executors cannot import, is shipped), and a transactional projection."""
    bare = subprocess.run([str(spark_connect.python), "-c", "import tests.apps.cluster_app"],
                          cwd=tmp_path, capture_output=True, timeout=60)  # fmt: skip
    assert bare.returncode != 0  # the executors' Python: the app reaches it only if shipped
    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 500)
    app = open_app(url)
    from tests.apps.cluster_app import create_schema

    table = create_schema(app)
    result = cli(spark_connect, "replay", APP, "totals", "by_function", "recorder",
                 "--remote", spark_connect.url, url=url)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for name in ("totals", "by_function", "recorder"):
        assert f"{name}: Spark read and replayed 500 events" in result.stdout
    assert states(app, "totals") == states(app, "by_function") == plain_fold(url)
    assert assert_exactly_once_in_order(app, table) == 500
    assert {p for name in ("totals", "recorder") for _, p in tokens(app, name)} == {500}


def test_cli_replays_an_export_on_connect(spark_connect, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 500)
    exported = cli(spark_connect, "export", url, "--parquet", str(tmp_path / "export"), url=url)
    assert exported.returncode == 0, exported.stdout + exported.stderr[-3000:]
    fill(url, 200, seed=2)  # after the export: the live processor folds these
    delta = str(tmp_path / "by_function.delta")  # the states as a Delta table too
    result = cli(spark_connect, "replay", APP, "by_function", "--parquet",
                 str(tmp_path / "export"), "--remote", spark_connect.url, "--delta", delta,
                 url=url)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "by_function: Spark read and replayed 500 events up to position 500" in result.stdout
    said = "".join(result.stdout.split())  # (the console folds the long line)
    assert f"writtentotheDeltatable{delta});everysegment" in said, result.stdout
    app = open_app(url)
    assert states(app, "by_function") == plain_fold(url, until=500)
    assert {p for _, p in tokens(app, "by_function")} == {500}
    from deltalake import DeltaTable

    table = DeltaTable(delta)
    rows = table.to_pyarrow_table().select(["key", "state"]).to_pylist()
    assert {r["key"]: json.loads(r["state"]) for r in rows} == plain_fold(url, until=500)
    segments = [s for s, _ in tokens(app, "by_function")]
    assert [table.transaction_version(f"eventlanes/by_function/{s}") for s in segments] == [
        500
    ] * len(segments)


def test_cli_run_engine_spark_on_connect_with_appends(spark_connect, tmp_path) -> None:
    """`run --engine spark --remote`, the server named by $SPARK_REMOTE instead; keeping the
    Delta table a replay wrote current (`--delta totals=URI`)."""
    url = f"sqlite:///{tmp_path}/events.db"
    fill(url, 1_000)
    app = open_app(url)
    delta = str(tmp_path / "totals.delta")
    replayed = cli(spark_connect, "replay", APP, "totals", "--remote", spark_connect.url,
                   "--delta", delta, url=url)  # fmt: skip
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr[-3000:]
    fill(url, 200, seed=2)  # the run's first micro-batch
    env = spark_connect.driver_env(EVENTLANES_TEST_APP_URL=url, SPARK_REMOTE=spark_connect.url)
    logged = Logged(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--engine", "spark", "--processor",
         "totals", "--trigger", "0.3", "--delta", f"totals={delta}"],
        tmp_path, "runner", cwd=ROOT, env=env,
    )  # fmt: skip
    run = logged.process
    try:

        def position() -> int:
            if run.poll() is not None:
                raise AssertionError(f"the runner exited: {logged.out()}{logged.err()[-3000:]}")
            return min((p for _, p in tokens(app, "totals")), default=0)

        wait_for(lambda: position() == 1_200, timeout=120, what="the first micro-batch")
        fill(url, 500, seed=3)  # appended while it runs
        wait_for(lambda: position() == 1_700, timeout=60, what="the appended events")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert run.returncode == 0, logged.out() + logged.err()[-3000:]
    assert states(app, "totals") == plain_fold(url)
    from deltalake import DeltaTable

    table = DeltaTable(delta)
    rows = table.to_pyarrow_table().select(["key", "state"]).to_pylist()
    assert {r["key"]: json.loads(r["state"]) for r in rows} == plain_fold(url)
    ids = [f"eventlanes/totals/{s}" for s, _ in tokens(app, "totals")]
    assert {table.transaction_version(i) for i in ids} == {1_700}


def test_a_read_short_of_the_store_fails_on_connect(spark_connect, tmp_path) -> None:
    """Executors that read a store missing one event (as the classic test in
    tests/test_arrow_reads.py does it: the executors' URL points at a stale copy): the replay
    fails with the read-count error and writes nothing."""
    live, stale = tmp_path / "live.db", tmp_path / "stale.db"
    fill(f"sqlite:///{live}", 100)
    with sqlite3.connect(live) as source, sqlite3.connect(stale) as copy:
        source.backup(copy)
    with sqlite3.connect(stale) as copy:
        copy.execute("DELETE FROM el_events WHERE position = ?", (7,))
    out = script(spark_connect, "short", f"sqlite:///{live}", f"sqlite:///{stale}")
    for name in ("totals", "by_function"):
        assert out[name].startswith(f"{name}: Spark read 99 events but the store holds 100"), out
    app = open_app(f"sqlite:///{live}")
    assert states(app, "totals") == states(app, "by_function") == {}
    assert {p for name in ("totals", "by_function") for _, p in tokens(app, name)} == {0}


def test_kafka_topic_read_by_spark_on_connect(spark_connect, kafka_broker) -> None:
    """The whole topic, counted; a range planned past what the broker has is refused."""
    from tests.kafka_helpers import create_topic, produce

    b = kafka_broker.bootstrap
    topic = create_topic(b, 2)
    produce(b, topic, [(f"k{i % 5}", {"i": i}, None) for i in range(300)])
    out = script(spark_connect, "kafka", b, topic)
    assert out["rows"] == out["verified"] == 300 and out["ranges"] > 2, out
    assert "partition 0 offsets 0..1000: " in out["short"], out
    assert "nothing read may be used" in out["short"], out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("remote", ["http://127.0.0.1:15002", "sc://127.0.0.1:notaport", "closed"])
def test_a_bad_remote_is_one_error_line(tmp_path, remote: str) -> None:
    remote = f"sc://127.0.0.1:{_closed_port()}" if remote == "closed" else remote
    url = f"sqlite:///{tmp_path}/events.db"
    el.open_store(url).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", "replay", APP, "totals", "--remote", remote],
        cwd=ROOT, env={**env, "EVENTLANES_TEST_APP_URL": url}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    if remote.startswith("sc://127.0.0.1:") and remote[15:].isdigit():
        assert lines[0].startswith(f"error: cannot reach the Spark Connect server {remote}: ")
    else:
        assert lines[0].startswith(f"error: invalid Spark Connect URL {remote!r}"), lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", APP, "totals", "by_function", "--delta", "t"],
         "--delta names one table: replay one"),
        (["replay", APP, "totals", "--delta", "t", "--delta-option", "nokey"],
         "invalid --delta-option 'nokey'"),
        (["replay", APP, "recorder", "--delta", "t"],
         "'recorder': a Delta table holds an aggregation's"),
        (["run", APP, "--delta", "totals=t"],
         "--master, --delta are --engine spark's options (this run is --engine local)"),
        (["run", APP, "--engine", "spark", "--processor", "totals", "--delta", "nope=t"],
         "--delta names 'nope', which this run does not fold on Spark"),
    ],
)  # fmt: skip
def test_a_bad_delta_request_is_one_error_line(tmp_path, args: list[str], message: str) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    el.open_store(url).close()
    done = subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", *args, "--master", "local[1]"],
        cwd=tmp_path, env={**os.environ, "EVENTLANES_TEST_APP_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith(f"error: {message}"), lines[0]
    assert not (tmp_path / "t").exists()


def test_a_spark_job_out_of_memory_says_what_to_do() -> None:
    """What Spark raised (its text, as seen at 5,000,000 keys on local[2] with Spark's default
    1 GB): the error line names the memory setting to raise."""
    from eventlanes.spark.ship import first_line

    seen = RuntimeError(
        "An error occurred while calling o715.count.\n: org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, most recent failure: "
        "Lost task 0.0 in stage 1.0 (TID 1) (localhost executor driver): org.apache.spark.memory."
        "SparkOutOfMemoryError: [UNABLE_TO_ACQUIRE_MEMORY] Unable to acquire 262144 bytes of "
        "memory, got 0. SQLSTATE: 53200\n\tat org.apache.spark.errors.SparkCoreErrors$."
        "outOfMemoryError(SparkCoreErrors.scala:428)"
    )
    line = first_line(seen)
    assert "Unable to acquire 262144 bytes of memory" in line
    assert line.endswith("(Spark ran out of memory: give it more (local[N]: --conf "
                         "spark.driver.memory=4g, read when its JVM starts; a cluster: "
                         "spark.executor.memory))")  # fmt: skip
    assert "memory" not in first_line(RuntimeError("pyspark.errors.X: a column is missing"))


# -- the client side of the Python-API cases, run as ``python -m tests.test_spark_connect``


def _short(spark: Any, live: str, stale: str) -> dict[str, Any]:
    from eventlanes.spark import bulk_replay

    app = open_app(live)
    bulk_replay.executor_url = lambda url, master: stale  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for name in ("totals", "by_function"):
        try:
            el.spark.replay(app, name, spark=spark)
            out[name] = "replayed"
        except el.SparkJobError as exc:
            out[name] = str(exc)
    return out


def _kafka(spark: Any, bootstrap: str, topic: str) -> dict[str, Any]:
    from eventlanes.spark.kafka import Range, read_topic
    from eventlanes.spark.ship import preflight

    preflight(spark)  # the executors read with eventlanes' Kafka reader: shipped to them
    df, read = read_topic(spark, el.Kafka(bootstrap), topic, max_records=100)
    rows = df.count()
    out: dict[str, Any] = {"rows": rows, "verified": read.verify(), "ranges": len(read.ranges)}
    df, read = read_topic(spark, el.Kafka(bootstrap), topic, ranges=[Range(0, 0, 0, 1000)])
    df.count()
    try:
        read.verify()
        out["short"] = "verified"
    except el.SparkJobError as exc:
        out["short"] = str(exc)
    return out


def main(remote: str, case: str, *args: str) -> None:
    from eventlanes.spark.session import get_session, is_connect

    spark = get_session(remote=remote)
    assert is_connect(spark), type(spark)
    out = {"short": _short, "kafka": _kafka}[case](spark, *args)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
