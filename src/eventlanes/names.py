"""Validation of names that users choose and that end up in stored rows."""

from __future__ import annotations

import re

from .errors import InvalidInputError

_PROCESSOR_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}")


def validate_processor_name(name: object) -> str:
    if not isinstance(name, str) or not _PROCESSOR_RE.fullmatch(name):
        raise InvalidInputError(
            f"invalid processor name {name!r}: use 1-100 letters, digits, '-', '_' or '.'"
        )
    return name


def validate_owner(owner: object) -> str:
    if not isinstance(owner, str) or not owner.strip() or len(owner) > 200:
        raise InvalidInputError(f"invalid owner {owner!r}: a non-empty string of at most 200 chars")
    return owner
