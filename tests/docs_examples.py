"""Runs the code blocks of a Markdown page (the docs' and the README's) as a reader would.

Sybil finds the blocks (fenced or MyST code blocks, ``<!-- invisible-code-block: python -->``
set-up a reader does not need to see) and the ``<!-- skip: next "reason" -->`` comments that
leave one out with its reason; the evaluators here run them in the page's order, in one
namespace per page, in a fresh working directory:

* ``python``: run; what it prints must equal its ``#>`` comments (``...`` matches any text
  within a line, a line of only ``...`` any lines), so expected output shown to a reader is
  checked, and nothing printed goes unchecked.
* ``console``: each ``$ command`` runs in bash (the page's directory and environment); the lines
  after it are its expected output (stdout and stderr, with the same ``...``), and it must
  exit 0 (a page that shows an exit code says ``; echo "exit $?"``).
* ``json`` and ``yaml``: parsed (a page checks what they say with an invisible block).
* ``text``: output or a layout shown, not code.

Any other language fails the page: a block is run, or skipped with a reason.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import SkipTest

import yaml
from sybil import Example, Region, Sybil
from sybil.parsers.abstract.lexers import LexerCollection
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer
from sybil.parsers.myst import SkipParser

NOT_CODE = {"text"}
PYTHON = {"python", "py"}


@dataclass
class PageRun:
    """Where and with what a page's blocks run."""

    cwd: Path
    #: variables the page's blocks read (None: unset, so a block's default shows)
    env: dict[str, str | None]
    #: what a reader's shell has set where ``env`` leaves a variable unset (``$SHOP_URL``)
    shell_defaults: dict[str, str] = field(default_factory=dict)
    #: the page being run (set by run_page; blocks may read their own page)
    page: Path | None = None
    #: False: python blocks are run elsewhere (the README's, by tests/test_readme.py)
    python: bool = True
    #: (line, language) of each block run, and (line, reason) of each one skipped
    ran: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    #: ``$ command &``: started, left running for the page's later blocks, stopped at its end
    background: list[tuple[str, subprocess.Popen[str], Path]] = field(default_factory=list)


def _wildcard(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.rstrip().split("...")) + r"[ \t]*\n")
    return re.compile("".join(parts), re.S)


def check_output(what: str, expected: list[str], got: str) -> None:
    """``got`` (printed) must match ``expected`` line by line (see the module's ``...``)."""
    text = "".join(line.rstrip() + "\n" for line in got.splitlines())
    if not _wildcard(expected).fullmatch(text):
        shown = "\n".join(expected) or "(nothing)"
        raise AssertionError(f"{what}: expected output\n{shown}\n--- but got ---\n{text}")


@contextlib.contextmanager
def _in(run: PageRun) -> Iterator[None]:
    """The page's working directory, environment and import path, for one block."""
    old_cwd, old_env, old_path = os.getcwd(), dict(os.environ), list(sys.path)
    os.chdir(run.cwd)
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    for key, value in run.env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.path.insert(0, str(run.cwd))
    try:
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        sys.path[:] = old_path


def forget_modules(folder: Path) -> None:
    """Drop the modules imported from ``folder`` (the page's ``shop.py``...), so the next page
    or backend imports its own."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(str(folder)):
            del sys.modules[name]


def _run_python(example: Example, run: PageRun) -> None:
    source = example.parsed
    expected = [m.group(1) for m in re.finditer(r"^[ \t]*#> ?(.*)$", source, flags=re.M)]
    code = compile("\n" * example.line + source, example.path, "exec")
    printed = io.StringIO()
    with _in(run), contextlib.redirect_stdout(printed):
        exec(code, example.namespace)
    check_output(f"{example.path}:{example.line}", expected, printed.getvalue())


def console_commands(source: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (``\\``-continued) and the output lines shown after each."""
    commands: list[tuple[str, list[str]]] = []
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if not commands:
                raise AssertionError(f"console block: {line!r} before the first '$ ' command")
            commands[-1][1].append(line)
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command + "\n" + lines[i]  # bash reads the continuation itself
        commands.append((command, []))
        i += 1
    return commands


def _console_env(run: PageRun) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    for key, value in run.env.items():
        value = run.shell_defaults.get(key) if value is None else value
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env.pop("COLUMNS", None)
    # A page's own `python -m pytest` prints what a user's would, not the suite's options.
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _run_console(example: Example, run: PageRun) -> None:
    env = _console_env(run)
    for command, expected in console_commands(example.parsed):
        if command.rstrip().endswith("&"):
            _start(example, run, command.rstrip()[:-1], expected, env)
            continue
        done = subprocess.run(
            ["bash", "-c", command], cwd=run.cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180,
        )  # fmt: skip
        where = f"{example.path}:{example.line}: $ {command}"
        if done.returncode != 0:
            raise AssertionError(f"{where}\nexited {done.returncode}:\n{done.stdout}")
        check_output(where, expected, done.stdout)


def _start(example: Example, run: PageRun, command: str, expected: list[str],
           env: dict[str, str]) -> None:  # fmt: skip
    """Start ``command`` in the background, as ``&`` does, and wait until it has printed the
    expected lines shown (a last ``...`` line: and more), for at most a minute."""
    log = run.cwd / f"background-{len(run.background)}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=run.cwd, env=env,
                                text=True, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    run.background.append((f"{example.path}:{example.line}: $ {command}", proc, log))
    deadline = time.monotonic() + 60
    while True:
        text = log.read_text()
        try:
            check_output("", expected, text)
            return
        except AssertionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                state = "exited" if proc.poll() is not None else "still waits"
                check_output(f"{example.path}:{example.line}: $ {command} ({state})", expected,
                             text)  # fmt: skip
        time.sleep(0.1)


def stop_background(run: PageRun) -> None:
    """SIGINT (Ctrl-C) to what the page started with ``&``: each must stop cleanly, exit 0."""
    for _, proc, _ in run.background:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    failures = []
    for where, proc, log in run.background:
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            failures.append(f"{where}: exited {code} after SIGINT:\n{log.read_text()}")
    run.background.clear()
    if failures:
        raise AssertionError("\n".join(failures))


def evaluate(example: Example) -> None:
    run: PageRun = example.namespace["__page__"]
    language = (example.region.lexemes.get("language") or "").split()[0]
    if language == "python" and not run.python:
        raise SkipTest("python blocks of this page run in tests/test_readme.py")
    if language in PYTHON:
        _run_python(example, run)
    elif language == "console":
        _run_console(example, run)
    elif language == "json":
        example.namespace.setdefault("json_blocks", []).append(json.loads(example.parsed))
    elif language == "yaml":
        example.namespace.setdefault("yaml_blocks", []).append(
            list(yaml.safe_load_all(example.parsed))
        )
    elif language not in NOT_CODE:
        raise AssertionError(
            f"{example.path}:{example.line}: a {language or 'plain'} block: nothing runs it; "
            'use python or console, or say why not with <!-- skip: next "reason" -->'
        )
    run.ran.append((example.line, language))


class _AnyBlock:
    """Every fenced block with a language (MyST directives such as ``{toctree}`` are not code
    blocks) and every ``<!-- invisible-code-block: python -->``; the evaluator dispatches."""

    def __init__(self) -> None:
        self.lexers = LexerCollection([
            FencedCodeBlockLexer(language=r"[^{\s][^\n]*",
                                 mapping={"language": "language", "source": "source"}),
            DirectiveInHTMLCommentLexer(directive=r"invisible-code-block", arguments=".+",
                                        mapping={"arguments": "language", "source": "source"}),
        ])  # fmt: skip

    def __call__(self, document: Any) -> Iterator[Region]:
        for region in self.lexers(document):
            region.parsed = region.lexemes["source"]
            region.evaluator = evaluate
            yield region


SYBIL = Sybil(parsers=[_AnyBlock(), SkipParser()])


def run_page(path: Path, run: PageRun, namespace: dict[str, Any] | None = None) -> PageRun:
    """Run every block of the page at ``path``, in order; skipped ones are recorded."""
    run.page = path
    document = SYBIL.parse(path)
    document.namespace.update(namespace or {})
    document.namespace["__page__"] = run
    try:
        for example in document.examples():
            try:
                example.evaluate()
            except SkipTest as skip:
                run.skipped.append((example.line, str(skip)))
    except BaseException:
        with contextlib.suppress(AssertionError):
            stop_background(run)
        raise
    else:
        stop_background(run)
    finally:
        forget_modules(run.cwd)
        document.namespace.clear()  # clients the page made go now, before its broker or server
        gc.collect()
    return run


def dedent(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"
