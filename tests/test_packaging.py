"""The sdist and the wheel as a user gets them: built without a warning, holding what the docs
and the spark-submit job need, and working when installed in a fresh virtualenv outside the
repository (the CLI, and the getting-started app run as docs/getting-started.md runs it)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tracked(*folders: str) -> list[str]:
    """The files of the working tree git knows of or would add (not the ignored ones)."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *folders],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [name for name in done.stdout.splitlines() if (ROOT / name).is_file()]


def _build(tmp_path: Path) -> tuple[Path, Path, str]:
    """Build from a copy of the working tree's files: what a clean checkout builds, without
    the egg-info, build/ and docs/_build a working tree gathers (and without writing there)."""
    tree = tmp_path / "tree"
    for name in _tracked():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_NO_INDEX")}
    # this machine's default; unset, as on a user's, it makes build_py print "byte-compiling
    # is disabled" as a warning
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    dist = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(tree)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    (sdist,) = dist.glob("eventlanes-*.tar.gz")
    (wheel,) = dist.glob("eventlanes-*.whl")
    return sdist, wheel, output


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    return _build(tmp_path_factory.mktemp("build"))


def test_build_prints_no_warning(built) -> None:
    """setuptools' warnings (the license table's deprecation, MANIFEST.in rules that match
    nothing...) are what a release build would print: none."""
    *_, output = built
    warnings = [line for line in output.splitlines() if re.search(r"warn|deprecat", line, re.I)]
    assert not warnings, "\n".join(warnings)


def test_sdist_holds_the_docs_and_examples(built) -> None:
    sdist, _, _ = built
    with tarfile.open(sdist) as tar:
        top = f"{sdist.name.removesuffix('.tar.gz')}/"
        names = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    for needed in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "docs/conf.py",
                   "docs/dashboard.png", "docs/getting-started.md", "docs/examples/shop.py",
                   "examples/demo.py"):  # fmt: skip
        assert needed in names, f"the sdist lacks {needed}"
    # every file of docs/ and examples/ (MANIFEST.in lists them by directory and kind)
    missing = [name for name in _tracked("docs", "examples") if name not in names]
    assert not missing, f"files of docs/ or examples/ not in the sdist: {missing}"
    junk = [n for n in names if re.search(r"(^|/)(_build|__pycache__)/|\.(pyc|db)$", n)]
    assert not junk, f"the sdist carries build output: {junk}"


def test_wheel_holds_the_spark_job_and_license(built) -> None:
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(info).decode()
    assert "eventlanes/spark/job.py" in names  # what `spark-submit` is given
    assert "eventlanes/py.typed" in names
    assert "eventlanes/dashboard/templates/index.html" in names  # package data
    dist_info = info.rsplit("/", 1)[0]
    assert f"{dist_info}/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert not any(n.startswith(("tests/", "docs/", "examples/")) for n in names)


def _fresh_venv(where: Path, wheel: Path) -> Path:
    """A virtualenv outside the repository holding the wheel. Its dependencies come from this
    one's site-packages (offline, fast) through a .pth line naming the directory: a path line
    does not run the .pth files in that directory, so the editable install of src/ stays out."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--no-compile", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # after the install: pip must not see (and offer to replace) the editable eventlanes
    (Path(purelib) / "zz_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return where / "bin"


def test_wheel_works_in_a_fresh_virtualenv(built, tmp_path: Path) -> None:
    _, wheel, _ = built
    bin_ = _fresh_venv(tmp_path / "venv", wheel)
    home = tmp_path / "shop"
    home.mkdir()
    shutil.copy(ROOT / "docs" / "examples" / "shop.py", home / "shop.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"SHOP_URL": f"sqlite:///{home / 'shop.db'}", "PATH": f"{bin_}:{env['PATH']}"}

    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=home, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    where = run("python", "-c", "import eventlanes; print(eventlanes.__file__)").strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), f"eventlanes imported from {where}"
    assert not Path(where).is_relative_to(ROOT)
    assert "Usage: eventlanes" in run("eventlanes", "--help")

    # the getting-started page: set up, append, run in the background, read, status
    assert "schema version" in run("python", "shop.py")
    run("python", "-c", """
import eventlanes as el
from shop import app
app.store.append("order-1", [el.NewEvent("OrderPlaced", {"customer": "ada", "total": 30})],
                 expected_version=0)
app.store.append("order-2", [el.NewEvent("OrderPlaced", {"customer": "ada", "total": 12})],
                 expected_version=0)
app.store.append("order-3", [el.NewEvent("OrderPlaced", {"customer": "bob", "total": 25}),
                             el.NewEvent("OrderCancelled", {})], expected_version=0)
""")  # fmt: skip
    worker = subprocess.Popen(
        [str(bin_ / "eventlanes"), "run", "shop:app"], cwd=home, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        read = run("python", "-c", """
from shop import app, revenue
app.wait_until_caught_up(timeout=30)
print(app.db.query(f"SELECT id, customer, total FROM {app.table('orders')} ORDER BY id"))
print(revenue.get("ada"), revenue.get("bob"))
""")  # fmt: skip
        assert read.splitlines() == [
            "[('order-1', 'ada', 30), ('order-2', 'ada', 12)]",
            "{'orders': 2, 'total': 42} {'orders': 1, 'total': 25}",
        ]
        status = run("eventlanes", "status", "shop:app", "orders")
        assert re.search(r"orders: head 4, 1 live node\(s\), lag 0 events", status), status
    finally:
        worker.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if worker.poll() is None:
            worker.kill()
        log = worker.communicate()[0]
    assert worker.returncode == 0, log
    assert "ready: 2 processor(s) running" in log, log


def test_every_module_imports_without_the_postgresql_driver() -> None:
    """Spark executors import eventlanes and the user's app, often in a Python without
    psycopg (a SQLite store, or an export): no module may need it to be imported. (A module
    that did stopped every cluster replay at the preflight.)"""
    code = (
        "import importlib, pkgutil, sys\n"
        "for blocked in ('psycopg', 'psycopg_pool', 'psycopg_binary'):\n"
        "    sys.modules[blocked] = None\n"
        "import eventlanes\n"
        "skip = ('eventlanes.testing.postgres', 'eventlanes.dashboard', 'eventlanes.cli')\n"
        "for info in pkgutil.walk_packages(eventlanes.__path__, 'eventlanes.'):\n"
        "    if not info.name.startswith(skip) and info.name != 'eventlanes.__main__':\n"
        "        importlib.import_module(info.name)\n"
        "import tests.apps.cluster_app\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
