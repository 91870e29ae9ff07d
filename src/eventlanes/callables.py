"""Checking the functions users hand over, where they hand them over.

A handler, fold, key function or mapping is called by the engine later, on another thread,
often in another process. A wrong shape found only then is a failure retried forever (or worse,
an ``async def`` called without being awaited: nothing runs, nothing fails). So each one is
checked when it is defined, with :func:`inspect.signature`: it must accept the arguments it
will be called with, in that order, and be a plain function where nothing would await it.
What cannot be inspected (builtins without a signature) is accepted as it is.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .errors import InvalidInputError

#: names people give each argument; a parameter named like another position's argument (and
#: not like its own) is a swapped pair, e.g. ``def h(ctx, event)``
_ALIASES: dict[str, frozenset[str]] = {
    "event": frozenset({"event", "e", "ev", "evt"}),
    "events": frozenset({"events", "evs", "batch"}),
    "ctx": frozenset({"ctx", "context", "c"}),
    "state": frozenset({"state", "s", "st", "acc"}),
}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def name_of(fn: Any) -> str:
    """How a user would recognise ``fn`` in a message."""
    if isinstance(fn, functools.partial):
        return f"partial({name_of(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str):
        return name.rsplit("<locals>.", 1)[-1]  # a function defined in a function: its name
    return f"{type(fn).__name__} object"


def _plain(sig: inspect.Signature) -> str:
    """A signature as written without its annotations: ``(event, ctx=None)``."""
    empty = inspect.Parameter.empty
    params = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=empty))


def _flag(fn: Any, test: Callable[[Any], bool]) -> bool:
    """``test`` on ``fn``, or on the ``__call__`` of a callable object."""
    if test(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, functools.partial):
        return False
    return test(type(fn).__call__)


def is_async(fn: Any) -> bool:
    return _flag(fn, inspect.iscoroutinefunction)


def check(
    fn: Any,
    what: str,
    params: Sequence[str],
    *,
    awaited: bool = False,
    why_sync: str = "its result is used at once, so nothing would await it",
) -> None:
    """Refuse ``fn`` unless it can be called as ``fn(*params)``.

    ``what`` names the role (``"processor 'users': handler"``). ``awaited``: an ``async def``
    is run (awaited) in this role; else it is refused, saying ``why_sync``. Generator
    functions are always refused: calling one runs none of its body."""
    shape = f"({', '.join(params)})"
    if not callable(fn):
        raise InvalidInputError(
            f"{what} must be a function taking {shape}, got {type(fn).__name__} {fn!r}"
        )
    name = name_of(fn)
    if _flag(fn, inspect.isgeneratorfunction) or _flag(fn, inspect.isasyncgenfunction):
        raise InvalidInputError(
            f"{what} {name} is a generator function (it has `yield`): calling it would run "
            "none of its body; return the result instead"
        )
    if not awaited and is_async(fn):
        raise InvalidInputError(f"{what} {name} is an async def: {why_sync}; make it a plain def")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check
    try:
        sig.bind(*params)
    except TypeError as exc:
        raise InvalidInputError(
            f"{what} {name}{_plain(sig)} cannot be called as {name}{shape} ({exc}); it should look "
            f"like `def {name.rsplit('.', 1)[-1]}{shape}`"
        ) from None
    names = [p.name for p in sig.parameters.values() if p.kind in _POSITIONAL][: len(params)]
    for i, got in enumerate(names):
        if got in _ALIASES.get(params[i], ()):
            continue
        for j, other in enumerate(params):
            if j != i and got in _ALIASES.get(other, ()):
                raise InvalidInputError(
                    f"{what} {name}{_plain(sig)} is called as {name}{shape}: its parameter {got!r} "
                    f"gets the {params[i]}, not the {other} (swapped arguments?)"
                )
