"""One truth about the segment layout: a node whose declared ``segments=`` differs from the
stored layout says so (start line, status field and note, one logged warning), and the stored
layout stays."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main
from tests.apps.wait_app import create_schema, make_app

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.wait_app:app"


@pytest.fixture
def four_stored(store_url: str, monkeypatch: pytest.MonkeyPatch) -> el.App:
    """A store where a node declaring ``segments=4`` ran first."""
    monkeypatch.setenv("EVENTLANES_TEST_WAIT_URL", store_url)
    monkeypatch.setenv("EVENTLANES_TEST_WAIT_SEGMENTS", "8")  # what the CLI's app declares
    monkeypatch.delitem(sys.modules, "tests.apps.wait_app", raising=False)
    first = make_app(store_url, segments=4)
    create_schema(first)
    first.store.append("s", [el.NewEvent("Placed")] * 10)
    first.start()
    first.wait_until_caught_up(30)
    first.stop()
    return first


def test_status_says_the_stored_layout_differs_from_the_declared_count(four_stored) -> None:
    store_url = os.environ["EVENTLANES_TEST_WAIT_URL"]
    second = make_app(store_url, segments=8)
    view = second.status("orders")
    assert len(view.segments) == 4 and view.declared_segments == 8
    assert "declared segments=8, but the stored layout has 4 segment(s)" in (view.layout_note or "")
    result = CliRunner().invoke(main, ["status", APP, "--json"])
    assert result.exit_code == 0, result.output
    [doc] = json.loads(result.stdout)["processors"]
    assert doc["declared_segments"] == 8 and len(doc["segments"]) == 4
    assert any("declared segments=8" in note for note in doc["notes"]), doc["notes"]
    table = CliRunner().invoke(main, ["status", APP])
    assert "note: orders: this app declared segments=8" in " ".join(table.stdout.split())
    # Without the app, nothing is declared: no note.
    result = CliRunner().invoke(main, ["status", "--url", store_url, "--json"])
    [doc] = json.loads(result.stdout)["processors"]
    assert doc["declared_segments"] is None and doc["notes"] == []
    # The node that declared 4: nothing to say.
    assert four_stored.status("orders").layout_note is None
    second.close()


def test_a_node_declaring_another_count_says_so_once_and_the_stored_layout_stays(
    four_stored, caplog: pytest.LogCaptureFixture
) -> None:
    store_url = os.environ["EVENTLANES_TEST_WAIT_URL"]
    caplog.set_level(logging.INFO, logger="eventlanes")
    second = make_app(store_url, segments=8)
    second.store.append("s", [el.NewEvent("Placed")] * 10)
    second.start()
    try:
        second.wait_until_caught_up(30)
        second.initialize("orders")  # again in this process: no second warning
    finally:
        second.stop()
    warnings = [r.getMessage() for r in caplog.records if "stored layout" in r.getMessage()]
    assert warnings == [
        "orders: declared segments=8, but the stored layout has 4 segment(s) (0/3, 1/3, 2/3, "
        "3/3), and that layout is the one that runs (split or merge to change it)"
    ]
    assert [str(s) for s in second.runtime.tokens.segments("orders")] == [
        "0/3", "1/3", "2/3", "3/3"
    ]  # fmt: skip
    second.close()


def test_the_start_line_of_run_names_both_counts(four_stored) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventlanes.cli", "run", APP, "--no-progress"],
        cwd=ROOT, env=dict(os.environ), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "ready:" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
    err = "".join(lines) + rest
    assert proc.returncode == 0, err
    start = next(line for line in lines if "orders: starting" in line)
    assert "4 segment(s) stored, 8 declared here: the stored layout runs" in start, err
    assert err.count("declared segments=8, but the stored layout has 4 segment(s)") == 1, err
