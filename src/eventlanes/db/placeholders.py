"""One placeholder style on both backends: ``?``, as SQLite's driver takes it.

psycopg wants ``%s`` (and ``%%`` for a literal ``%`` whenever parameters are passed). A
statement that uses ``?`` placeholders is translated for it: each ``?`` placeholder becomes
``%s`` and every ``%`` becomes ``%%`` (psycopg reads the whole text, quotes included). A ``?``
is a placeholder only where SQL has a value, so these are left alone:

* string literals (``'...'``, ``E'...'`` with backslash escapes), quoted identifiers
  (``"..."``), dollar-quoted text (``$$...$$``, ``$tag$...$tag$``), ``--`` and (nested)
  ``/* */`` comments;
* PostgreSQL operators spelled with ``?``: ``@?``, and any ``?`` that follows an operand (a
  name, a literal, a number, ``)`` or ``]``), which is how ``doc ? 'key'``, ``doc ?| array[...]``,
  ``doc ?& ...`` and the geometric ``?-``, ``?#``, ``?||`` are written. After a keyword that
  takes a value (``WHERE``, ``AND``, ``LIMIT``, ``THEN``...) a ``?`` is a placeholder.

Statements without a ``?`` placeholder go to psycopg as written, so its own ``%s`` style keeps
working; with no parameters at all, a ``%`` that psycopg would refuse is sent as is. A statement
that mixes ``?`` and ``%s`` placeholders, or uses SQLite's numbered ``?NNN``, is refused.
Translations are cached per statement text (statements are few; their parameters vary).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from ..errors import InvalidInputError

#: words after which a value comes, so a ``?`` after them is a placeholder, not an operator
# fmt: off
KEYWORDS = frozenset((
    "all", "and", "any", "array", "asymmetric", "between", "both", "by", "case", "distinct", "do",
    "else", "escape", "exists", "fetch", "first", "for", "from", "having", "ilike", "in", "is",
    "leading", "like", "limit", "next", "not", "offset", "on", "or", "overlaps", "placing",
    "return", "returning", "select", "set", "similar", "some", "symmetric", "then", "to",
    "trailing", "using", "values", "when", "where", "zone",
))
# fmt: on
_SPACE = frozenset(" \t\n\r\f\v")
_WORD_START = re.compile(r"[A-Za-z_\x80-\U0010ffff]")
_WORD = re.compile(r"[A-Za-z0-9_$\x80-\U0010ffff]*")
_NUMBER = re.compile(r"(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?")
_DOLLAR = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
#: psycopg's placeholders; ``%s`` must not run into a name (``x%step`` is a modulo)
_PYFORMAT = re.compile(r"%[sbt](?![A-Za-z0-9_])|%\(")
#: each ``%`` with what psycopg reads after it (``%%``, ``%s``, ``%b``, ``%t``, ``%(``), if any
_PERCENT = re.compile(r"%[%sbt(]?")


def _skip_quoted(sql: str, i: int, quote: str, backslash: bool) -> int:
    """The index after the literal opening at ``i`` (a doubled quote is part of it)."""
    n = len(sql)
    i += 1
    while i < n:
        c = sql[i]
        if backslash and c == "\\":
            i += 2
            continue
        if c == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    raise InvalidInputError(f"unterminated {quote}-quoted text in SQL: {sql!r}")


def _skip_block_comment(sql: str, i: int) -> int:
    depth, i, n = 0, i, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise InvalidInputError(f"unterminated /* comment in SQL: {sql!r}")


def scan(sql: str) -> tuple[list[int], bool]:
    """The offsets of the ``?`` placeholders in ``sql``, and whether it has psycopg
    placeholders (``%s``...) outside literals and comments."""
    marks: list[int] = []
    pyformat = False
    operand = False  # whether the last token ends a value (a ``?`` after it is an operator)
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in _SPACE:
            i += 1
        elif c == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif c == "/" and sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
        elif c == "'":
            i, operand = _skip_quoted(sql, i, "'", False), True
        elif c == '"':
            i, operand = _skip_quoted(sql, i, '"', False), True
        elif c == "$" and (tag := _DOLLAR.match(sql, i)) is not None:
            end = sql.find(tag.group(), tag.end())
            if end < 0:
                raise InvalidInputError(f"unterminated {tag.group()} quote in SQL: {sql!r}")
            i, operand = end + len(tag.group()), True
        elif _WORD_START.match(c):
            word = _WORD.match(sql, i + 1)
            assert word is not None
            end = word.end()
            text = sql[i:end]
            if end < n and sql[end] == "'" and text.lower() in ("e", "b", "x", "n"):
                i, operand = _skip_quoted(sql, end, "'", text.lower() == "e"), True
            else:
                i, operand = end, text.lower() not in KEYWORDS
        elif c.isdigit() or (c == "." and i + 1 < n and sql[i + 1].isdigit()):
            number = _NUMBER.match(sql, i)
            assert number is not None
            i, operand = number.end(), True
        elif c in ")]":
            i, operand = i + 1, True
        elif c == "?":
            if i + 1 < n and sql[i + 1].isdigit():
                raise InvalidInputError(
                    f"numbered placeholders (?{sql[i + 1]}...) are SQLite's own: use plain ? "
                    f"in SQL for both backends: {sql!r}"
                )
            if not operand and not (i and sql[i - 1] == "@"):
                marks.append(i)
                operand = True  # a value: a ``?`` right after it is an operator
            else:
                operand = False  # an operator: a value follows
            i += 1
        else:
            if c == "%" and _PYFORMAT.match(sql, i):
                pyformat = True
            i, operand = i + 1, False
    return marks, pyformat


@lru_cache(maxsize=1024)
def _plan(sql: str) -> tuple[str, bool]:
    """``sql`` for psycopg with parameters, and whether it must be sent as written when there
    are none (a ``%`` psycopg would refuse)."""
    marks, pyformat = scan(sql)
    if not marks:
        # A % psycopg would refuse (none of the above after it): the SQL's own, as written.
        return sql, any(len(m.group()) == 1 for m in _PERCENT.finditer(sql))
    if pyformat:
        raise InvalidInputError(
            f"SQL mixes ? and %s placeholders: use ? (both backends) throughout: {sql!r}"
        )
    parts, last = [], 0
    for at in marks:
        parts.append(sql[last:at].replace("%", "%%"))
        parts.append("%s")
        last = at + 1
    parts.append(sql[last:].replace("%", "%%"))
    return "".join(parts), False


def for_psycopg(sql: str, params: Any) -> tuple[str, Any]:
    """``(sql, params)`` as psycopg takes them (see the module's docstring)."""
    text, as_written = _plan(sql)
    if as_written and not params:
        return sql, None
    return text, params


def translated(sql: str) -> str:
    """``sql`` for psycopg with parameters (``executemany``)."""
    return _plan(sql)[0]
