"""Loading ``module:app`` or ``path/to/file.py:app`` specs given on the command line (and
the store URL of one, for the commands that take a URL or an app: ``info``, ``migrate``).

A file is imported as the top-level module named after it, with its directory first on the
path (as ``python path/to/file.py`` would see its neighbours); so worker processes and Spark
executors import it again by that name. Any failure of the import is one
:class:`InvalidInputError` naming the module, the exception and where it was raised.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import InvalidInputError

if TYPE_CHECKING:
    from .app import App

_USAGE = "use 'module:attribute' or 'path/to/file.py:attribute' (e.g. shop.app:app, ./shop.py:app)"


def load_app(spec: str) -> App:
    from .app import App

    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise InvalidInputError(f"invalid app {spec!r}: {_USAGE}")
    if target.endswith(".py") or os.sep in target or "/" in target:
        module_name, module = _import_file(spec, target)
    else:
        module_name, module = target, _import_module(spec, target)
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidInputError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise InvalidInputError(f"{spec!r} is a {type(obj).__name__}, not an eventlanes App")
    return obj


def store_url(target: str) -> str:
    """The store URL of a command that takes one (``info``, ``migrate``): ``target`` itself
    when it is a URL (it has ``://``), else the URL of the app that ``module:app`` names, as
    every other command takes it."""
    scheme = target.partition(":")[0].lower()
    if "://" in target or ":" not in target or scheme in ("sqlite", "postgresql", "postgres"):
        return target  # a URL, or not an app either: parse_url names what a URL needs
    return load_app(target).url


def _import_module(spec: str, name: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules next to the caller are found
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise InvalidInputError(
                f"cannot import {name!r} for app {spec!r}: {exc} (from {cwd!r}; a file "
                "is given as path/to/file.py:attribute)"
            ) from exc
        raise _import_failed(spec, name, exc) from exc
    except (Exception, SystemExit) as exc:
        raise _import_failed(spec, name, exc) from exc


def _import_file(spec: str, target: str) -> tuple[str, ModuleType]:
    path = Path(target).expanduser().resolve()
    if path.suffix != ".py" or not path.is_file():
        what = "no such file" if not path.exists() else "not a .py file"
        raise InvalidInputError(f"invalid app {spec!r}: {str(path)!r}: {what} ({_USAGE})")
    name = path.stem
    if not name.isidentifier():
        raise InvalidInputError(
            f"invalid app {spec!r}: {path.name!r} cannot be imported as a module (its name "
            "must be a Python identifier: letters, digits and '_')"
        )
    loaded = sys.modules.get(name)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        if file is not None and Path(file).resolve() == path:
            return name, loaded
        raise InvalidInputError(
            f"invalid app {spec!r}: module name {name!r} is already taken by "
            f"{file or 'a built-in module'}: rename {path.name}"
        )
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its neighbours import as they would next to it
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:  # pragma: no cover - a .py file
        raise InvalidInputError(f"invalid app {spec!r}: cannot load {str(path)!r}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[name]
        raise _import_failed(spec, name, exc) from exc
    return name, module


def _import_failed(spec: str, name: str, exc: BaseException) -> InvalidInputError:
    """One line: the exception and where it was raised (the deepest frame outside the import
    machinery), and the app module's own line when that is elsewhere."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else name
        return InvalidInputError(
            f"cannot import {name!r} for app {spec!r}: syntax error at {where}: {exc.msg}"
        )
    machinery = (os.path.dirname(importlib.__file__) + os.sep, "<frozen ")
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(machinery) and f.filename != __file__
    ]
    where = ""
    if frames:
        raised, first = frames[-1], frames[0]
        where = f" (at {raised.filename}:{raised.lineno}"
        if first is not raised:
            where += f", from {first.filename}:{first.lineno}"
        where += ")"
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return InvalidInputError(f"cannot import {name!r} for app {spec!r}: {detail}{where}")
