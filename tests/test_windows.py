"""Time windows' foundations (issue 33): the one window start formula agrees in Python, SQLite,
PostgreSQL and Spark over random times (before 1970 too, on the boundaries); durations and
event times parse exactly or are refused clearly; the semantics as a plain loop
(eventlanes.windows.reference) decide lateness and closes from the log alone."""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eventlanes as el
from eventlanes.windows.durations import micros, shown
from eventlanes.windows.kinds import Hopping, Session, hopping, session, tumbling, window_start
from eventlanes.windows.reference import count_windows
from eventlanes.windows.sql import start_sql
from eventlanes.windows.time import clamped, event_time, recorded_time

S, M, H, D = 1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000
#: about 300 years either side of 1970, in microseconds
TIMES = st.integers(min_value=-(10**16), max_value=10**16)
STEPS = st.sampled_from([1, 7, S, 15 * S, M, 5 * M, H, D, 7 * D, 999_983])


def cases(n: int, seed: int) -> list[tuple[int, int, int]]:
    """(t, step, offset): random times either side of 1970, and each one's boundaries."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        step = rng.choice([1, 7, S, M, 5 * M, H, D, 7 * D, 999_983])
        offset = rng.randrange(step)
        t = rng.randrange(-(10**16), 10**16)
        start = window_start(t, step, offset)
        out += [(t, step, offset), (start, step, offset), (start - 1, step, offset),
                (start + step, step, offset)]  # fmt: skip
    return out + [(-1, M, 0), (0, M, 0), (-M, M, 0), (-M - 1, M, 0), (1, 7, 3), (-1, 7, 3)]


@given(TIMES, STEPS, st.data())
@settings(max_examples=400, deadline=None)
def test_a_time_is_in_the_window_that_starts_at_or_before_it(t: int, step: int, data) -> None:
    offset = data.draw(st.integers(min_value=0, max_value=step - 1))
    start = window_start(t, step, offset)
    assert start <= t < start + step
    assert (start - offset) % step == 0
    assert window_start(start + step, step, offset) == start + step  # the end: the next window
    assert tumbling(f"{step}us", f"{offset}us").windows(t) == [(start, start + step)]


@given(TIMES, st.data())
@settings(max_examples=300, deadline=None)
def test_hopping_windows_are_every_window_that_holds_the_time(t: int, data) -> None:
    every = data.draw(st.sampled_from([S, 10 * M, 7]))
    size = every * data.draw(st.integers(min_value=1, max_value=6)) + data.draw(
        st.sampled_from([0, every // 2])
    )
    window = Hopping(size, every, data.draw(st.integers(min_value=0, max_value=every - 1)))
    got = window.windows(t)
    assert got == sorted(got) and all(s <= t < e and e - s == size for s, e in got)
    assert all((s - window.offset) % every == 0 for s, _ in got)
    first = got[0][0]  # no window holding t is missing: the one before the first does not
    assert first - every + size <= t and len(got) in (size // every, -(-size // every))


def test_the_start_formula_agrees_in_python_sqlite_postgres_and_spark(spark, pg_url) -> None:
    import psycopg
    from pyspark.sql import functions as F

    from eventlanes.db.placeholders import for_psycopg
    from eventlanes.spark.windows import start_column

    rows = cases(400, seed=7)
    want = [window_start(t, step, off) for t, step, off in rows]
    lite = sqlite3.connect(":memory:")
    for (t, step, off), start in zip(rows, want, strict=True):
        (got,) = lite.execute(f"SELECT {start_sql('?', step, off)}", (t, t)).fetchone()
        assert got == start, (t, step, off)
    with psycopg.connect(pg_url, autocommit=True) as pg:  # ? placeholders, as the store's
        for (t, step, off), start in zip(rows, want, strict=True):
            sql, params = for_psycopg(f"SELECT {start_sql('?::bigint', step, off)}", (t, t))
            assert pg.execute(sql, params).fetchone() == (start,), (t, step, off)
    df = spark.createDataFrame([(i, *r) for i, r in enumerate(rows)], "i long, t long, "
                               "step long, off long")  # fmt: skip
    starts = df.select("i", start_column(F.col("t"), F.col("step"), F.col("off")).alias("s"))
    got = {row["i"]: row["s"] for row in starts.collect()}
    assert [got[i] for i in range(len(rows))] == want
    for t, step, off in rows[:8]:  # with integers, as a plan writes them
        one = spark.range(1).select(start_column(F.lit(t), step, off).alias("s")).first()
        assert one is not None and one["s"] == window_start(t, step, off)


def test_spark_window_agrees_where_it_is_defined(spark) -> None:
    """Spark's own window() on TimestampType (microseconds), tumbling and sliding, before 1970
    too: the same starts as the formula (which the engines use on integers)."""
    from pyspark.sql import functions as F

    times = {t for t, step, off in cases(100, seed=9) if step == M and off == 0} | {-1, 0, -M}
    rows = [(t,) for t in sorted(times)]
    df = spark.createDataFrame(rows, "t long").withColumn("ts", F.timestamp_micros("t"))
    tumbled = df.select("t", F.window("ts", "1 minute").start.alias("s")).collect()
    for row in tumbled:
        assert _micros(row["s"]) == window_start(row["t"], M), row
    slid = df.select("t", F.window("ts", "5 minutes", "1 minute").alias("w")).collect()
    by_t: dict[int, list[tuple[int, int]]] = {}
    for row in slid:
        by_t.setdefault(row["t"], []).append((_micros(row["w"].start), _micros(row["w"].end)))
    for t, windows in by_t.items():
        assert sorted(windows) == hopping("5m", every="1m").windows(t), t


def _micros(value: datetime) -> int:
    # Spark hands back naive local datetimes (the session's time zone): as UTC here
    local = value.replace(tzinfo=UTC) if value.tzinfo else value.astimezone(UTC)
    return (local - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


#: zones with daylight-saving changes of an hour (north, south), one that moved its clocks at
#: midnight (Sao Paulo until 2019: the midnight of the change did not exist), none
ZONES = ["Europe/Paris", "America/New_York", "Australia/Sydney", "America/Sao_Paulo", "UTC",
         "Asia/Kolkata"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(t=st.integers(min_value=-(10**16), max_value=2 * 10**17),
       unit=st.sampled_from(["day", "week", "month"]), tz=st.sampled_from(ZONES))  # fmt: skip
def test_a_calendar_window_holds_its_time_and_meets_its_neighbours(
    t: int, unit: str, tz: str
) -> None:
    """Calendar windows cut time into back-to-back windows (before 1970 and around
    daylight-saving changes too), each from a local midnight (or the first instant of a day
    whose midnight did not exist) to the next."""
    from zoneinfo import ZoneInfo

    window = el.calendar(unit, tz=tz)
    [(start, end)] = window.windows(t)
    assert start <= t < end
    assert window.windows(start) == [(start, end)] == window.windows(end - 1)
    assert window.windows(end)[0][0] == end and window.windows(start - 1)[0][1] == start
    local = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=start)).astimezone(
        ZoneInfo(tz)
    )
    before = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=start - 1)).astimezone(
        ZoneInfo(tz)
    )
    assert (local.hour, local.minute) == (0, 0) or local.date() != before.date()
    first = {"day": True, "week": local.weekday() == 0, "month": local.day == 1}[unit]
    assert first
    if unit == "day" and tz != "Asia/Kolkata":  # an hour's change at most, in these zones
        assert end - start in (23 * H, 24 * H, 25 * H)


def test_calendar_days_follow_daylight_saving_and_bad_ones_are_refused() -> None:
    paris = el.calendar("day", tz="Europe/Paris")

    def day(iso: str) -> tuple[str, float]:
        t = int(datetime.fromisoformat(iso).timestamp()) * S
        [(start, end)] = paris.windows(t)
        return datetime.fromtimestamp(start / S, UTC).isoformat(), (end - start) / H

    assert day("2026-03-29T12:00:00+02:00") == ("2026-03-28T23:00:00+00:00", 23.0)
    assert day("2026-10-25T12:00:00+01:00") == ("2026-10-24T22:00:00+00:00", 25.0)
    assert day("2026-10-25T00:00:00+02:00") == ("2026-10-24T22:00:00+00:00", 25.0)
    assert day("2026-10-24T23:59:59+02:00") == ("2026-10-23T22:00:00+00:00", 24.0)
    sao_paulo = el.calendar("day", tz="America/Sao_Paulo")  # 2018-11-04 00:00 did not exist
    [(start, end)] = sao_paulo.windows(int(datetime(2018, 11, 4, 12, tzinfo=UTC).timestamp()) * S)
    assert datetime.fromtimestamp(start / S, UTC) == datetime(2018, 11, 4, 3, tzinfo=UTC)
    assert (end - start) / H == 23.0
    assert el.calendar("month", tz="UTC").windows(0) == [(0, 31 * D)]
    assert el.calendar("week", tz="UTC").windows(0) == [(-3 * D, 4 * D)]  # from Monday
    assert paris.describe() == "calendar(day, tz=Europe/Paris)"
    for bad, message in [(("hour",), "the unit must be one of"),
                         (("day", "Mars/Olympus"), "no such time zone"),
                         (("day", ""), "tz must name a time zone")]:  # fmt: skip
        with pytest.raises(el.InvalidInputError, match=message):
            el.calendar(*bad)
    with pytest.raises(el.InvalidInputError, match="outside the years 1 to 9998"):
        paris.windows(10**18)


@pytest.mark.parametrize(
    ("value", "us"),
    [("30s", 30 * S), ("1m", M), ("1h30m", H + 30 * M), ("250ms", 250_000), ("1d", D),
     ("15us", 15), (timedelta(minutes=2), 2 * M), (" 2h ", 2 * H)],
)  # fmt: skip
def test_durations_parse_exactly(value: Any, us: int) -> None:
    assert micros(value, "size") == us
    assert micros(shown(us), "size") == us


@pytest.mark.parametrize(
    ("value", "message"),
    [(60, "expected a duration such as '30s'.*got 60"), ("1 m", "got '1 m'"),
     ("1y", "got '1y'"), ("", "got ''"), (1.5, "got 1.5"), (None, "got None"),
     ("0s", "must be more than zero"), (timedelta(seconds=-1), "must be more than zero"),
     ("1h 30m", "got '1h 30m'"), (True, "got True"),
     (f"{2**63}us", "under 292,000 years")],
)  # fmt: skip
def test_bad_durations_are_refused_naming_the_option(value: Any, message: str) -> None:
    with pytest.raises(el.InvalidInputError, match=rf"^size: .*{message}"):
        micros(value, "size")


def test_windows_are_built_from_durations_and_refuse_gaps() -> None:
    assert tumbling("1m", offset="15s").windows(0) == [(15 * S - M, 15 * S)]
    assert tumbling("1m", offset="75s") == tumbling("1m", offset="15s")  # offset modulo size
    assert hopping("1h", every="20m").windows(0) == [(-40 * M, 20 * M), (-20 * M, 40 * M),
                                                     (0, H)]  # fmt: skip
    with pytest.raises(el.InvalidInputError, match=r"every must not exceed the size"):
        hopping("10m", every="1h")
    with pytest.raises(el.InvalidInputError, match=r"session\(gap\): expected a duration"):
        session(30)
    assert tumbling("1m").describe() == "tumbling(1m, offset=0s)"
    assert hopping("1h", every="10m").describe() != hopping("1h", every="20m").describe()


def event(data: dict[str, Any], recorded: int = 5) -> el.Event:
    return el.Event(3, "s", 0, "T", data, {}, recorded, 0)


@pytest.mark.parametrize(
    ("value", "unit", "us"),
    [("2026-11-28T10:00:00Z", None, 1_795_860_000 * S),
     ("2026-11-28T11:00:00+01:00", None, 1_795_860_000 * S),
     ("1969-12-31T23:59:59.999999+00:00", None, -1), (1_795_860_000, "s", 1_795_860_000 * S),
     (1_795_860_000_123, "ms", 1_795_860_000_123_000), (1.000001, "s", 1_000_001),
     (-1, "us", -1), (1795860000.123456, "s", 1_795_860_000_123_456)],
)  # fmt: skip
def test_event_times_are_exact_microseconds(value: Any, unit: str | None, us: int) -> None:
    assert event_time("ts", unit).of(event({"ts": value})) == us


@pytest.mark.parametrize(
    ("data", "unit", "message"),
    [({"ts": "2026-11-28T10:00:00"}, None, "no offset .*add Z or"),
     ({"ts": 1_795_860_000}, None, "not ISO-8601 text .*unit='ms'"),
     ({"ts": "yesterday"}, None, "not an ISO-8601 time"), ({}, "s", "is missing"),
     ({"ts": True}, "s", "not a number of s"), ({"ts": "5"}, "ms", "not a number of ms"),
     ({"ts": 1.0000005}, "s", "not a whole number of microseconds"),
     ({"ts": float("nan")}, "s", "is nan"), ({"ts": 2**63}, "us", "within 64 bits")],
)  # fmt: skip
def test_bad_event_times_are_refused_naming_the_event(
    data: dict[str, Any], unit: str | None, message: str
) -> None:
    where = r"^event 3 \(T\): time property 'ts' "
    with pytest.raises(el.InvalidInputError, match=rf"{where}.*{message}"):
        event_time("ts", unit).of(event(data))


def test_recorded_time_and_its_options() -> None:
    assert recorded_time().of(event({}, recorded=1_234)) == 1_234
    when = datetime(1969, 7, 20, 20, 17, 40, 5, tzinfo=UTC)
    assert recorded_time().of(event({}, recorded=when)) == -14_182_939_999_995  # type: ignore[arg-type]
    with pytest.raises(el.InvalidInputError, match=r"unit must be one of s, ms, us"):
        event_time("ts", "minutes")
    assert clamped(10, 3, 5) == (8, True) and clamped(8, 3, 5) == (8, False)


def test_lateness_and_closes_are_decided_by_the_log() -> None:
    """Store clock: W = the largest time so far less the lateness; an input is late for a
    window that ended at or before W, and a window closes where W reaches its end."""
    w, late = tumbling("1m"), 10 * S
    inputs = [(1, "a", 5 * S, 0), (2, "b", 65 * S, 0), (3, "a", 55 * S, 0),  # W=55s: on time
              (4, "b", 75 * S, 0), (5, "a", 58 * S, 0),  # W=65s after 4: a's [0,1m) closed
              (6, "a", 61 * S, 0)]  # fmt: skip
    got = count_windows(inputs, w, late, max_future=D)
    assert got.closes == [(4, "a", 0, M)]  # at the input that moved W past its end
    assert got.late == [(5, "a", 0, M)]
    assert got.counts == {("a", 0, M): 2, ("b", M, 2 * M): 2, ("a", M, 2 * M): 1}
    assert sum(got.counts.values()) + len(got.late) == len(inputs)  # every input accounted for
    # A key's own clock: b's times do not make a's input late
    keyed = count_windows(inputs, w, late, max_future=D, clock="key")
    assert keyed.late == [] and keyed.counts[("a", 0, M)] == 3
    assert keyed.closes == []  # a's clock is at 61s: W = 51s has not reached 1m


def test_one_future_stamped_input_is_clamped_and_makes_nothing_late() -> None:
    """An input stamped a day ahead is clamped to its recorded time plus max_future: the ten
    honest inputs after it stay on time (without the clamp they would all be late)."""
    honest = [(p, "r", p * S, p * S) for p in range(2, 12)]
    inputs = [(1, "r", D, 1 * S), *honest]
    got = count_windows(inputs, tumbling("1m"), 30 * S, max_future=30 * S)
    assert got.clamped == [1] and got.late == []
    unclamped = count_windows(inputs, tumbling("1m"), 30 * S, max_future=2 * D)
    assert len(unclamped.late) == 10


def test_a_late_input_for_one_hopping_window_is_counted_in_the_others() -> None:
    w = hopping("2m", every="1m")
    got = count_windows([(1, "k", 100 * S, 0), (2, "k", 50 * S, 0)], w, 0, max_future=D)
    # W = 100s: [-1m, 1m) is closed for the input at 50s, [0, 2m) is open
    assert got.late == [(2, "k", -M, M)]
    assert got.counts[("k", 0, 2 * M)] == 2  # the first input and this one


def test_an_input_that_bridges_two_sessions_merges_them_once() -> None:
    w = session("30s")
    inputs = [(1, "k", 0, 0), (2, "k", 50 * S, 0), (3, "k", 25 * S, 0),  # bridges the two
              (4, "k", 200 * S, 0)]  # fmt: skip
    got = count_windows(inputs, w, M, max_future=D)
    assert got.counts == {("k", 0, 80 * S): 3, ("k", 200 * S, 230 * S): 1}
    assert got.closes == [(4, "k", 0, 80 * S)]  # one close for the merged session
    late = count_windows([*inputs, (5, "k", 10 * S, 0)], w, M, max_future=D)
    assert late.late == [(5, "k", 10 * S, 40 * S)]  # alone, and W = 140s is past its end
    # Without the lateness, the first session closed at input 2: the bridge cannot reopen it,
    # nor overlap it (a session [25s, 80s) would share its time): it is late
    early = count_windows(inputs, w, 0, max_future=D)
    assert early.counts == {("k", 0, 30 * S): 1, ("k", 50 * S, 80 * S): 1,
                            ("k", 200 * S, 230 * S): 1}  # fmt: skip
    assert early.late == [(3, "k", 25 * S, 55 * S)]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-5 * M, 5 * M)), max_size=60),
       st.sampled_from(["store", "key"]))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_every_input_is_counted_or_late_and_each_window_closes_once(
    times: list[tuple[str, int]], clock: str
) -> None:
    inputs = [(p, k, t, 0) for p, (k, t) in enumerate(times, 1)]
    for window in (tumbling("1m"), hopping("2m", every="1m"), Session(20 * S)):
        got = count_windows(inputs, window, 15 * S, max_future=10 * D, clock=clock)
        assert len(got.closes) == len(set(got.closes))
        if not isinstance(window, Session):
            windows = sum(len(window.windows(t)) for _, _, t, _ in inputs)
            assert sum(got.counts.values()) + len(got.late) == windows
        else:
            assert sum(got.counts.values()) + len(got.late) == len(inputs)
        closed = {(k, s, e) for _, k, s, e in got.closes}
        assert closed <= set(got.counts)  # only windows that were opened close


def test_a_batch_of_times_equals_each_time_read_alone() -> None:
    """``EventTime.times`` (the clock's batch path) gives what ``of`` gives event by event,
    and None where ``of`` refuses (that event's own segment fails on it, not the clock)."""
    from eventlanes.windows.time import event_time, recorded_time

    def event(position: int, data: object) -> el.Event:
        return el.Event(position, "s", position, "T", data, {}, 1_700_000_000_000_000 + position, 0)

    values = [1_700_000_000_123, 5, -7, 1.5, "2026-01-01T00:00:00Z", "2026-01-01T00:00:00",
              None, True, 2**62]  # fmt: skip
    events = [event(i + 1, {"ts": v}) for i, v in enumerate(values)] + [event(99, {})]
    for how in (event_time("ts", unit="ms"), event_time("ts", unit="s"), event_time("ts"),
                recorded_time()):  # fmt: skip
        want = []
        for e in events:
            try:
                want.append(how.of(e))
            except el.InvalidInputError:
                want.append(None)
        assert how.times(events) == want, how
    whole = [event(i + 1, {"ts": 1000 * i}) for i in range(5)]  # the fast path: all whole
    assert event_time("ts", unit="ms").times(whole) == [1_000_000 * i for i in range(5)]
