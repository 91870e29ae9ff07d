"""Secrets stay secret: store URLs shown to users hide passwords in any case, Kafka options
hide every secret (``sasl.oauthbearer.extensions`` too), ``run --kafka`` overrides reach worker
processes without the environment; and metrics listen where ``--metrics-host`` says."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

import eventlanes as el
from eventlanes.db.url import parse_url
from eventlanes.kafka.settings import Kafka
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret-Xy9"


@pytest.mark.parametrize("option", ["password", "PASSWORD", "Password", "SSLPASSWORD"])
def test_store_url_passwords_are_hidden_in_any_case(option: str) -> None:
    url = parse_url(f"postgresql://u@db.example/shop?{option}={SECRET}&sslmode=require")
    assert SECRET not in url.redacted
    assert f"{option}=***" in url.redacted and "sslmode=require" in url.redacted


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eventlanes.cli", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_store_url_with_an_upper_case_password_is_never_shown(store_url: str) -> None:
    """`eventlanes info URL?PASSWORD=...` on both backends: whatever it answers (SQLite refuses
    the option, libpq does not know the upper-case name), the password is not in it."""
    el.App(store_url).store.head()  # the store exists: only the option is wrong
    joiner = "&" if "?" in store_url else "?"
    result = _cli("info", f"{store_url}{joiner}PASSWORD={SECRET}")
    assert result.returncode != 0 or "events" in result.stdout
    assert SECRET not in result.stdout + result.stderr, result.stdout + result.stderr
    assert "PASSWORD=***" in result.stdout + result.stderr


def test_kafka_secrets_are_redacted_whatever_their_case() -> None:
    kafka = Kafka("broker:9092", {
        "sasl.oauthbearer.extensions": f"logicalCluster=lkc-1,identityPoolId={SECRET}",
        "SASL.PASSWORD": SECRET,
        "Sasl.OAuthBearer.Client.Secret": SECRET,
    })  # fmt: skip
    shown = f"{kafka!r} {kafka.redacted()}"
    assert SECRET not in shown and "lkc-1" not in shown, shown
    assert kafka.redacted()["bootstrap.servers"] == "broker:9092"


APP = """
import os
import eventlanes as el

app = el.App(os.environ["SECRETS_TEST_URL"], claim_timeout=1.5)
seen = app.processor("seen")


@seen.on_any
def record(event, ctx):
    password = el.Kafka("unused:9092").resolved().get("sasl.password")
    ctx.execute(f"INSERT INTO {ctx.table('seen')} VALUES ({ctx.param}, {ctx.param})",
                (os.getpid(), password))
"""


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_kafka_overrides_reach_workers_without_the_environment(tmp_path, store_url) -> None:
    """`run --processes 2 --kafka sasl.password=...`: a worker's handler sees the password in
    its Kafka options, and no process of the run has it in its environment."""
    (tmp_path / "secrets_app.py").write_text(textwrap.dedent(APP))
    app = el.App(store_url)
    app.processor("seen")
    table = app.db.table("seen")
    app.db.run_ddl([f"CREATE TABLE IF NOT EXISTS {table} (pid BIGINT, password TEXT)"])
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, SECRETS_TEST_URL=store_url, PYTHONPATH=path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", "secrets_app:app", "--no-progress",
         "--processes", "2", "--kafka", f"sasl.password={SECRET}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: len(app.tokens.live_nodes("seen")) == 2, timeout=60, what="2 workers")
        app.store.append("s", [el.NewEvent("Ping")])
        wait_for(lambda: app.db.query(f"SELECT COUNT(*) FROM {table}")[0][0] == 1, timeout=30,
                 what="the event handled")  # fmt: skip
        family = [proc.pid, *_children(proc.pid)]
        family += [g for c in family[1:] for g in _children(c)]
        assert len(family) >= 3  # the supervisor and its two workers (and helpers)
        for pid in family:
            assert SECRET.encode() not in _environ(pid), f"the secret is in pid {pid}'s env"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    [(pid, password)] = app.db.query(f"SELECT pid, password FROM {table}")
    assert pid != proc.pid and password == SECRET


def _other_address() -> str | None:
    """An address of this machine that is not the loopback (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_metrics_listen_on_the_host_asked_for(tmp_path) -> None:
    """``start(metrics_host="127.0.0.1")``: metrics answer on the loopback only; by default
    (documented: all interfaces, for scraping pods) on every address."""
    other = _other_address()
    if other is None:
        pytest.skip("this machine has no address but the loopback")
    app = el.App(f"sqlite:///{tmp_path}/m.db")
    app.processor("p").on_any(lambda event, ctx: None)
    app.start(metrics_port=0, metrics_host="127.0.0.1")
    try:
        assert _answers("127.0.0.1", app.metrics_port)  # type: ignore[arg-type]
        assert not _answers(other, app.metrics_port)  # type: ignore[arg-type]
    finally:
        app.stop()
    app.start(metrics_port=0)
    try:
        assert _answers(other, app.metrics_port)  # type: ignore[arg-type]
    finally:
        app.stop()


def test_run_metrics_host_option_and_a_bad_one(tmp_path) -> None:
    """`run --metrics-host` is passed on; an address that cannot be used is one error line."""
    url = f"sqlite:///{tmp_path}/m.db"
    env = dict(os.environ, EVENTLANES_TEST_APP_URL=url)
    result = _cli("run", "tests.apps.recorder:app", "--no-progress", "--metrics-port", "0",
                  "--metrics-host", "203.0.113.7", env=env)  # fmt: skip
    assert result.returncode != 0
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: metrics cannot listen on 203.0.113.7:0: Cannot assign requested address"
    ], output
    assert "Traceback" not in output
