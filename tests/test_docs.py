"""The documentation site: it builds strictly, and every code block in it (and in the README)
runs as a reader would run it (tests/docs_examples.py), on SQLite and on PostgreSQL."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

import eventlanes as el
from tests import docs_examples
from tests.docs_examples import PageRun, run_page

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
APP_MODULE = DOCS / "examples" / "shop.py"

#: the environment variables pages read, each with the default a reader sees in the page
STORE_VAR, KAFKA_VAR = "SHOP_URL", "KAFKA_BOOTSTRAP"


def _opens_store(page: Path) -> bool:
    text = page.read_text()
    return STORE_VAR in text or "shop:app" in text or "from shop import" in text


def _cases() -> list[pytest.ParameterSet]:
    cases = []
    for page in PAGES:
        name = str(page.relative_to(DOCS))
        if "get_session()" in page.read_text():
            # The suite's JVM, in its group. SQLite only: a Spark replay of a page's app on
            # PostgreSQL is tests/test_arrow_reads.py's and test_upcasting.py's.
            group = pytest.mark.xdist_group("spark")
            cases.append(pytest.param(page, "sqlite", id=f"{name}-sqlite", marks=group))
            continue
        cases.append(pytest.param(page, "sqlite", id=f"{name}-sqlite"))
        if _opens_store(page):
            cases.append(pytest.param(page, "postgres", id=f"{name}-postgres"))
    return cases


def code_fences(path: Path) -> list[int]:
    """The line of every fenced code block (MyST directives such as ``{toctree}`` are not)."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    return [t.map[0] + 1 for t in tokens if t.type == "fence" and t.map
            and not t.info.strip().startswith("{")]  # fmt: skip


def _page_run(page: Path, backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> PageRun:
    for example in APP_MODULE.parent.glob("*.py"):  # the files the reader wrote (shop.py...)
        shutil.copy(example, tmp_path / example.name)
    env: dict[str, str | None] = {STORE_VAR: None, KAFKA_VAR: None}
    if backend == "postgres":
        base = request.getfixturevalue("pg_url")
        prefix = f"d{os.getpid()}_{abs(hash((page, tmp_path))) % 10**8}_"
        env[STORE_VAR] = f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
    text = page.read_text()
    if "EVENTLANES_TEST_POSTGRES_URL" in text:  # the reader's own tests, on the same server
        env["EVENTLANES_TEST_POSTGRES_URL"] = request.getfixturevalue("pg_url")
    if KAFKA_VAR in text:  # a broker of its own: the page creates its topics (in milliseconds)
        from eventlanes.testing.kafka import TansuBroker

        broker = TansuBroker()
        request.addfinalizer(broker.stop)
        env[KAFKA_VAR] = broker.bootstrap
    if "get_session()" in text:
        request.getfixturevalue("spark")  # the suite's session is the active one there
    # a reader's shell has $SHOP_URL set; the python blocks show their default instead
    return PageRun(cwd=tmp_path, env=env, shell_defaults={STORE_VAR: "sqlite:///shop.db"})


@pytest.mark.parametrize(("page", "backend"), _cases())
def test_page_examples(page: Path, backend: str, tmp_path: Path, request) -> None:
    run = run_page(page, _page_run(page, backend, tmp_path, request))
    accounted = sorted([line for line, _ in run.ran] + [line for line, _ in run.skipped])
    fences = code_fences(page)
    missing = [line for line in fences if line not in accounted]
    assert not missing, f"{page}: code blocks at lines {missing} were neither run nor skipped"
    for line, reason in run.skipped:
        assert reason.strip(), f"{page}:{line}: a block is skipped without a reason"


def test_readme_blocks(tmp_path: Path, request) -> None:
    """The README's blocks: python ones run in tests/test_readme.py; the others here (or are
    skipped with their reason in the README)."""
    readme = ROOT / "README.md"
    run = run_page(readme, PageRun(cwd=tmp_path, env={STORE_VAR: None}, python=False))
    accounted = {line for line, _ in run.ran} | {line for line, _ in run.skipped}
    missing = [line for line in code_fences(readme) if line not in accounted]
    assert not missing, f"README.md: code blocks at lines {missing} were neither run nor skipped"


def test_output_check_catches_a_difference(tmp_path: Path) -> None:
    """The collector is not a rubber stamp: a wrong expected output, an unknown language and a
    failing command each fail the page."""
    page = tmp_path / "page.md"
    cases = {
        "```python\nprint(1 + 1)\n#> 3\n```\n": "expected output",
        "```python\nprint('unshown')\n```\n": "expected output",
        "```ruby\nputs 1\n```\n": "nothing runs it",
        "```console\n$ false\n```\n": "exited 1",
        "```console\n$ echo hello\nbye\n```\n": "expected output",
    }
    for text, error in cases.items():
        page.write_text(text)
        with pytest.raises(AssertionError, match=error):
            run_page(page, PageRun(cwd=tmp_path, env={}))
    page.write_text("```python\nprint('a', 1)\nprint('b')\n#> a ...\n#> ...\n```\n")
    run_page(page, PageRun(cwd=tmp_path, env={}))
    page.write_text('<!-- skip: next "needs a cluster" -->\n```ruby\nputs 1\n```\n')
    assert run_page(page, PageRun(cwd=tmp_path, env={})).skipped == [(2, "needs a cluster")]


def test_site_builds_strictly(tmp_path: Path) -> None:
    """``make docs``'s build: warnings (a broken link, a reference that does not resolve, a
    docstring that does not parse) fail it."""
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-W", "--keep-going", "-n",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    index = (tmp_path / "html" / "index.html").read_text()
    assert "eventlanes" in index
    assert not re.search(r"""(src|href)=["']https?://""", _assets(tmp_path / "html")), (
        "the site loads something from the network"
    )
    documented = _inventory(tmp_path / "html" / "objects.inv")
    unlisted = [name for name in el.__all__ if not _documented(name, documented)]
    assert not unlisted, f"public names the API reference does not document: {unlisted}"


def _documented(name: str, documented: set[str]) -> bool:
    obj = getattr(el, name)
    if hasattr(obj, "__qualname__"):  # a class or function: under its own module's name
        return f"{obj.__module__}.{obj.__qualname__}" in documented
    return any(d.endswith(f".{name}") for d in documented)  # a constant (el.TICK): its data


def _inventory(path: Path) -> set[str]:
    """The Python objects the site documents (Sphinx's objects.inv: a header, then zlib)."""
    import zlib

    raw = path.read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    return {line.split(" ", 1)[0] for line in body.splitlines() if " py:" in line}


def _assets(html: Path) -> str:
    """The src/href attributes that load things (scripts, styles, images, fonts) of every page."""
    found = []
    for page in html.rglob("*.html"):
        text = page.read_text()
        found += re.findall(r"<(?:script|link|img)[^>]*>", text)
    for css in html.rglob("*.css"):
        found += re.findall(r"url\([^)]*\)", css.read_text())
    return "\n".join(found)


def test_every_public_name_has_a_docstring() -> None:
    """Every name of ``eventlanes.__all__`` has a docstring, and so do its public methods and
    properties (the build test checks the API reference documents each)."""
    missing = []
    for name in el.__all__:
        obj = getattr(el, name)
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = value.fget if isinstance(value, property) else value
                if (callable(target) or isinstance(value, property)) and not inspect.getdoc(
                    getattr(obj, attr) if not isinstance(value, property) else value
                ):
                    missing.append(f"{name}.{attr}")
    assert not missing, f"public names without a docstring: {missing}"


def test_collector_sees_every_block_kind() -> None:
    """The lexer finds fenced blocks of any language and invisible set-up blocks alike."""
    assert docs_examples.console_commands("$ a \\\n  b\nout\n$ c\n") == [
        ("a \\\n  b", ["out"]),
        ("c", []),
    ]
