"""Versions of a processor side by side (blue/green).

``app.processor("orders", version=2)`` declares a new version of processor ``orders``: a
processor of its own, stored as ``orders@v2`` (its tokens, dead letters and states) with its
own tables (``ctx.table("x")`` is ``{prefix}x__v2``), built from history while version 1 keeps
running and serving. The first node that starts it creates its token rows and, in the same
transaction, reads the tokens of the earlier versions: every event they had handled by then is
a replay for it (per part of their segments, mapped onto its own), so ``disallow_replay``
handlers stay silent there and run for everything after.

* ``admin/views.py``: what ``status`` says of a version (which one serves, how far behind it is);
* ``admin/versions.py``: which version serves, ``promote`` (readers switch to a version that has
  caught up) and ``retire`` (an old version's tokens, states, dead letters and tables dropped,
  on request only).

Version 1 keeps the processor's name, tokens and tables: an app that never declares a version
stores exactly what it stored before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidInputError, VersionError
from ..names import split_version, table_suffix, versioned_name
from ..processing.aggregating.aggregation import Aggregation
from ..processing.processor import Processor
from ..processing.runtime import Runtime
from ..schema import roles
from ..tokens.base import RETIRED, SegmentStatus, VersionRecord
from ..tokens.claims import claim_all, node_name, release_all
from .views import ProcessorView, VersionView, serving_version, version_view


def _ran(rows: list[SegmentStatus]) -> bool:
    """Token rows of a version that has run (and was not retired)."""
    return bool(rows) and not all(s.owner == RETIRED for s in rows)


def defined_versions(procs: Iterable[Processor], base: str) -> list[int]:
    """The versions of processor ``base`` among ``procs`` (an app's definitions), lowest first."""
    return sorted(p.version for p in procs if p.base == base)


def serving(
    rt: Runtime,
    base: str,
    defined: Iterable[int] = (),
    records: list[VersionRecord] | None = None,
) -> int | None:
    """The version of processor ``base`` that readers see (None: none has run or is defined);
    ``records``: its rows of ``{prefix}versions`` when already read."""
    if records is None:
        records = rt.tokens.versions(base)
    return serving_version(records, lambda: _ran(rt.tokens.status(base)), defined)


def _lowest_position(rt: Runtime, name: str) -> int | None:
    rows = rt.tokens.status(name)
    return min(s.token.position for s in rows) if rows else None


def view(
    rt: Runtime, proc: Processor, status: ProcessorView, defined: Iterable[int]
) -> VersionView:
    """What status says of ``proc``'s version: whether it serves, and how far it is behind the
    version that does (that one's lowest segment position minus its own)."""
    records = rt.tokens.versions(proc.base)
    if not records and proc.version == 1:  # an app that never used versions: one query
        current = serving_version((), lambda: status.started, defined)
    else:
        current = serving(rt, proc.base, defined, records)
    mine = next((r for r in records if r.version == proc.version), None)
    return version_view(proc.base, proc.version, current, status.position,
                        lambda name: _lowest_position(rt, name), mine)  # fmt: skip


def refusals(rt: Runtime, proc: Processor) -> list[str]:
    """Why ``proc`` (a version) may not be promoted now; empty when it may. Caught up means:
    every segment's token is at or past the head of each store it reads, the heads read now;
    no segment has a failed attempt not yet recovered; no dead letter is parked; the version
    is not paused and not retired."""
    heads = {"": rt.store.head()}
    heads.update((name, rt.source_store(t).head()) for name, t in proc.sources.items())
    rows = rt.tokens.status(proc.name)
    if not rows:
        return [f"{proc.name!r} has not run yet: no node has started it"]
    if all(s.owner == RETIRED for s in rows):
        return [f"{proc.name!r} was retired"]
    reasons = []
    short = [
        (s, name, h) for s in rows for name, h in heads.items() if s.token.source(name).position < h
    ]
    if short:
        s, name, head = min(short, key=lambda x: x[0].token.source(x[1]).position)
        where = f" of source {name!r}" if name else ""
        reasons.append(
            f"not caught up: {len({x[0].segment for x in short})} of {len(rows)} segment(s) "
            f"short of the head{where} ({head:,}); the furthest behind, {s.segment}, is at "
            f"{s.token.source(name).position:,}"
        )
    for s in rows:
        if s.errors or s.last_error:
            reasons.append(f"segment {s.segment} is failing: {s.last_error}")
    parked = rt.dead_letters.count(proc.name)
    if parked:
        reasons.append(f"{parked} dead letter(s) parked (retry or discard them first)")
    if rt.tokens.is_paused(proc.name):
        reasons.append("it is paused")
    return reasons


def promote(rt: Runtime, proc: Processor, defined: Iterable[int]) -> str:
    """Switch readers of ``proc.base`` to ``proc``'s version once it has caught up (see
    :func:`refusals`); raises :class:`VersionError` with every reason before then."""
    before = serving(rt, proc.base, defined)
    if before == proc.version:
        return f"{proc.name}: readers of {proc.base!r} already see version {proc.version}"
    reasons = refusals(rt, proc)
    if reasons:
        raise VersionError(f"cannot promote {proc.name!r}: " + "; ".join(reasons))
    rt.tokens.promote(proc.name)
    was = f" (was version {before})" if before is not None else ""
    return f"{proc.name}: promoted; readers of {proc.base!r} now see version {proc.version}{was}"


@dataclass(frozen=True)
class RetirePlan:
    """What retiring a version drops (``eventlanes retire`` shows it before asking)."""

    name: str
    segments: int  # token rows
    states: int  # aggregation states (with its downstream stages')
    dead_letters: int
    tables: list[str]  # tables of the version that exist and are dropped
    kept: list[str]  # tables of the version that exist and stay (``keep_tables``)
    serving: int | None  # the version readers see

    def summary(self) -> str:
        """One line saying what retiring drops: token rows, states, dead letters and tables."""
        what = [f"{self.segments} token row(s)", f"{self.states} aggregation state(s)",
                f"{self.dead_letters} dead letter(s)"]  # fmt: skip
        tables = f"tables {', '.join(self.tables)}" if self.tables else "no tables"
        text = f"{self.name}: retiring drops {', '.join(what)} and {tables}"
        if self.kept:
            text += f"; keeps tables {', '.join(self.kept)} (drop them as their owner)"
        return text


def _parts(name: str, procs: list[Processor]) -> tuple[list[str], list[str]]:
    """The aggregation names (with downstream stages) and table names of version ``name``,
    from the versions of its processor defined in the app (the retired one may be gone)."""
    version = split_version(name)[1]
    stages = {st.name.split("@", 1)[0] for p in procs if isinstance(p, Aggregation)
              for st in p.stages}  # fmt: skip
    names = [name, *(versioned_name(s, version) for s in sorted(stages))]
    tables = sorted({t for p in procs for t in p.tables})
    return names, tables


def retire_plan(
    rt: Runtime, name: str, procs: list[Processor], keep_tables: bool = False
) -> RetirePlan:
    """What :func:`retire` of ``name`` would drop, read without writing; raises
    :class:`VersionError` when it would be refused (it serves, or runs somewhere)."""
    base, version = split_version(name)
    rows = rt.tokens.status(name)
    if not rows:
        raise VersionError(f"cannot retire {name!r}: it has no tokens (it never ran)")
    if all(s.owner == RETIRED for s in rows):
        raise VersionError(f"cannot retire {name!r}: it is retired already")
    current = serving(rt, base, [p.version for p in procs])
    if current == version:
        raise VersionError(
            f"cannot retire {name!r}: readers of {base!r} see it (it serves); promote another "
            "version first"
        )
    live = rt.tokens.live_nodes(name)
    held = [f"{s.segment} by {s.owner}" for s in rows if s.owner and (s.claim_expires_in or 0) > 0]
    if live or held:
        running = ", ".join(live) or ", ".join(held)
        raise VersionError(
            f"cannot retire {name!r}: it is still running ({running}); stop it everywhere "
            "first (remove it from the app and restart its nodes)"
        )
    aggregations, tables = _parts(name, procs)
    suffix = table_suffix(name)
    db = rt.db
    present = roles.tables_present(db, [db.table(t) + suffix for t in tables])
    marks = ", ".join("?" for _ in aggregations)
    states = db.query(
        db.sql(f"SELECT count(*) FROM {rt.states.table} WHERE aggregation IN ({marks})"),
        aggregations,
    )[0][0]
    return RetirePlan(
        name,
        len(rows),
        states,
        rt.dead_letters.count(name),
        [] if keep_tables else present,
        present if keep_tables else [],
        current,
    )


def retire(rt: Runtime, name: str, procs: list[Processor], keep_tables: bool = False) -> RetirePlan:
    """Drop version ``name`` for good: its tokens (one marker row stays, never claimable),
    node heartbeats, aggregation states, dead letters, Spark batches and (unless
    ``keep_tables``) the tables its processor declares (``tables=``), in one transaction when
    the token store lives in the store's database. Refused (:class:`VersionError`) while it
    serves or runs, and, on PostgreSQL, when this role may not drop its tables (nothing is
    changed then)."""
    plan = retire_plan(rt, name, procs, keep_tables)
    db = rt.db
    reason = roles.cannot_drop(db, plan.tables)
    if reason is not None:
        raise VersionError(
            f"cannot retire {name!r}: {reason}; run it as the tables' owner, or keep the "
            "tables (--keep-tables) and have their owner drop them"
        )
    aggregations, _ = _parts(name, procs)
    owner = f"retire:{node_name()}"
    records = claim_all(rt.tokens, name, owner)  # a node that started meanwhile: refused
    together = getattr(rt.tokens, "db", None) is db
    try:
        if not together:  # first the marker: nothing may run it again, whatever follows
            rt.tokens.retire(name, owner)
        with db.transaction() as conn:
            for table in plan.tables:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for aggregation in aggregations:
                rt.states.delete_all(conn, aggregation)
                rt.windows.delete_all(conn, aggregation)  # windowed or not: none left
                conn.execute(
                    db.sql(f"DELETE FROM {db.table('spark_batches')} WHERE aggregation = ?"),
                    (aggregation,),
                )
            rt.dead_letters.clear(conn, name)
            if together:
                rt.tokens.retire(name, owner, conn=conn)
    except BaseException:
        try:
            marked = rt.tokens.retired(name)
        except Exception:  # noqa: BLE001 - the database is away: the claims expire by themselves
            marked = True
        if not marked:
            release_all(rt.tokens, name, owner, records)
        raise
    return plan


def table_name(rt: Runtime, table: str, base: str, defined: Iterable[int]) -> str:
    """The full name of table ``table`` of the version of ``base`` that serves."""
    version = serving(rt, base, defined)
    if version is None:
        raise InvalidInputError(f"processor {base!r} has no version that has run or is defined")
    return f"{rt.prefix}{table}{table_suffix(versioned_name(base, version))}"
