"""Getting code and the store to the executors, and checking both before the real job.

Spark pickles the user's functions by reference: an executor must import the module that
defines them. Modules the app loaded from its own directories (not from an installed
environment) are zipped on the fly and added with ``addArtifacts`` (classic and Spark Connect
sessions alike); so is eventlanes itself when the executors cannot import it (it is pure
Python). Third-party packages the executors lack cannot be shipped this way: a preflight job
(one task: a DataFrame of one row, no RDD, so Connect runs it too) checks on an executor that
its Python has pyarrow and pandas (PySpark's Arrow path) and, for PostgreSQL, the ADBC driver
(the range reads), imports everything, compares eventlanes' version with the driver's and
opens the store read-only there; any failure stops the run at once with one line saying what
is missing and how to ship it, instead of a Py4J trace after
four task retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..db import parse_url
from ..errors import InvalidInputError, SparkJobError, StoreConnectionError
from .session import is_connect, is_local

# Zip names already added, per SparkContext (classic: its sessions share what it ships) or per
# Connect session (artifacts are the session's own).
_shipped: dict[int, set[str]] = {}

SHIP_HINT = (
    "install it on every node, or ship it: --py-files a wheel or zip (pure Python), or "
    "--archives env.tar.gz#environment with PYSPARK_PYTHON=./environment/bin/python"
)


def open_readonly(url: str) -> Any:
    """The store, opened read-only: never creates a file, a schema or a table; a missing
    store raises StoreConnectionError."""
    from ..store import open_store

    return open_store(url, create=False)


def executor_url(url: str, master: str | None) -> str:
    """The store URL as executors must see it. A relative SQLite path is resolved on the
    driver for local masters; on a cluster it is refused: each executor would resolve it in
    its own working directory and read (or create) a different, empty file."""
    parsed = parse_url(url)
    if parsed.backend != "sqlite" or os.path.isabs(parsed.target):
        return url
    if not is_local(master):
        raise InvalidInputError(
            f"store URL {url!r} is a relative SQLite path: executors would resolve it in their "
            "own working directory. Use an absolute path mounted at the same place on every "
            "node (sqlite:////abs/path/events.db), or PostgreSQL"
        )
    head, _, query = url.partition("?")
    absolute = "sqlite:///" + str(Path(parsed.target).resolve())
    return absolute + (f"?{query}" if query else "")


def _installed_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k, "") for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    roots |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return [str(Path(r).resolve()) for r in roots if r]


def _is_installed(path: Path) -> bool:
    text = str(path)
    return (
        "site-packages" in text
        or "dist-packages" in text
        or any(text.startswith(root + os.sep) for root in _installed_roots())
    )


def module_file(name: str) -> Path | None:
    """Where a top-level module or package was loaded from (None: builtin or namespace)."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    return path.parent if path.name == "__init__.py" else path


def user_modules(functions: Iterable[Callable[..., Any]]) -> list[str]:
    """Top-level modules to ship: those defining ``functions``, and every other module loaded
    from the same directories (what the app imports from its own directory)."""
    tops = set()
    for fn in functions:
        name = getattr(fn, "__module__", None)
        if name and name != "__main__":
            tops.add(name.split(".")[0])
    roots: set[Path] = set()
    for top in list(tops):
        path = module_file(top)
        # Not shipped: installed packages, eventlanes (see preflight), and modules imported
        # from a zip (``--py-files``: Spark already ships those).
        if path is None or not path.exists() or _is_installed(path) or top == "eventlanes":
            tops.discard(top)
        else:
            roots.add(path.parent)
    for name in list(sys.modules):
        top = name.split(".")[0]
        if top in tops or top == "eventlanes" or "." in name:
            continue
        path = module_file(top)
        if path is not None and path.parent in roots and path.exists():
            tops.add(top)
    return sorted(tops)


def zip_modules(tops: list[str]) -> Path:
    """A zip of these top-level modules (``.py`` files only), named by its content so a
    changed module is shipped again and an unchanged one is not."""
    entries: list[tuple[str, Path]] = []
    for top in tops:
        path = module_file(top)
        if path is None:
            continue
        if path.is_dir():
            for file in sorted(path.rglob("*.py")):
                if "__pycache__" not in file.parts:
                    entries.append((f"{top}/{file.relative_to(path).as_posix()}", file))
        else:
            entries.append((path.name, path))
    digest = hashlib.sha256()
    for arcname, file in entries:
        digest.update(arcname.encode())
        digest.update(file.read_bytes())
    out = Path(tempfile.gettempdir()) / f"eventlanes-ship-{digest.hexdigest()[:16]}.zip"
    if not out.exists():
        temp = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as z:
            for arcname, file in entries:
                z.write(file, arcname)
        os.replace(temp, out)
    return out


def ship(spark: Any, tops: list[str]) -> None:
    if not tops:
        return
    path = zip_modules(tops)  # named by its content: never DUPLICATED_ARTIFACT
    done = _shipped.setdefault(id(spark if is_connect(spark) else spark.sparkContext), set())
    if path.name not in done:
        spark.addArtifacts(str(path), pyfile=True)
        done.add(path.name)


# The check runs on an executor that may not have eventlanes: it must travel by value.
# cloudpickle sends a function by value when its module cannot be imported by name, so it is
# compiled here into a module name that exists nowhere.
_CHECK_SOURCE = """
def check(_rows, modules, url, adbc):
    import importlib
    import sys
    result = {"missing": [], "store": None, "eventlanes": None, "python": sys.executable,
              "packages": []}
    # What Spark's Arrow path needs in the executors' Python (mapInArrow, Arrow batches),
    # with the minimum versions PySpark itself requires; and the ADBC driver that reads the
    # store into Arrow there (``adbc``: its module, None when executors read no store).
    for name in ("pyarrow", "pandas", *([adbc] if adbc else [])):
        try:
            importlib.import_module(name)
        except Exception as exc:
            result["packages"].append((name.split(".")[0], f"{type(exc).__name__}: {exc}"))
    if not any(name in ("pyarrow", "pandas") for name, _ in result["packages"]):
        from pyspark.sql.pandas import utils
        for name, require in (("pandas", utils.require_minimum_pandas_version),
                              ("pyarrow", utils.require_minimum_pyarrow_version)):
            try:
                require()
            except Exception as exc:
                result["packages"].append((name, str(exc).strip().splitlines()[0]))
    for name in ["eventlanes", "eventlanes.spark.fold", *modules]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            result["missing"].append((name, f"{type(exc).__name__}: {exc}"))
            if name == "eventlanes":
                break
    if not result["missing"]:
        import eventlanes
        result["eventlanes"] = eventlanes.__version__
        try:
            from eventlanes.spark.ship import open_readonly
        except Exception as exc:
            result["missing"].append(("eventlanes.spark.ship", f"{type(exc).__name__}: {exc}"))
            url = None
        if url:
            try:
                store = open_readonly(url)
                try:
                    result["store"] = ("ok", store.head())
                finally:
                    store.close()
            except Exception as exc:
                result["store"] = ("error", f"{type(exc).__name__}: {exc}")
    yield result
"""


def _check_function() -> Callable[..., Any]:
    namespace: dict[str, Any] = {"__name__": "_eventlanes_preflight"}
    exec(compile(_CHECK_SOURCE, "<eventlanes preflight>", "exec"), namespace)
    return namespace["check"]


def _run_check(spark: Any, modules: list[str], url: str | None, adbc: str | None) -> dict[str, Any]:
    from pyspark.sql import functions as F

    check = _check_function()
    # A plain Python UDF, not an Arrow one: its worker runs without pyarrow and pandas, so the
    # check can say which of them the executors lack.
    probe = F.udf(lambda _: json.dumps(next(check(None, modules, url, adbc))), "string",
                  useArrow=False)  # fmt: skip
    try:
        row = spark.range(0, 1, 1, 1).select(probe("id").alias("result")).collect()[0]
        return dict(json.loads(row["result"]))
    except Exception as exc:
        raise SparkJobError(
            f"executors cannot run Python: {first_line(exc)}. The executors' Python is "
            "PYSPARK_PYTHON on the nodes (default python3); it needs pyarrow, pandas<3 and "
            "orjson"
        ) from exc


def preflight(
    spark: Any,
    functions: Iterable[Callable[..., Any]] = (),
    url: str | None = None,
    head: int | None = None,
    reads_store: bool = True,
) -> None:
    """Ship the app's modules, check on one executor that eventlanes and they import, that
    the store opens read-only there (at a head not behind ``head``, the driver's view) and,
    when the executors read the store (``reads_store``; not a Parquet replay), that its
    ADBC driver imports (PostgreSQL's: SQLite is read by Python's own library). Raises a
    one-line error otherwise."""
    functions = list(functions)
    adbc = None
    if url and reads_store and parse_url(url).backend != "sqlite":  # store.arrow.driver's
        adbc = "adbc_driver_postgresql.dbapi"
    modules = user_modules(functions)
    # Import on the executor exactly the modules that define the functions (a package's
    # submodule may import what the executors lack).
    defining = sorted({m for f in functions if (m := getattr(f, "__module__", None))
                       and m != "__main__" and m.split(".")[0] in modules})  # fmt: skip
    own = module_file("eventlanes")
    if own is not None and own.is_dir() and not _is_installed(own):
        modules_to_ship = [*modules, "eventlanes"]  # a source tree: executors run this copy
    else:
        modules_to_ship = modules
    ship(spark, modules_to_ship)
    checked = [*modules, *defining]
    result = _run_check(spark, checked, url, adbc)
    if result["missing"] and result["missing"][0][0] == "eventlanes":
        ship(spark, ["eventlanes"])  # pure Python: the driver's own copy, same version
        result = _run_check(spark, checked, url, adbc)
    if result["packages"]:
        lacking = ", ".join(f"{name} ({error})" for name, error in result["packages"])
        needs = "pyarrow and pandas<3" + (
            f", the store's reads {adbc.split('.')[0]}" if adbc else ""
        )
        raise SparkJobError(
            f"the executors' Python ({result['python']}) lacks {lacking}: PySpark's Arrow "
            f"path needs {needs} there. Install them on every node (pip install "
            "'eventlanes[spark]'), or ship an environment that has them: --archives "
            "env.tar.gz#environment with PYSPARK_PYTHON=./environment/bin/python"
        )
    if result["missing"]:
        name, error = result["missing"][0]
        raise SparkJobError(f"executors cannot import {name} ({error}): {SHIP_HINT}")
    import eventlanes

    if result["eventlanes"] != eventlanes.__version__:
        raise SparkJobError(
            f"executors run eventlanes {result['eventlanes']}, the driver "
            f"{eventlanes.__version__}: install the same version on every node, or ship it"
        )
    store = result["store"]
    if url and store is not None and store[0] == "error":
        redacted = parse_url(url).redacted
        raise StoreConnectionError(
            f"executors cannot open the store {redacted}: {store[1]}. The store must be "
            "reachable from every node (PostgreSQL with eventlanes[postgres] installed there, "
            "or SQLite at the same absolute path on every node)"
        )
    if url and head is not None and store is not None and store[1] < head:
        raise StoreConnectionError(
            f"executors see a different store at {parse_url(url).redacted}: its head is "
            f"{store[1]:,}, the driver's {head:,}"
        )


#: how Spark says a task ran out of memory
OUT_OF_MEMORY = ("SparkOutOfMemoryError", "UNABLE_TO_ACQUIRE_MEMORY", "java.lang.OutOfMemoryError")
MEMORY_HINT = (
    "Spark ran out of memory: give it more (local[N]: --conf spark.driver.memory=4g, read "
    "when its JVM starts; a cluster: spark.executor.memory)"
)


def first_line(exc: BaseException) -> str:
    """The useful line of a Spark failure: the Python error raised on the executor, not the
    Py4J wrapping around it; with what to do when Spark ran out of memory."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = (lines[0] if lines else type(exc).__name__)[:500]
    for marker in ("Error: ", "Exception: "):
        found = [line for line in lines if marker in line and not line.startswith("at ")]
        if found:
            line = found[-1][:500]
            break
    if any(marker in text for marker in OUT_OF_MEMORY):
        return f"{line} ({MEMORY_HINT})"
    return line
