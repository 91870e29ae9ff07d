"""Validation of names that users choose and that end up in stored rows.

A processor's stored name is the name it was defined with; a new version of it (``version=N``,
N >= 2) is stored as ``name@vN``. ``@`` is not allowed in the names users choose, so no
processor can be mistaken for another's version, and version 1 keeps its plain name: an app
that never declares a version stores exactly what it stored before.
"""

from __future__ import annotations

import re

from .errors import InvalidInputError

_BASE = r"[A-Za-z0-9_.\-]{1,100}"
_BASE_RE = re.compile(_BASE)
#: a stored name: the base, then ``@vN`` for versions from 2 on (never ``@v1`` or ``@v02``)
_STORED_RE = re.compile(rf"({_BASE})(?:@v([2-9]|[1-9][0-9]{{1,5}}))?")
MAX_VERSION = 999_999


def validate_processor_name(name: object) -> str:
    """A stored processor name: a user's name, or a version of one (``orders@v2``)."""
    if not isinstance(name, str) or not _STORED_RE.fullmatch(name):
        raise InvalidInputError(
            f"invalid processor name {name!r}: use 1-100 letters, digits, '-', '_' or '.'"
            + (
                " (a version is named with version=N, not @vN)"
                if isinstance(name, str) and "@" in name
                else ""
            )
        )
    return name


def validate_base_name(name: object) -> str:
    """A name a user defines a processor with (no version suffix)."""
    if not isinstance(name, str) or not _BASE_RE.fullmatch(name):
        hint = ""
        if isinstance(name, str) and _STORED_RE.fullmatch(name):
            hint = f" (a version is declared with version=N: {split_version(name)[0]!r}, ...)"
        raise InvalidInputError(
            f"invalid processor name {name!r}: use 1-100 letters, digits, '-', '_' or '.'{hint}"
        )
    return name


def validate_version(version: object, name: str = "") -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        who = f"processor {name!r}: " if name else ""
        raise InvalidInputError(
            f"{who}version must be a whole number from 1 to {MAX_VERSION:,}, got {version!r}"
        )
    return version


def versioned_name(base: str, version: int) -> str:
    """The stored name of ``version`` of processor ``base`` (version 1: ``base`` itself)."""
    return base if version == 1 else f"{base}@v{version}"


def split_version(name: str) -> tuple[str, int]:
    """(base, version) of a stored processor name: ``orders@v2`` -> ("orders", 2)."""
    match = _STORED_RE.fullmatch(name)
    if match is None:
        raise InvalidInputError(f"invalid processor name {name!r}")
    base, version = match.groups()
    return base, int(version) if version else 1


def table_suffix(name: str) -> str:
    """What a version adds to the names of its own tables: ``__vN`` from version 2 on, nothing
    for version 1 (its tables keep the names they always had)."""
    at = name.rfind("@v")
    return "" if at < 0 else f"__v{name[at + 2 :]}"


def validate_owner(owner: object) -> str:
    if not isinstance(owner, str) or not owner.strip() or len(owner) > 200:
        raise InvalidInputError(f"invalid owner {owner!r}: a non-empty string of at most 200 chars")
    return owner


_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,50}")
_VERSIONED = re.compile(r".*__v[0-9]+")


def check_table_name(name: object) -> str:
    """A table name handlers pass to ``ctx.table``: lowercase letters, digits and ``_``; a
    name ending in ``__v`` and digits is how versions' tables are told apart, so it is not
    one a user may choose."""
    if not isinstance(name, str) or not _TABLE.fullmatch(name):
        raise ValueError(f"invalid table name {name!r}: lowercase letters, digits and '_'")
    if "__v" in name and _VERSIONED.fullmatch(name):
        raise ValueError(
            f"invalid table name {name!r}: names ending in __v and digits are the tables of "
            "processor versions (ctx.table adds it for version=N)"
        )
    return name
