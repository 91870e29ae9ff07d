"""Where each ingestor is: per partition its position (the next offset to append), the broker's
high watermark as last fetched, the lag, the claim and errors. Plain SELECTs, never a write:
``status --url`` uses it without the app (and without the broker's address or secrets).

A partition's lag is ``high watermark - position`` as of ``observed`` (the age of that
watermark, which the running ingestor refreshes about every second).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..db import Database
from ..tokens import DEFAULT_CLAIM_TIMEOUT
from . import schema
from .partitions import PartitionTable

if TYPE_CHECKING:
    from .ingestor import Ingestor


@dataclass(frozen=True)
class PartitionView:
    partition: int
    position: int
    low_watermark: int | None
    high_watermark: int | None
    observed_age: float | None  # seconds since the watermarks were fetched
    owner: str | None
    claim_age: float | None
    errors: int
    last_error: str | None
    retry_in: float | None

    @property
    def lag(self) -> int | None:
        if self.high_watermark is None:
            return None
        return max(0, self.high_watermark - self.position)


@dataclass(frozen=True)
class IngestorView:
    name: str
    topic: str
    partitions: list[PartitionView]
    live_nodes: list[str]
    dead_letters: int

    @property
    def lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        known = [lag for lag in lags if lag is not None]
        return None if len(known) < len(lags) else sum(known)

    @property
    def position(self) -> int:
        """Records appended (or parked) in all: the sum of the partitions' positions."""
        return sum(p.position for p in self.partitions)


def ingestor_names(db: Database) -> list[str]:
    if not schema.exists(db):
        return []
    return PartitionTable(db, create=False).ingestors()


def view(db: Database, name: str, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> IngestorView:
    now_ms = db.now_ms
    seen = PartitionTable(db, create=False).seen(name) if schema.exists(db) else {}
    tokens = db.table("tokens")
    if not schema.exists(db, tokens):  # nothing has run on this store yet
        return IngestorView(name, "", [], [], 0)
    rows = db.query(
        db.sql(
            f"""SELECT segment_id, position, owner, claimed_since, claim_deadline, last_error,
                    errors, retry_at, {now_ms} FROM {tokens} WHERE processor = ?
                ORDER BY segment_id"""
        ),
        (name,),
    )
    partitions = []
    topic = next((s.topic for s in seen.values()), "")
    for p, pos, owner, since, deadline, error, errors, retry_at, at in rows:
        live = owner if owner and deadline is not None and deadline >= at else None
        s = seen.get(p)
        partitions.append(
            PartitionView(
                p, pos,
                s.low if s else None, s.high if s else None,
                None if s is None or s.observed_at is None else max(0.0, at / 1000 - s.observed_at),
                live,
                (at - since) / 1000 if live and since is not None else None,
                errors, error,
                (retry_at - at) / 1000 if retry_at and retry_at > at else None,
            )
        )  # fmt: skip
    nodes: list[tuple[Any, ...]] = []
    if schema.exists(db, db.table("nodes")):
        nodes = db.query(
            db.sql(
                f"SELECT node FROM {db.table('nodes')} WHERE processor = ? "
                f"AND last_seen > {now_ms} - ? ORDER BY node"
            ),
            (name, int(claim_timeout * 1000)),
        )
    letters = 0
    if schema.exists(db, db.table("dead_letters")):
        sql = db.sql(f"SELECT count(*) FROM {db.table('dead_letters')} WHERE processor = ?")
        letters = int(db.query(sql, (name,))[0][0])
    return IngestorView(name, topic, partitions, [r[0] for r in nodes], letters)


def behind(v: IngestorView, targets: dict[int, int]) -> dict[int, int]:
    """The partitions whose position is short of ``targets`` (high watermarks read earlier),
    and by how much: a partition without a row yet counts from 0."""
    at = {p.partition: p.position for p in v.partitions}
    return {p: high - at.get(p, 0) for p, high in targets.items() if at.get(p, 0) < high}


def wait_caught_up(
    db: Database,
    ingestors: Sequence[Ingestor],
    runners: Sequence[Any],
    claim_timeout: float,
    deadline: float,
) -> None:
    """Block until each ingestor has appended (or parked) every record its topic held now:
    its partitions at the high watermarks read first (``app.wait_until_caught_up``).
    ``runners``: those running here, whose crash ends the wait."""
    from .client import high_watermarks

    targets = {}
    for ing in ingestors:
        left = max(1.0, min(ing.kafka.timeout, deadline - time.monotonic()))
        targets[ing.name] = high_watermarks(ing.kafka, ing.topic, left)
    while True:
        crashed = [r.error for r in runners if r.error is not None]
        if crashed:
            raise RuntimeError(f"an ingestor crashed: {crashed[0]!r}") from crashed[0]
        lagging = {
            name: short
            for name, highs in targets.items()
            if (short := behind(view(db, name, claim_timeout), highs))
        }
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                "ingestors not caught up (records short of the topic's high watermarks, per "
                f"partition): {lagging}"
            )
        time.sleep(0.05)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def document(v: IngestorView, max_lag_events: int | None) -> dict[str, Any]:
    """One ingestor's entry of the status document (``ingestors``), with its problems."""
    problems = []
    for p in v.partitions:
        if p.errors or p.last_error:
            problems.append(f"partition {p.partition}: {p.errors} failed attempt(s): "
                            f"{p.last_error}")  # fmt: skip
    if v.dead_letters:
        problems.append(f"{v.dead_letters} record(s) parked")
    lag = v.lag
    if max_lag_events is not None and lag is not None and lag > max_lag_events:
        problems.append(f"lag {lag} records > --max-lag {max_lag_events}")
    return {
        "name": v.name,
        "topic": v.topic,
        "healthy": not problems,
        "problems": problems,
        "position": v.position,
        "lag_records": lag,
        "live_nodes": v.live_nodes,
        "dead_letters": v.dead_letters,
        "partitions": [
            {
                "partition": p.partition,
                "position": p.position,
                "high_watermark": p.high_watermark,
                "low_watermark": p.low_watermark,
                "lag_records": p.lag,
                "watermark_age_seconds": _round(p.observed_age),
                "owner": p.owner,
                "claim_age_seconds": _round(p.claim_age),
                "errors": p.errors,
                "last_error": p.last_error,
                "retry_in_seconds": _round(p.retry_in),
            }
            for p in v.partitions
        ],
    }
