"""The `eventlanes` command line."""

from __future__ import annotations

from click.testing import CliRunner

import eventlanes as el
from eventlanes.cli import main


def test_info_shows_size_and_head(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    with el.open_store(url) as store:
        store.append("a", [el.NewEvent("A"), el.NewEvent("B")])
    result = CliRunner().invoke(main, ["info", url])
    assert result.exit_code == 0, result.output
    assert "sqlite" in result.output and "2" in result.output


def test_errors_are_one_clear_line(tmp_path) -> None:
    result = CliRunner().invoke(main, ["info", "mysql://x/y"])
    assert result.exit_code == 2
    assert "unknown store URL scheme 'mysql'" in result.output
    assert "Traceback" not in result.output
