"""The README's example must run as written and print what it shows (its ``#>`` lines), on
SQLite and, with only the store URL changed, on PostgreSQL."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from tests.docs_examples import check_output

README = Path(__file__).resolve().parent.parent / "README.md"
SQLITE_URL = 'f"sqlite:///{tempfile.mkdtemp()}/shop.db"'


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_readme_example_runs_and_prints_what_it_shows(backend: str, request) -> None:
    blocks = _python_blocks()
    assert blocks, "the README has no python example"
    for n, block in enumerate(blocks):
        expected = [m.group(1) for m in re.finditer(r"^[ \t]*#> ?(.*)$", block, flags=re.M)]
        assert expected, f"README.md python block {n}: it shows no output (#> lines) to check"
        if backend == "postgres":
            assert SQLITE_URL in block, "the README's example no longer opens its store as expected"
            base = request.getfixturevalue("pg_url")
            prefix = f"r{os.getpid()}_{n}_"
            url = f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
            block = block.replace(SQLITE_URL, repr(url))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, str(README), "exec"), {"__name__": "readme"})
        check_output(f"README.md python block {n} ({backend})", expected, printed.getvalue())


def test_readme_links_point_at_files_that_exist() -> None:
    """The front page's links into the site (and its picture) are relative paths, so they work
    on GitHub and in the sdist: each names a file of the repository."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [t for t in targets if "://" not in t]
    assert len(relative) >= 10, "the README links into the site"
    missing = [t for t in relative if not (README.parent / t).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"
