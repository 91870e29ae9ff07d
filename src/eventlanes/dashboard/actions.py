"""The dashboard's actions: the App's own admin methods, with the command line's refusals.

``act`` changes something (retry, discard, split, merge, release, reset, pause, resume,
promote, retire) and returns one line saying what was done (a reset whose plan warns needs
``"confirm": true``, as the CLI needs ``--yes``); ``plan`` only reads what a reset
or a retire would do, for the dialog that asks before it. Bad input raises
:class:`InvalidInputError`; a refused action raises what the App raises (a version not caught
up, a processor still running): the server answers 400 with its message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..admin.reset import parse_reset_to
from ..errors import InvalidInputError

if TYPE_CHECKING:
    from ..app import App

PROCESSOR_ACTIONS = ("retry", "discard", "split", "merge", "release", "reset", "pause",
                     "resume", "promote", "retire")  # fmt: skip
INGESTOR_ACTIONS = ("retry", "discard", "pause", "resume")
PLANS = ("reset-plan", "retire-plan")


def _int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an integer, got {value!r}")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be true or false, got {value!r}")
    return value


def _to(body: dict[str, Any]) -> Any:
    to = body.get("to", "tail")
    if not isinstance(to, str):
        raise InvalidInputError(f"reset needs tail, head, a position or an ISO time, got {to!r}")
    return parse_reset_to(to.strip(), "reset target")


def _known(app: App, name: str, what: str, allowed: tuple[str, ...]) -> None:
    if name in app.ingestors:
        if what not in INGESTOR_ACTIONS:
            raise InvalidInputError(f"{what} does not apply to ingestor {name!r}")
        return
    app.get(name)  # unknown: "unknown processor ... (defined: ...)"
    if what not in allowed:
        raise InvalidInputError(f"unknown action {what!r}")


def act(app: App, name: str, what: str, body: dict[str, Any]) -> str:
    _known(app, name, what, PROCESSOR_ACTIONS)
    if what in ("retry", "discard"):
        key = body.get("key")
        if key is not None and not isinstance(key, str):
            raise InvalidInputError(f"key must be a string, got {key!r}")
        position = _int(body, "position")
        which = (f"key {key!r}" if key is not None
                 else f"position {position}" if position is not None else "all keys")  # fmt: skip
        if what == "retry":
            handled, left = app.retry_dead_letters(name, key=key, position=position)
            return f"{name} ({which}): {handled} event(s) handled, {left} still parked"
        count = app.discard_dead_letters(name, key=key, position=position)
        return f"{name} ({which}): discarded {count} event(s)"
    if what in ("split", "merge", "release"):
        segment = _int(body, "segment")
        if segment is None:
            raise InvalidInputError(f"{what} needs a segment id")
        return f"{name}: " + getattr(app, what)(name, segment)
    if what in ("pause", "resume"):
        changed = getattr(app, what)(name)
        past = "paused" if what == "pause" else "resumed"
        return f"{name}: {past}" if changed else f"{name}: already {past}"
    if what == "reset":
        to = _to(body)
        _confirmed(app, name, to, body)
        position = app.reset(name, to)
        return f"{name}: reset; continues from position {position:,} on the next run"
    if what == "promote":
        return app.promote(name)
    keep = _flag(body, "keep_tables")  # retire
    app.retire_plan(name, keep_tables=keep)  # refused here, with the reasons, as on the CLI
    app.retire(name, keep_tables=keep)
    return f"{name}: retired"


def _confirmed(app: App, name: str, to: Any, body: dict[str, Any]) -> None:
    """A reset whose plan warns (rows written twice...) runs only when ``confirm`` is true, as
    the CLI asks for ``--yes``: a stale page or a script never resets past a warning unseen."""
    warnings = app.reset_plan(name, to).warnings
    if warnings and not _flag(body, "confirm"):
        raise InvalidInputError(
            f"reset of {name!r} not done: {'; '.join(warnings)}; confirm to reset anyway"
        )


def plan(app: App, name: str, what: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a reset or a retire would do (read only), for the dialog to show before asking."""
    _known(app, name, what, PLANS)
    if what == "reset-plan":
        p = app.reset_plan(name, _to(body))
        lines = [p.summary()]
        refused = None
        if p.held:
            refused = (f"{name} is running ({', '.join(p.held)}): stop it everywhere before "
                       "resetting it")  # fmt: skip
        # confirm: the reset is sent with confirm=true only once the operator ticked it
        return {"lines": lines, "warnings": p.warnings, "refused": refused, "to": p.to,
                "replays": p.replays, "first_time": p.first_time,
                "confirm": bool(p.warnings)}  # fmt: skip
    retire = app.retire_plan(name, keep_tables=_flag(body, "keep_tables"))
    return {"lines": [retire.summary()], "warnings": [], "refused": None}
