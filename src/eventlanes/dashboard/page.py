"""What one poll reads: the status document of ``eventlanes status`` (health.py's rules, the
``--max-lag`` given to the dashboard) with what the page shows beside it.

Per processor, beside its status entry (which says whether it is paused): its guarantee,
mode and error handling, its dead letters grouped by key, and which actions apply to it
(split, merge and release only where they can be done; promote and retire only for a
processor with versions).
Per Kafka ingestor: its entry of the status document, its parked records and whether it is
paused. These extra keys are removed from ``api/status``, which returns the status document
exactly as ``status --json`` prints it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..admin.health import MaxLag, processor_document, status_document, store_first_after
from ..kafka import status as kafka_status
from ..processing.tables.dead_letters import DeadLetter

if TYPE_CHECKING:
    from ..app import App

MAX_LETTERS = 200  # dead letters shown per processor (the count is always exact)
EXTRA = ("letter_groups", "guarantee", "mode", "on_error", "started", "actions")
#: an ingestor's: its status entry has no ``paused`` (a processor's has)
INGESTOR_EXTRA = ("letter_groups", "paused")


def letter_groups(letters: list[DeadLetter], records: bool = False) -> list[dict[str, Any]]:
    """Dead letters grouped by sequence key (one position alone when it has none): what retry
    and discard act on. ``records``: an ingestor's parked records (partition and offset)."""
    groups: dict[str, dict[str, Any]] = {}
    for d in letters:
        key = d.seq_key if d.seq_key is not None else f"#{d.position}"
        group = groups.setdefault(key, {"key": d.seq_key, "position": d.position, "letters": []})
        entry: dict[str, Any] = {"position": d.position, "stream_id": d.stream_id,
                                 "version": d.version, "type": d.type, "error": d.error,
                                 "attempts": d.attempts}  # fmt: skip
        if records:
            from ..kafka.parking import ParkedRecord

            parked = ParkedRecord.of(d)
            entry.update(partition=parked.partition, offset=parked.offset)
        group["letters"].append(entry)
    for group in groups.values():
        first = group["letters"][0]
        group["label"] = group["key"] if group["key"] is not None else (
            f"offset {first['offset']} (partition {first['partition']})" if records
            else f"position {group['position']}"
        )  # fmt: skip
        group["target"] = (
            {"key": group["key"]} if group["key"] is not None else {"position": group["position"]}
        )
    return list(groups.values())


def _actions(app: App, doc: dict[str, Any], started: bool, retired: bool) -> dict[str, Any]:
    """The actions that apply to a processor now, with the segments each can act on."""
    if retired:
        return {}
    segments = doc["segments"]
    by_id = {(s["id"], s["mask"]) for s in segments}
    # Split the segment that is furthest behind first (then the largest share).
    order = sorted(segments, key=lambda s: (-s["lag_events"], s["mask"], s["id"]))
    actions: dict[str, Any] = {"reset": True}
    if started:
        actions["split"] = [{"id": s["id"], "label": s["segment"]} for s in order]
        merge = []
        for s in segments:
            if s["mask"] == 0:
                continue
            top = (s["mask"] + 1) >> 1
            sibling = s["id"] ^ top
            if s["id"] < sibling and (sibling, s["mask"]) in by_id:
                merge.append({"id": s["id"], "label": f"{s['segment']} + {sibling}/{s['mask']}"})
        if merge:
            actions["merge"] = merge
        owned = [{"id": s["id"], "label": f"{s['segment']} (held by {s['owner']})"}
                 for s in segments if s["owner"]]  # fmt: skip
        if owned:
            actions["release"] = owned
    versions = [p for p in app.processors.values() if p.base == doc["base"]]
    if len(versions) > 1 and not doc["serving"]:
        actions["promote"] = True
        if started:
            actions["retire"] = True
    return actions


def snapshot(app: App, max_lag: MaxLag | None = None) -> dict[str, Any]:
    """The status document (with ``max_lag``'s rule) plus the page's extra keys (``EXTRA``)."""
    limit = max_lag or MaxLag()
    first_after = store_first_after(app.store)
    now = datetime.now(UTC)
    docs = []
    for name, proc in app.processors.items():
        view = app.status(name)
        doc = processor_document(view, first_after, limit, now)
        letters = app.dead_letter_list(name)[:MAX_LETTERS] if view.dead_letters else []
        retired = view.retired or (view.version is not None and view.version.retired)
        doc.update(
            letter_groups=letter_groups(letters),
            guarantee=view.guarantee,
            mode=proc.mode,
            on_error=proc.on_error,
            started=view.started,
            retired=retired,
        )
        doc["actions"] = _actions(app, doc, view.started, retired)
        docs.append(doc)
    ingestors = []
    for name in app.ingestors:
        doc = kafka_status.document(app.ingest_status(name), limit.events)
        letters = app.dead_letter_list(name)[:MAX_LETTERS] if doc["dead_letters"] else []
        doc.update(letter_groups=letter_groups(letters, records=True),
                   paused=app.tokens.is_paused(name))  # fmt: skip
        ingestors.append(doc)
    return status_document(docs, limit, ingestors)


def plain(document: dict[str, Any]) -> dict[str, Any]:
    """The status document without the page's extra keys (what ``status --json`` prints)."""
    out = dict(document)
    out["processors"] = [{k: v for k, v in p.items() if k not in EXTRA}
                         for p in document["processors"]]  # fmt: skip
    if "ingestors" in document:
        out["ingestors"] = [{k: v for k, v in i.items() if k not in INGESTOR_EXTRA}
                            for i in document["ingestors"]]  # fmt: skip
    return out
