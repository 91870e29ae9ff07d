"""Event store: appends/s (1-event and 100-event appends, 1 and 8 writer processes) and a full
scan of 1,000,000 events, on a SQLite file and on PostgreSQL. When the ``bench`` extra is
installed, the Python ``eventsourcing`` library's recorder runs the same appends in the same
run and the table shows the ratio.

A second table: a reader that wants 1 of 10 equally frequent event types, reading with
``types=[...]`` (filtered in SQL) against reading everything and filtering in Python (what a
processor did before), in store events passed per second; the two must find the same events.

A third table: the cost of storing data exactly as given (each event's JSON read back and
compared before it is stored): appends by one writer with today's encoding against the
previous release's (``_unchecked`` below, kept as the comparison), alternating in one run, and
the encoding alone per event; both store the same events."""

from __future__ import annotations

import statistics
import time
from typing import Any

import eventlanes as el
from eventlanes import events as el_events
from eventlanes.store import base as store_base

from .common import baseline, databases, print_table, ratio, run_processes

SCAN_EVENTS = 1_000_000
ORDER = {"order": "o-1234", "customer": {"id": 42, "name": "Grüße GmbH"},
         "items": [{"sku": f"sku-{i}", "qty": i, "price": 9.99} for i in range(10)]}  # fmt: skip


def _unchecked(value: Any) -> str:
    """The append's encoding before data was checked to read back equal (the previous release)."""
    if value.__class__ is not dict:
        raise TypeError("not a dict")
    if not value:
        return "{}"
    text = "".join(el_events._encode_c(value, 0))
    if "\\u0000" in text and el_events._has_nul(value):
        raise ValueError("NUL")
    text.encode()
    return text


def _encoding_worker(ready: Any, url: str, appends: int, batch: int, data: Any,
                     previous: bool) -> None:  # fmt: skip
    if previous:
        store_base.encode_fast = _unchecked  # type: ignore[assignment]
    store = el.open_store(url)
    events = [el.NewEvent("Ordered", data) for _ in range(batch)]
    store.append("warmup", events[:1])
    ready.wait()
    for k in range(appends):
        store.append(f"order-{k % 64}", events)
    store.close()


def encoding_rows(name: str, new_url: Any, scale: float) -> list[list[Any]]:
    """Appends/s of one writer, today's checked encoding against the previous release's."""
    rows = []
    for label, data in (("2 fields", {"writer": 1, "i": 12345}), ("order, 10 items", ORDER)):
        for batch in (1, 100):
            appends = int((3000 if batch == 1 else 300) * scale)
            rates: dict[bool, list[float]] = {True: [], False: []}
            stored: dict[bool, list[Any]] = {}
            for _ in range(3):  # alternate: the machine's load changes from second to second
                for previous in (True, False):
                    url = new_url()
                    el.open_store(url).close()
                    seconds = run_processes(
                        _encoding_worker, [(url, appends, batch, data, previous)]
                    )
                    rates[previous].append(appends * batch / seconds)
                    store = el.open_store(url)
                    stored[previous] = [e.data for e in store.read(after=0, limit=5)]
                    store.close()
            if stored[True] != stored[False]:
                raise AssertionError("the two encodings stored different events")
            before, now = statistics.median(rates[True]), statistics.median(rates[False])
            speed = f"{now / before:.3f}x"
            rows.append([name, label, f"{batch}-event appends", before, now, speed])
    return rows


def encoding_cpu_rows() -> list[list[Any]]:
    """Microseconds to encode one event's data: the previous release's and today's."""
    rows = []
    for label, data in (("2 fields", {"writer": 1, "i": 12345}), ("order, 10 items", ORDER)):
        if _unchecked(data) != el_events.encode_fast(data):
            raise AssertionError("the two encodings differ")
        times: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(5):
            for what, fn in (("before", _unchecked), ("now", el_events.encode_fast)):
                start = time.perf_counter()
                for _ in range(20_000):
                    fn(data)
                times[what].append((time.perf_counter() - start) / 20_000 * 1e6)
        before, now = statistics.median(times["before"]), statistics.median(times["now"])
        rows.append(["(CPU only)", label, "encode one event's data (us)", f"{before:.2f}",
                     f"{now:.2f}", f"{before / now:.3f}x"])  # fmt: skip
    return rows


def _append_worker(ready: Any, url: str, writer: int, appends: int, batch: int) -> None:
    store = el.open_store(url)
    events = [el.NewEvent("Counted", {"writer": writer, "i": i}) for i in range(batch)]
    store.append(f"warmup-{writer}", events[:1])
    ready.wait()
    for k in range(appends):
        # Overlapping streams: every writer appends to the same 64 streams.
        store.append(f"stream-{(writer * 7 + k) % 64}", events)
    store.close()


def _fill_worker(ready: Any, url: str, writer: int, events_per_writer: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent("Counted", {"writer": writer, "i": i}) for i in range(500)]
    ready.wait()
    for k in range(events_per_writer // 500):
        store.append(f"fill-{writer}-{k % 1000}", batch)
    store.close()


def _typed_fill_worker(ready: Any, url: str, writer: int, events: int) -> None:
    store = el.open_store(url)
    batch = [el.NewEvent(f"T{i % 10}", {"writer": writer, "i": i}) for i in range(100)]
    ready.wait()
    for k in range(events // 100):
        store.append(f"typed-{writer}-{k % 500}", batch)
    store.close()


def type_filter_rows(name: str, url: str, events: int) -> list[list[Any]]:
    """Store events passed per second by a reader of type T3: in SQL vs in Python."""
    run_processes(_typed_fill_worker, [(url, w, events // 2) for w in range(2)])
    store = el.open_store(url)
    total = store.count()

    def in_python() -> list[int]:
        return [e.position for e in store.iter_events(batch_size=5000) if e.type == "T3"]

    def in_sql() -> list[int]:
        return [e.position for e in store.iter_events(batch_size=5000, types=["T3"])]

    rates: dict[str, list[float]] = {"all types, filtered in Python": [], "types=['T3']": []}
    found = {}
    for _ in range(3):  # alternate: the machine's load changes from second to second
        for label, fn in zip(rates, (in_python, in_sql), strict=True):
            start = time.perf_counter()
            found[label] = fn()
            rates[label].append(total / (time.perf_counter() - start))
    python_found, sql_found = found.values()
    if python_found != sql_found or len(sql_found) != total // 10:
        raise AssertionError(f"type filter found {len(sql_found)}, Python {len(python_found)}")
    base = statistics.median(rates["all types, filtered in Python"])
    store.close()
    return [
        [name, label, total, len(sql_found), statistics.median(r),
         f"{statistics.median(r) / base:.2f}x"]
        for label, r in rates.items()
    ]  # fmt: skip


def run(backends: list[str], quick: bool = False) -> None:
    rows = []
    typed: list[list[Any]] = []
    encoding: list[list[Any]] = encoding_cpu_rows()
    scale = 0.2 if quick else 1.0
    es = baseline()
    with databases(backends) as dbs:
        for name, new_url in dbs.items():
            for batch in (1, 100):
                for writers in (1, 8):
                    total_appends = int((8000 if batch == 1 else 800) * scale)
                    per = max(1, total_appends // writers)
                    events = per * writers * batch
                    mine: list[float] = []
                    their: list[float] = []
                    for _ in range(3):  # alternate, medians: a single short run is mostly noise
                        url = new_url()
                        el.open_store(url).close()
                        seconds = run_processes(
                            _append_worker, [(url, w, per, batch) for w in range(writers)]
                        )
                        mine.append(events / seconds)
                        if es is not None:
                            target = new_url() if name == "postgres" else new_url().split("///")[1]
                            their.append(
                                es.append_rate(name, target.split("?")[0], batch, writers, events)
                            )
                    ours = statistics.median(mine)
                    theirs = statistics.median(their) if their else None
                    rows.append(
                        [name, f"{batch}-event appends", writers, events, ours, theirs,
                         ratio(ours, theirs)]
                    )  # fmt: skip
            url = new_url()
            store = el.open_store(url)
            n = int(SCAN_EVENTS * scale)
            run_processes(_fill_worker, [(url, w, n // 2) for w in range(2)])
            start = time.perf_counter()
            count = sum(1 for _ in store.iter_events(batch_size=10_000))
            seconds = time.perf_counter() - start
            rows.append([name, "full scan (read)", 1, count, count / seconds, None, ""])
            store.close()
            typed += type_filter_rows(name, new_url(), int(200_000 * scale))
            encoding += encoding_rows(name, new_url, scale)
    print_table(
        "event store throughput (events/s; appends: median of 3 alternating runs)",
        ["backend", "operation", "processes", "events", "eventlanes", "eventsourcing", "ratio"],
        rows,
    )
    print_table(
        "reading 1 of 10 equally frequent event types (store events passed per second)",
        ["backend", "reader", "store events", "events of T3", "events/s", "ratio"],
        typed,
    )
    print_table(
        "storing data exactly: today's checked encoding vs the previous release's (events/s "
        "of one writer, median of 3 alternating runs; CPU rows: microseconds per event)",
        ["backend", "data", "operation", "before", "now", "now/before (speed)"],
        encoding,
    )
