"""Loading ``module:app`` specs given on the command line."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

from .errors import InvalidInputError

if TYPE_CHECKING:
    from .app import App


def load_app(spec: str) -> App:
    from .app import App

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInputError(f"invalid app {spec!r}: use 'module:attribute' (e.g. shop.app:app)")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules next to the caller are found
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInputError(f"cannot import {module_name!r} for app {spec!r}: {exc}") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise InvalidInputError(
            f"cannot import {module_name!r} for app {spec!r}: syntax error at {where}: {exc.msg}"
        ) from exc
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidInputError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise InvalidInputError(f"{spec!r} is a {type(obj).__name__}, not an eventlanes App")
    return obj
