"""The stable routing hash shared by every engine.

``crc32`` of the key's UTF-8 bytes as an unsigned 32-bit integer. Python's ``hash()`` is salted
per process and would route the same key differently on every node; Spark has ``F.crc32`` built
in, so the local engine and the Spark pipeline route identically.
"""

from __future__ import annotations

from zlib import crc32


def stable_hash(key: str) -> int:
    """Unsigned 32-bit CRC-32 of ``key`` encoded as UTF-8."""
    return crc32(key.encode("utf-8"))


def stable_hashes(keys: list[str]) -> list[int]:
    """:func:`stable_hash` of each key, in C-speed steps (no Python call per key)."""
    return list(map(crc32, map(str.encode, keys)))
