"""Prometheus metrics scraped over HTTP during real runs, checked against the effects."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import eventlanes as el
from tests.apps.ops_app import create_schema, fill, make_app
from tests.processing_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name + sorted labels -> value, from a real HTTP scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(
        v for (n, ls), v in samples.items()
        if n == name and all((k, val) in ls for k, val in labels.items())
    )  # fmt: skip


def handled_rows(app: el.App, table: str) -> int:
    return app.db.query(f"SELECT count(*) FROM {table}")[0][0]


def test_metrics_count_the_events_handled_during_a_run(store_url: str) -> None:
    app = make_app(store_url)
    table = create_schema(app)
    first = fill(app.store)
    app.start(["orders"], metrics_port=0)
    try:
        port = app.metrics_port
        assert port
        app.wait_until_caught_up(30, ["orders"])
        during = _scrape_counting(port, 60)
        assert total(during, "eventlanes_events_handled_total") == handled_rows(app, table) == 60
        assert total(during, "eventlanes_dead_letters_parked_total") == 2
        assert total(during, "eventlanes_dead_letters", processor="orders") == 2
        assert total(during, "eventlanes_claims_held", processor="orders") == 2
        assert total(during, "eventlanes_handler_batch_seconds_count") >= 2
        assert total(during, "eventlanes_commit_seconds_count") >= 2
        assert total(during, "eventlanes_lag_events") == 0
        assert total(during, "eventlanes_status_up") == 1
        # More events arrive: the counters follow the effects exactly.
        fill(app.store, good=40, bad=0)
        app.wait_until_caught_up(30, ["orders"])
        after = _scrape_counting(port, 100)
        assert total(after, "eventlanes_events_handled_total") == handled_rows(app, table) == 100
        assert total(after, "eventlanes_head_position") == first + 40
        # Only the processors that run are reported (audit is defined but not run here).
        assert total(after, "eventlanes_lag_events", processor="audit") == 0
        assert not any(ls and ("processor", "audit") in ls for (_, ls) in after)
    finally:
        app.stop()
        app.close()


def _scrape_counting(port: int, handled: int) -> Any:
    """The first scrape that counts ``handled`` events handled, within 10 s: the count
    follows the commit, a moment after the token a caught-up wait looks at."""

    def counted() -> Any:
        samples = scrape(port)
        return samples if total(samples, "eventlanes_events_handled_total") == handled else None

    return wait_for(counted, timeout=10, what=f"{handled} events handled counted")


def test_lag_in_events_and_seconds(tmp_path) -> None:
    """A processor held back reports its lag, and the age of its oldest unhandled event."""
    app = make_app(f"sqlite:///{tmp_path}/e.db", flag=str(tmp_path / "never"))
    fill(app.store, good=10, bad=0)
    time.sleep(1.2)
    app.start(["audit"], metrics_port=0, node_index=1, nodes=2)  # node 1 of 2: no segment
    try:
        samples = scrape(app.metrics_port)  # type: ignore[arg-type]
        assert total(samples, "eventlanes_lag_events", processor="audit") == 10
        lag_s = total(samples, "eventlanes_lag_seconds", processor="audit")
        assert 1.2 <= lag_s < 30
    finally:
        app.stop()
        app.close()


def test_one_scrape_sees_every_worker_process(tmp_path) -> None:
    """`run --processes 2 --metrics-port`: the supervisor serves the sum of both workers."""
    url = f"sqlite:///{tmp_path}/e.db"
    app = make_app(url)
    table = create_schema(app)
    port = free_port()
    env = dict(os.environ, EVENTLANES_TEST_OPS_URL=url, EVENTLANES_TEST_OPS_FLAG="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", "tests.apps.ops_app:app",
         "--processor", "orders", "--processes", "2", "--metrics-port", str(port),
         "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _scrapes(port), timeout=60)
        # Each worker holds one segment before the events appear, so the counters of both
        # processes must be summed to match the effects.
        wait_for(lambda: len({s.owner for s in app.status("orders").segments} - {None}) == 2, 60)
        wait_for(lambda: total(scrape(port), "eventlanes_claims_held") == 2, timeout=30)
        fill(app.store, good=300, streams=30)
        wait_for(lambda: handled_rows(app, table) == 300, timeout=60)
        wait_for(lambda: total(scrape(port), "eventlanes_events_handled_total") == 300, 30)
        samples = scrape(port)
        assert total(samples, "eventlanes_dead_letters_parked_total") == 2
        assert total(samples, "eventlanes_claims_held", processor="orders") == 2
        per_segment = {
            dict(ls)["segment"]: v for (n, ls), v in samples.items()
            if n == "eventlanes_events_handled_total"
        }  # fmt: skip
        assert set(per_segment) == {"0/1", "1/1"} and all(per_segment.values())
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        print(err)  # shown when the test fails
        app.close()
    assert proc.returncode == 0, err


def _scrapes(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def test_a_scrape_while_a_worker_creates_its_file_does_not_fail(tmp_path, monkeypatch) -> None:
    """A worker creates its metrics file empty, then sizes it. Before: a scrape in between
    answered HTTP 500 (the empty file does not parse; five reads 10 ms apart were not always
    enough on a loaded machine). Now the empty file is read as what it is, no value yet:
    the scrape sums the other workers' files."""
    from prometheus_client.mmap_dict import MmapedDict

    from eventlanes.admin.metrics import MULTIPROC_ENV, registry_for

    files = tmp_path / "metrics"
    files.mkdir()
    monkeypatch.setenv(MULTIPROC_ENV, str(files))
    (files / "counter_4242.db").touch()  # between a worker's open() and its truncate()
    values = MmapedDict(str(files / "counter_4243.db"))  # another worker's, written
    values.write_value('["x_total", "x_total", {}, "help"]', 3.0, 0.0)
    values.close()

    app = make_app(f"sqlite:///{tmp_path}/e.db")
    registry = registry_for(app, None, ["orders"])
    samples = {s.name: s.value for f in registry.collect() for s in f.samples}
    assert samples["x_total"] == 3.0 and samples["eventlanes_status_up"] == 1
    (files / "counter_4242.db").unlink()  # the worker died before sizing it
    samples = {s.name: s.value for f in registry.collect() for s in f.samples}
    assert samples["x_total"] == 3.0
    app.close()
