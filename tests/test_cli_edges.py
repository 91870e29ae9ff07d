"""Where a user meets the command line: apps given as files, apps that fail to import, exit
codes, tables read through a pipe or on a narrow terminal, URLs checked where they are
written, options that did nothing."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from tests.test_cli import OPS, parked  # noqa: F401 - the fixture, shared

ROOT = Path(__file__).resolve().parent.parent
LONG_STREAM = "customer-with-a-rather-long-identifier-0123456789"
LONG_ERROR = "the payment service refused the order: " + " ".join(["insufficient-funds"] * 6)

SHOP = f"""
import os

import eventlanes as el
from shop_tables import handled  # a module next to this file

app = el.App(os.environ["EDGE_URL"], claim_timeout=3)
orders = app.processor("orders", on_error="dead_letter")


@orders.on_any
def handle(event, ctx):
    if event.stream_id == {LONG_STREAM!r}:
        raise RuntimeError({LONG_ERROR!r})
    sql = f"INSERT INTO {{handled(ctx)}} (position) VALUES ({{ctx.param}})"
    ctx.execute(sql, (event.position,))
"""


def write_shop(folder: Path, url: str, name: str = "shop") -> Path:
    """An app file ``name.py`` in ``folder`` (and the module it imports), its store filled with
    3 events to handle and one of LONG_STREAM that parks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(SHOP)
    (folder / "shop_tables.py").write_text("def handled(ctx):\n    return ctx.table('handled')\n")
    with el.open_store(url) as store:
        store.db.run_ddl([f"CREATE TABLE {store.db.table('handled')} (position BIGINT)"])
        for i in range(3):
            store.append(f"s-{i}", [el.NewEvent("Ordered")])
        store.append(LONG_STREAM, [el.NewEvent("Ordered")])
    return folder / f"{name}.py"


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "eventlanes.cli", *args], cwd=cwd, env=full,
                            text=True, **kw)  # fmt: skip


def wait_until(condition, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


def handled(url: str) -> int:
    with el.open_store(url, create=False) as store:
        return store.db.query(f"SELECT count(*) FROM {store.db.table('handled')}")[0][0]


# -- MODULE:APP as a file ------------------------------------------------------------------------
@pytest.mark.parametrize("processes", ["1", "2"])
def test_run_takes_the_app_as_a_file_path(tmp_path, processes: str) -> None:
    url = f"sqlite:///{tmp_path}/events.db"
    write_shop(tmp_path / "apps", url)
    proc = cli(tmp_path, "run", "./apps/shop.py:app", "--processes", processes, "--no-progress",
               env={"EDGE_URL": url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_until(lambda: proc.poll() is not None or handled(url) == 3, what="3 handled events")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert handled(url) == 3 and "parking event 4" in err


@pytest.mark.parametrize(
    ("files", "spec", "wanted"),
    [
        ({"boom.py": "import os\n\nraise RuntimeError('no config for ' + 'production')\n"},
         "boom:app", r"RuntimeError: no config for production \(at \S*/boom\.py:3\)$"),
        ({"boom.py": "import helper\napp = None\n",
          "helper.py": "import os\nos.environ['DATABASE_URL']\n"},
         "./boom.py:app",
         r"KeyError: 'DATABASE_URL' \(at \S*/helper\.py:2, from \S*/boom\.py:1\)$"),
        ({"boom.py": "import not_installed_package\n"},
         "boom:app", r"ModuleNotFoundError: No module named 'not_installed_package' "
                     r"\(at \S*/boom\.py:1\)$"),
        ({"boom.py": "import sys\nsys.exit('set DATABASE_URL first')\n"},
         "boom:app", r"SystemExit: set DATABASE_URL first \(at \S*/boom\.py:2\)$"),
        ({}, "./missing.py:app",
         r"invalid app './missing.py:app': '\S*/missing\.py': no such file"),
    ],
)  # fmt: skip
def test_an_app_module_that_fails_to_import_is_one_line(tmp_path, files, spec, wanted) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    proc = cli(tmp_path, "run", spec, "--no-progress", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE)  # fmt: skip
    out, err = proc.communicate(timeout=60)
    lines = (out + err).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, out + err
    assert lines[0].startswith("error: ") and re.search(wanted, lines[0]), lines[0]


# -- exit codes ----------------------------------------------------------------------------------
def test_dead_letters_retry_exits_1_while_events_stay_parked(parked) -> None:  # noqa: F811
    app, flag = parked
    stays = CliRunner().invoke(main, ["dead-letters", OPS, "orders", "--retry"])
    assert stays.exit_code == 1, stays.output
    assert "0 event(s) handled, 2 still parked" in stays.output
    flag.touch()
    done = CliRunner().invoke(main, ["dead-letters", OPS, "orders", "--retry"])
    assert done.exit_code == 0 and "2 event(s) handled, 0 still parked" in done.output


# -- tables off a terminal, and on a narrow one --------------------------------------------------
@pytest.fixture
def running_shop(tmp_path):
    """The shop app running in a process of its own (one segment, held: an owner to show),
    with one event parked; yields (cwd, env, owner)."""
    url = f"sqlite:///{tmp_path}/events.db"
    write_shop(tmp_path, url, "tables_shop")
    env = {"EDGE_URL": url}
    proc = cli(tmp_path, "run", "tables_shop:app", "--no-progress", env=env,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        status = ["status", "tables_shop:app", "--json"]

        def owned() -> str | None:
            out = cli(tmp_path, *status, env=env, stdout=subprocess.PIPE).communicate(60)[0]
            segments = json.loads(out)["processors"][0]["segments"] if out else []
            caught_up = segments and segments[0]["caught_up"]
            return segments[0]["owner"] if caught_up else None

        wait_until(lambda: owned() is not None, what="a caught-up owner")
        yield tmp_path, env, owned()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


HEADERS = ["segment", "position", "lag (s)", "owner", "claim age", "caught up", "replaying",
           "last error"]  # fmt: skip


def test_tables_through_a_pipe_are_printed_whole(running_shop) -> None:
    cwd, env, owner = running_shop
    status = cli(cwd, "status", "tables_shop:app", env=env, stdout=subprocess.PIPE)
    out = status.communicate(timeout=60)[0]
    assert "…" not in out
    header = next(line for line in out.splitlines() if "segment" in line)
    assert all(h in header for h in HEADERS), out
    assert any(owner in line and "yes" in line for line in out.splitlines()), out  # one line a row
    letters = cli(cwd, "dead-letters", "tables_shop:app", "orders", env=env,
                  stdout=subprocess.PIPE)  # fmt: skip
    out = letters.communicate(timeout=60)[0]
    assert letters.returncode == 0 and "…" not in out
    assert any(LONG_STREAM in line and LONG_ERROR in line for line in out.splitlines()), out


def on_a_terminal(cwd: Path, env: dict[str, str], columns: int, *args: str) -> str:
    """What a command prints on a pty ``columns`` wide, without colour codes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = cli(cwd, *args, env={**env, "COLUMNS": str(columns)}, stdin=subprocess.DEVNULL,
               stdout=slave, stderr=slave)  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(60)
    os.close(master)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())


def column(text: str, index: int) -> str:
    """The cells of one column of a one-row table, top to bottom, spaces removed."""
    rows = text.split("┡", 1)[1].splitlines()[1:]
    cells = [line.split("│")[index + 1] for line in rows if line.startswith("│")]
    return re.sub(r"\s", "", "".join(cells))


def test_tables_on_a_narrow_terminal_fold_long_cells_instead_of_cutting_them(running_shop) -> None:
    cwd, env, owner = running_shop
    out = on_a_terminal(cwd, env, 70, "status", "tables_shop:app")
    assert "…" not in out
    assert column(out, 4) == owner, out  # segment, position, lag, lag (s), owner
    out = on_a_terminal(cwd, env, 70, "dead-letters", "tables_shop:app", "orders")
    assert "…" not in out
    assert column(out, 2) == LONG_STREAM, out
    assert column(out, 6).endswith("RuntimeError:" + LONG_ERROR.replace(" ", "")), out


# -- the App's URL, options that did nothing -----------------------------------------------------
@pytest.mark.parametrize(
    ("url", "wanted"),
    [
        ("mysql://u@h/db", "unknown store URL scheme 'mysql'"),
        ("sqlite://events.db", "invalid SQLite URL"),
        ("sqlite:///events.db?prefix=Bad-Prefix", "invalid table prefix 'Bad-Prefix'"),
        ("sqlite:///:memory:", "sqlite:///:memory: is not supported"),
        ("sqlite:///events.db?colour=blue", "unknown SQLite store option(s) colour"),
        ("events.db", "invalid store URL 'events.db'"),
    ],
)
def test_app_checks_its_url_where_it_is_written(tmp_path, monkeypatch, url, wanted) -> None:
    monkeypatch.chdir(tmp_path)  # a relative SQLite file would land here, were one created
    with pytest.raises(el.InvalidInputError, match=re.escape(wanted)):
        el.App(url)
    with pytest.raises(el.InvalidInputError, match=re.escape(wanted)):
        el.App(f"sqlite:///{tmp_path}/ok.db", token_store=url)
    assert list(tmp_path.iterdir()) == []


def test_app_with_a_valid_url_does_not_connect_until_used() -> None:
    app = el.App("postgresql://nobody@127.0.0.1:1/nowhere?prefix=shop_")  # nothing listens
    assert app.url.endswith("prefix=shop_")
    with pytest.raises(el.StoreConnectionError, match="127.0.0.1:1"):
        app.store  # noqa: B018 - first use


def test_run_has_no_checkpoint_option() -> None:
    """Progress of --engine spark lives in the token store: the option did nothing."""
    assert "checkpoint" not in CliRunner().invoke(main, ["run", "--help"]).output
    refused = CliRunner().invoke(main, ["run", OPS, "--engine", "spark", "--checkpoint", "d"])
    assert refused.exit_code == 2 and "No such option '--checkpoint'" in refused.output


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["status", "--bogus"], "error: No such option '--bogus' (see 'eventlanes status --help')"),
        (["bogus"], "error: No such command 'bogus' (see 'eventlanes --help')"),
        (["run"], "error: Missing argument 'MODULE:APP' (see 'eventlanes run --help')"),
        (["status", "--max-lag"],
         "error: Option '--max-lag' requires an argument (see 'eventlanes status --help')"),
        (["--log-level", "loud", "status"], "error: Invalid value for '--log-level': 'loud' is "
         "not one of 'debug', 'info', 'warning', 'error' (see 'eventlanes --help')"),
    ],
)  # fmt: skip
def test_a_mistyped_command_line_is_one_error_line(args: list[str], line: str) -> None:
    """Before: click's usage block (a usage line, a hint, a blank line, "Error: ..."); every
    failure a user can cause is one ``error:`` line, exit code 2, with where to look."""
    command = "from eventlanes.cli import main; main(prog_name='eventlanes')"
    done = subprocess.run([sys.executable, "-c", command, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and lines == [line], done.stdout + done.stderr


def test_sigterm_while_the_app_still_starts_ends_the_worker_cleanly(tmp_path) -> None:
    """An autoscaler that scales in right after scaling out stops a worker that is still
    importing its app: it ends at once with exit 0 and says so, instead of dying by the signal
    (exit -15, which an orchestrator counts as a failure)."""
    marker = tmp_path / "importing"
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n"
        "import eventlanes as el\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "time.sleep(30)  # a module that takes long to import\n"
        f"app = el.App('sqlite:///{tmp_path}/slow.db')\n"
    )
    proc = cli(
        tmp_path, "run", "slow:app", "--no-progress", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    wait_until(marker.exists, 30, what="the worker to import the app")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, (proc.returncode, err)
    assert time.monotonic() - started < 5
    assert "stopped by SIGTERM while starting" in err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--engine", "spark", "--metrics-port", "9477", "--processes", "2"],
         "error: --processes, --metrics-port are the local engine's options: --engine spark "
         "runs micro-batches (their progress: eventlanes status)"),
        (["--engine", "spark", "--delta-option", "a=b"], "error: --delta-option without --delta"),
        (["--master", "local[1]", "--trigger", "5"],
         "error: --master, --trigger are --engine spark's options (this run is --engine local)"),
    ],
)  # fmt: skip
def test_run_refuses_options_its_engine_does_not_use(tmp_path, args: list[str], line: str) -> None:
    """Before, ``run --engine spark`` dropped the local engine's options without a word (no
    metrics server on the port asked for, one process instead of two, and it ran on), and
    the local engine Spark's; now one error line, before anything starts."""
    (tmp_path / "counting.py").write_text(
        "import eventlanes as el\n"
        f"app = el.App('sqlite:///{tmp_path}/e.db')\n"
        "app.aggregation('c', key='k', on='Hit', fields={'n': el.count()})\n"
    )
    command = "from eventlanes.cli import main; main(prog_name='eventlanes')"
    done = subprocess.run([sys.executable, "-c", command, "run", "counting:app", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and lines == [line], done.stdout + done.stderr
