"""Top-level properties of the events' JSON data as typed Arrow columns, parsed in C by
pyarrow's JSON reader: exact, or not at all (None: the caller takes its Python path).

The reference is Python's reading of the text (``json.loads``; Spark's ``from_json`` agrees
on what is taken here). pyarrow's reader is strict where it matters: a value of another type
than the one asked for, an integer beyond 64 bits, a property named twice in an object, a
lone surrogate, a control character inside a string or malformed JSON fail the parse. What
it would read differently is ruled out before it parses: a text that is not one object
(``{`` ... ``}``: an empty text or two objects in one would shift rows), nesting deeper than
Python's decoders go, and for floating-point properties ``NaN``/``Infinity``.
"""

from __future__ import annotations

import re
from typing import Any

#: Spark type names (as declarations and export manifests use them) -> Arrow type names
ARROW = {"long": "int64", "double": "float64", "string": "string", "boolean": "bool_"}
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # names written into a pattern as they are
#: JSON texts longer than this (bytes) have their brackets counted, over this many not taken
#: (below what Python's decoders reach); the pushdowns check their texts by the same bounds
LONG_TEXT, MAX_OPENERS = 800, 400
#: their digits too: Python refuses an integer of over 4,300 digits (a run of 1,000 is not
#: taken: RE2 repeats at most 1,000 times)
_DIGITS = "[0-9]{1000}"
#: Arrow type names -> Spark type names (the inverse of ARROW)
SPARK = {"int64": "long", "double": "double", "string": "string", "bool": "boolean"}


def _lines(texts: Any) -> Any:
    """The texts as one buffer of JSON objects (their bytes as they are: the reader takes
    concatenated values), or None when a text might not read as exactly one object there.

    Each text starting with ``{`` and ending with ``}``, and as many rows read as texts, is
    one object per text: such texts cannot merge (a ``{`` after a complete value is an
    error), so one reading as two would need another reading as none. Control characters
    inside strings fail the parse (as in Python and Spark); nesting is bounded below what
    Python's decoders reach (over 400 brackets in a text: not taken), as are numbers longer than
    Python reads (a run of 1,000 digits: not taken)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(texts) == 0 or texts.null_count or not pa.types.is_string(texts.type):
        return None
    whole = pc.and_(pc.starts_with(texts, "{"), pc.ends_with(texts, "}"))
    if not pc.all(whole).as_py():
        return None
    if pc.max(pc.binary_length(texts)).as_py() > LONG_TEXT:
        openers = pc.add(pc.count_substring(texts, "{"), pc.count_substring(texts, "["))
        if pc.max(openers).as_py() > MAX_OPENERS:
            return None
        if pc.any(pc.match_substring_regex(texts, _DIGITS)).as_py():
            return None
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)
    first, last = int(offsets[texts.offset]), int(offsets[texts.offset + len(texts)])
    return texts.buffers()[2][first:last]


def _read(buffer: Any, schema: Any | None) -> Any:
    import pyarrow as pa
    import pyarrow.json as pj

    if buffer.size >= 2**31 - 1:  # one block must hold it all (a 32-bit size)
        return None
    options = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, buffer.size + 1))
    parse = (
        pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        if schema is not None
        else pj.ParseOptions()
    )
    try:
        return pj.read_json(pa.BufferReader(buffer), read_options=options, parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _no_specials(texts: Any) -> bool:
    import pyarrow.compute as pc

    return not pc.any(pc.match_substring_regex(texts, "NaN|Infinity")).as_py()


def declared(texts: Any, kinds: dict[str, str]) -> dict[str, Any] | None:
    """Properties ``kinds`` (name -> Spark type) of every text, as Arrow arrays of those
    types (null where absent or null), or None when that is not exact. A value of another
    type fails the parse: the caller's JSON path then raises the error naming the event."""
    import pyarrow as pa

    if "double" in kinds.values() and not _no_specials(texts):
        return None
    buffer = _lines(texts)
    if buffer is None:
        return None
    schema = pa.schema([(p, getattr(pa, ARROW[k])()) for p, k in kinds.items()])
    table = _read(buffer, schema)
    if table is None or table.num_rows != len(texts):
        return None
    return {p: table.column(p).combine_chunks() for p in kinds}


def inferred(texts: Any) -> dict[str, tuple[str | None, Any]] | None:
    """Every top-level property of the texts: name -> (Spark type, Arrow array) when its
    values have one such type, (None, None) when they do not (nested values, mixed types,
    integers beyond 64 bits), ("", None) when they are all null; or None when the parse
    cannot say exactly (the caller reads the texts in Python)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    buffer = _lines(texts)
    if buffer is None:
        return None
    table = _read(buffer, None)
    if table is None or table.num_rows != len(texts):
        return None
    out: dict[str, tuple[str | None, Any]] = {}
    strings = []
    for field in table.schema:
        t = field.type
        if pa.types.is_null(t):
            out[field.name] = ("", None)
        elif pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
            strings.append(field.name)  # text that looks like a time: a string for us
        elif str(t) in SPARK:
            out[field.name] = (SPARK[str(t)], table.column(field.name).combine_chunks())
        else:  # objects, arrays
            out[field.name] = (None, None)
    doubles = [n for n, (k, _) in out.items() if k == "double"]
    if doubles and not _no_specials(texts):
        return None
    for name in doubles:
        # A double column also holds integers (promoted): a property is one type only when
        # no value is an integer literal. A property of that name nested deeper, or written
        # with escapes, makes this say "maybe": untyped then, as mixed types are.
        literal = f'"{name}"\\s*:\\s*-?[0-9]+\\s*[,}}]'
        if (
            not _PLAIN.fullmatch(name)
            or pc.any(pc.match_substring(texts, "\\")).as_py()
            or pc.any(pc.match_substring_regex(texts, literal)).as_py()
        ):
            out[name] = (None, None)
    if strings:
        schema = pa.schema([(n, pa.string()) for n in strings])
        again = _read(buffer, schema)
        if again is None or again.num_rows != len(texts):
            return None
        for name in strings:
            out[name] = ("string", again.column(name).combine_chunks())
    return out
