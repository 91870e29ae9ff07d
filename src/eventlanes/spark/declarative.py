"""Declarative aggregations on Spark: column expressions only, no Python on the executors.

The plan reads the declared properties with one ``from_json`` per event (FAILFAST: a value of
the wrong type fails the replay, as it fails the local engine), and the root of each event's
source chain with another (only for events whose metadata mention one).

Exactly-once, as the local engine (``aggregating/dedupe.py``): per key and root source, in
position order, an input is dropped unless its root partition differs from the previous one's
or its path is greater than every path before it in the same run of partitions. For a key
none of whose events carries a chain, every event is its own root with a growing position:
nothing can be dropped, and the states are plain ``groupBy`` aggregates (partial aggregation
before the shuffle). Keys with chained events (found first, broadcast) take the window plan.

Output per key: the state as JSON (``{field: value}``), the offsets as JSON in the local
engine's shape (``{source: [partition, path]}``) and the inputs dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import FieldTypeError
from ..processing.aggregating.declarative import TYPES, Declaration, Op
from .export import PREFIX

CHAIN_SCHEMA = (
    "source_chain array<struct<source: string, partition: string, offset: long, out: long>>"
)
STATES = "key string, value string, offsets string, dropped long, dropped_by string, rows long"
FIELD_ERROR = "[eventlanes field type] "  # marks our type errors in Spark's exception text
_PARTIAL = re.compile(r"f\d+|at\d+|events")  # the columns of partial folds (source.Declared)


def _json(col: Any) -> Any:
    """A column's value as JSON text (a string column's: a JSON string literal, escaped by
    Spark's JSON writer)."""
    from pyspark.sql import functions as F

    text = F.to_json(F.array(col))  # [...]
    return F.substring(text, 2, F.length(text) - 2)


#: a JSON value's type as the variant names it -> the Python type the local engine names
_KINDS = (("BIGINT", "int"), ("INT", "int"), ("SMALLINT", "int"), ("TINYINT", "int"),
          ("DOUBLE", "float"), ("FLOAT", "float"), ("BOOLEAN", "bool"))  # fmt: skip


def string_key(data: Any, prop: str, what: str) -> Any:
    """Data property ``prop`` of the JSON text ``data`` when it is a JSON string; null when it
    is absent or null (or the text is not JSON); any other value fails the job naming the event
    (``FIELD_ERROR``), as the local engine refuses a key that is not a string
    (``policies.state_key``). Spark's own readings would render 5 as "5" (one state)."""
    from pyspark.sql import functions as F

    value = F.try_variant_get(F.try_parse_json(data), f"$.{prop}", "variant")
    kind = F.schema_of_variant(value)
    named = F.lit(None).cast("string")
    for variant, python in _KINDS:
        named = F.when(kind == variant, F.lit(python)).otherwise(named)
    named = F.coalesce(
        F.when(kind.startswith("DECIMAL"), F.lit("float")),
        F.when(kind.startswith("OBJECT"), F.lit("dict")),
        F.when(kind.startswith("ARRAY"), F.lit("list")),
        named,
        F.lower(kind),
    )
    error = F.concat(
        F.lit(f"{FIELD_ERROR}{what}: event "), F.col("position").cast("string"),
        F.lit(" ("), F.col("type"), F.lit("): the key is "), named, F.lit(" "),
        F.to_json(value), F.lit(": a key must be a string"),
    )  # fmt: skip
    return (
        F.when(value.isNull() | (kind == "VOID"), F.lit(None).cast("string"))
        .when(kind == "STRING", F.variant_get(value, "$", "string"))
        .otherwise(F.raise_error(error).cast("string"))
    )


def refused_key(prop: str, what: str) -> Any:
    """An export's typed column of the key that is not of strings: each value in it fails
    the job naming the event (null: none)."""
    from pyspark.sql import functions as F

    col = F.col(PREFIX + prop)
    error = F.concat(
        F.lit(f"{FIELD_ERROR}{what}: event "), F.col("position").cast("string"),
        F.lit(" ("), F.col("type"), F.lit("): the key is "), _json(col),
        F.lit(": a key must be a string"),
    )  # fmt: skip
    return F.when(col.isNull(), F.lit(None).cast("string")).otherwise(
        F.raise_error(error).cast("string")
    )


def _typed(prop: str, type_: type, kind: str | None, decl: Declaration) -> Any:
    """Property ``prop`` from the export's typed column (of Spark type ``kind``) as the declared
    ``type_``, failing on a value of another type (naming the event, as the local engine); or
    None when the column cannot say (parse the JSON instead)."""
    from pyspark.sql import functions as F

    if kind is None:
        return None
    col = F.col(PREFIX + prop)
    want = TYPES[type_]
    if kind == want:
        return col
    if prop == decl.key:  # a key is a string: refused as the local engine refuses it
        return refused_key(prop, f"aggregation {decl.name!r}")
    if (want, kind) in (("double", "long"), ("string", "long"), ("string", "boolean")):
        return col.cast(want)  # float(int), and JSON's text of an integer or a boolean
    if want == "string":  # a double's text differs between Java and JSON: parse it
        return None
    error = F.concat(
        F.lit(f"{FIELD_ERROR}aggregation {decl.name!r}: event "),
        F.col("position").cast("string"),
        F.lit(" ("), F.col("type"), F.lit(f"): data property {prop!r} is "),
        _json(col), F.lit(f", declared {type_.__name__}"),
    )  # fmt: skip
    return F.when(col.isNull(), F.lit(None).cast(want)).otherwise(F.raise_error(error).cast(want))


def _rows(
    decl: Declaration,
    df: Any,
    source: str,
    columns: dict[str, str] | None = None,
    chains: bool = True,
    keep: tuple[str, ...] = (),
) -> Any:
    """key, position, src, part, path, chained, the typed properties (``c_<name>``) and the
    columns ``keep`` as they are.

    Every row read stays (``ok``: of a folded type; the others have a null key) so that the
    plan counts the rows it read. ``columns``: the export's typed columns (property -> Spark
    type); the other declared properties come from one ``from_json`` of ``data``. ``chains``:
    False when no event of the folded types has a source chain (metadata is not read)."""
    from pyspark.sql import functions as F

    parsed = _parsed(decl, df, columns or {}, chains, keep)
    root = F.col("chain").getItem(0)
    chained = F.coalesce(F.size("chain") > 0, F.lit(False))
    bad = f"aggregation {decl.name!r}: malformed source_chain in event "

    def required(col: Any) -> Any:
        return F.coalesce(
            col, F.raise_error(F.concat(F.lit(bad), F.col("position").cast("string")))
        )

    missing_key = F.concat(
        F.lit(f"aggregation {decl.name!r}: no key property {decl.key!r} in event "),
        F.col("position").cast("string"),
    )
    cols = [
        F.when(F.col("ok"), F.coalesce(F.col(f"v_{decl.key}"), F.raise_error(missing_key))).alias(
            "key"
        ),
        "position",
        chained.alias("chained"),
        F.when(chained, required(root.getField("source"))).otherwise(F.lit(source)).alias("src"),
        F.when(chained, F.coalesce(root.getField("partition"), F.lit("")))
        .otherwise(F.lit(""))
        .alias("part"),
        F.when(
            chained,
            F.concat(
                F.array(required(root.getField("offset"))),
                F.transform(
                    "chain", lambda h: F.coalesce(h.getField("out"), F.lit(0).cast("long"))
                ),
            ),
        )
        .otherwise(F.array(F.col("position")))
        .alias("path"),
    ]
    cols += [F.col(f"v_{p}").alias(f"c_{p}") for p in decl.columns if p != decl.key]
    return parsed.select(*cols, *keep)


def _parsed(
    decl: Declaration, df: Any, columns: dict[str, str], chains: bool, keep: tuple[str, ...]
) -> Any:
    """position, ok, the source chain (``chain``), each declared property's value
    (``v_<name>``, null for rows of other types) and the columns ``keep`` (see :func:`_rows`)."""
    from pyspark.sql import functions as F

    ok = F.col("type").isin(sorted(decl.types))
    values: dict[str, Any] = {}
    # A store's read (source.Declared): every declared property typed where ``typed`` says
    # it was read exactly, parsed here otherwise.
    flagged = "typed" in df.columns
    for p, t in decl.columns.items():
        value = None if flagged else _typed(p, t, columns.get(p), decl)
        if value is not None:
            values[p] = value
    parse = {p: t for p, t in decl.columns.items() if p not in values}
    chain = F.when(
        ok & F.col("metadata").contains('"source_chain"'),
        F.from_json("metadata", CHAIN_SCHEMA, {"mode": "FAILFAST"}).getField("source_chain"),
    )
    if not chains:
        chain = F.lit(None).cast(CHAIN_SCHEMA.split(" ", 1)[1])
    typed = [F.col(PREFIX + p) for p in columns if p in values]
    if flagged:
        typed = [F.col("typed"), *(F.col(PREFIX + p) for p in parse)]
    first = [F.col("position"), F.col("type"), ok.alias("ok"), chain.alias("chain"), *typed,
             *keep]  # fmt: skip
    if parse:  # one parse per event, however many properties it gives
        schema = ", ".join(f"`{p}` {TYPES[t]}" for p, t in parse.items())
        unread = ok & ~F.col("typed") if flagged else ok
        first.append(F.when(unread, F.from_json("data", schema, {"mode": "FAILFAST"})).alias("d"))
        parsed = {p: F.col("d").getField(p) for p in parse}
        if decl.key in parse:  # from_json would take 5 as "5": the key's JSON type is checked
            checked = string_key(F.col("data"), decl.key, f"aggregation {decl.name!r}")
            first.append(F.when(unread, checked).alias("checked_key"))
            parsed[decl.key] = F.col("checked_key")
        if flagged:
            values.update(
                {p: F.when(F.col("typed"), F.col(PREFIX + p)).otherwise(v)
                 for p, v in parsed.items()}
            )  # fmt: skip
        else:
            values.update(parsed)
    given = [F.when(F.col("ok"), v).alias(f"v_{p}") for p, v in values.items()]
    return df.select(*first).select("position", "ok", "chain", *given, *keep)


def _column(decl: Declaration, prop: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("key") if prop == decl.key else F.col(f"c_{prop}")


def _condition(decl: Declaration, op: Op) -> Any:
    from pyspark.sql import functions as F

    cond = F.lit(True)
    for prop, value in op.where:
        cond = cond & (_column(decl, prop) == F.lit(value))
    return cond


def _aggregates(decl: Declaration) -> list[Any]:
    """One aggregate per state field, over accepted rows (the Python fold's meaning)."""
    return [_aggregate(decl, op, _condition(decl, op)).alias(n) for n, op in decl.fields.items()]


def _merged(decl: Declaration, rows: Any) -> Any:
    """Per key: the aggregates, last position and rows of ``rows`` that are events (``events``
    null) or the executors' partials of a key's events (see ``source.Declared.partials``),
    merged as Spark merges its own partial aggregates."""
    from pyspark.sql import functions as F

    event = F.col("events").isNull()
    parts, merges = [], []
    for j, (name, op) in enumerate(decl.fields.items()):
        cond = _condition(decl, op)
        if op.kind == "count":  # an event's own partial: 1 or 0
            counted = cond if op.field is None else cond & _column(decl, op.field).isNotNull()
            own = F.when(counted, F.lit(1)).otherwise(F.lit(0)).cast("long")
        else:
            own = F.when(cond, _column(decl, op.field or ""))
        part = F.when(event, own).otherwise(F.col(f"f{j}"))
        parts.append(part.alias(f"p{j}"))
        p, a = F.col(f"p{j}"), F.col(f"a{j}")
        if op.kind in ("first", "last"):
            at = F.when(own.isNotNull(), F.col("position"))
            parts.append(F.when(event, at).otherwise(F.col(f"at{j}")).alias(f"a{j}"))
            merge = F.min_by(p, a) if op.kind == "first" else F.max_by(p, a)
        elif op.kind in ("count", "sum"):
            merge = F.coalesce(F.sum(p), F.lit(0).cast("long"))
        else:
            merge = F.min(p) if op.kind == "min" else F.max(p)
        merges.append(merge.alias(name))
    events = F.when(event, F.lit(1).cast("long")).otherwise(F.col("events"))
    return (
        rows.select("key", "position", events.alias("n"), *parts)
        .groupBy("key")
        .agg(*merges, F.max("position").alias("last"), F.sum("n").alias("rows"))
    )


def _aggregate(decl: Declaration, op: Op, cond: Any) -> Any:
    from pyspark.sql import functions as F

    if op.field is None:
        return F.count(F.when(cond, F.lit(1)))
    v = F.when(cond, _column(decl, op.field))
    if op.kind == "count":
        return F.count(v)
    if op.kind == "sum":
        return F.coalesce(F.sum(v), F.lit(0).cast("long"))
    if op.kind == "min":
        return F.min(v)
    if op.kind == "max":
        return F.max(v)
    at = F.when(v.isNotNull(), F.col("position"))
    return F.min_by(v, at) if op.kind == "first" else F.max_by(v, at)


def _value(decl: Declaration) -> Any:
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*[F.col(n) for n in decl.fields]), {"ignoreNullFields": "false"})


def _offset_entry(src: Any, part: Any, path: Any) -> Any:
    """``"src":["part",[path]]`` (one source of the offsets object)."""
    from pyspark.sql import functions as F

    return F.concat(_json(src), F.lit(":["), _json(part), F.lit(","), F.to_json(path), F.lit("]"))


def plan(
    decl: Declaration,
    df: Any,
    source: str,
    chained_keys: Any = None,
    columns: dict[str, str] | None = None,
) -> Any:
    """The states (``STATES``) of every key, and a null key's row counting the events of other
    types; ``chained_keys``: the keys with chained events (a DataFrame, broadcast), or None when
    no event of these types carries a chain; ``columns``: the export's typed columns."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    folded = "events" in df.columns  # the executors folded what they could (no chains)
    if folded and chained_keys is not None:
        raise ValueError("a plan with source chains reads events, not partial folds")
    keep = tuple(c for c in df.columns if folded and _PARTIAL.fullmatch(c))
    rows = _rows(decl, df, source, columns, chains=chained_keys is not None, keep=keep)
    simple = rows if chained_keys is None else rows.join(chained_keys, "key", "left_anti")
    # Rows of other types form the null key's group: counted, not a state.
    if folded:
        plain = _merged(decl, simple)
    else:
        plain = simple.groupBy("key").agg(
            *_aggregates(decl), F.max("position").alias("last"), F.count(F.lit(1)).alias("rows")
        )
    own = F.concat(F.lit("{"), _offset_entry(F.lit(source), F.lit(""), F.array("last")), F.lit("}"))
    result = plain.select("key", _value(decl).alias("value"), own.alias("offsets"),
                          F.lit(0).cast("long").alias("dropped"),
                          F.lit(None).cast("string").alias("dropped_by"), "rows")  # fmt: skip
    if chained_keys is None:
        return result
    mixed = rows.join(chained_keys, "key", "left_semi")
    w = Window.partitionBy("key", "src").orderBy("position")
    new_run = F.coalesce(F.lag("part").over(w) != F.col("part"), F.lit(True))
    runs = mixed.withColumn("run", F.sum(new_run.cast("int")).over(w))
    before = (
        Window.partitionBy("key", "src", "run")
        .orderBy("position")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    prev = F.max("path").over(before)
    flagged = runs.withColumn("accept", prev.isNull() | (F.col("path") > prev))
    accepted = flagged.where("accept")
    values = (
        accepted.groupBy("key").agg(*_aggregates(decl)).select("key", _value(decl).alias("value"))
    )
    last = F.max_by(F.struct("part", "path"), F.col("position"))
    by_source = (
        accepted.groupBy("key", "src")
        .agg(last.alias("at"))
        .select(
            "key", _offset_entry(F.col("src"), F.col("at.part"), F.col("at.path")).alias("entry")
        )
    )
    offsets = by_source.groupBy("key").agg(
        F.concat(F.lit("{"), F.array_join(F.collect_list("entry"), ","), F.lit("}")).alias(
            "offsets"
        )
    )
    dropped = flagged.groupBy("key").agg(
        F.sum(F.when(~F.col("accept"), 1).otherwise(0)).cast("long").alias("dropped"),
        F.count(F.lit(1)).alias("rows"),
    )
    # By root source, sorted as the local engine writes them: {"src":n,...}; null: none.
    counted = F.concat(_json(F.col("src")), F.lit(":"), F.col("n").cast("string"))
    dropped_by = (
        flagged.where(~F.col("accept"))
        .groupBy("key", "src")
        .agg(F.count(F.lit(1)).alias("n"))
        .groupBy("key")
        .agg(F.concat(F.lit("{"), F.array_join(F.array_sort(F.collect_list(counted)), ","),
                      F.lit("}")).alias("dropped_by"))
    )  # fmt: skip
    # A key whose every event was dropped cannot happen (the first one of a key is kept).
    chained = values.join(offsets, "key").join(dropped, "key").join(dropped_by, "key", "left")
    return result.unionByName(
        chained.select("key", "value", "offsets", "dropped", "dropped_by", "rows")
    )


def declared_plan(
    decl: Declaration,
    df: Any,
    source: str,
    columns: dict[str, str] | None = None,
    chained_types: list[str] | None = None,
) -> Any:
    """The plan's DataFrame (``STATES``), a null key's row counting the events of other types
    (the rows read of every type are the ``rows`` column's sum). ``columns``/``chained_types``:
    what a Parquet export knows of its events (typed columns; the types with chained events),
    None otherwise. Run it inside :func:`field_errors`."""
    from pyspark.sql import functions as F

    if chained_types is not None:
        has_chain = bool(decl.types & set(chained_types))
    else:
        typed = df.where(F.col("type").isin(sorted(decl.types)))
        has_chain = typed.where(F.col("metadata").contains('"source_chain"')).limit(1).count() > 0
    chained_keys = None
    if has_chain:
        rows = _rows(decl, df, source, columns)
        chained_keys = F.broadcast(rows.where("chained").select("key").distinct())
    return plan(decl, df, source, chained_keys, columns)


@contextmanager
def field_errors() -> Iterator[None]:
    """Our strict type check failing a Spark job, raised as the local engine raises it."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if FIELD_ERROR in text:
            message = text[text.index(FIELD_ERROR) + len(FIELD_ERROR) :].splitlines()[0]
            raise FieldTypeError(message.split(" SQLSTATE")[0].rstrip(". ")) from None
        raise
