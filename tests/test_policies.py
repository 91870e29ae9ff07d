"""Sequencing policies decide order keys; routing uses the stable hash."""

from __future__ import annotations

import pytest

import eventlanes as el
from eventlanes.events import Event
from eventlanes.policies import as_policy


def ev(position: int, stream: str = "s", data=None, metadata=None) -> Event:
    return Event(position, stream, 1, "T", data or {}, metadata or {}, 0, el.stable_hash(stream))


def test_per_stream_is_the_default_and_routes_by_stored_hash() -> None:
    policy = as_policy(None)
    assert policy.by_stream
    e = ev(1, "user-carlo")
    assert policy.key(e) == "user-carlo"
    assert policy.routing_hash(e) == el.stable_hash("user-carlo") == e.routing_hash


def test_sequential_puts_everything_on_one_key() -> None:
    policy = el.sequential()
    keys = {policy.key(ev(i, f"s{i}")) for i in range(10)}
    assert len(keys) == 1
    assert len({policy.routing_hash(ev(i, f"s{i}")) for i in range(10)}) == 1


def test_full_concurrency_has_no_key_but_routes_deterministically() -> None:
    policy = el.full_concurrency()
    assert policy.key(ev(5)) is None
    assert policy.routing_hash(ev(5)) == policy.routing_hash(ev(5))
    assert len({policy.routing_hash(ev(i)) for i in range(50)}) > 40


def test_by_data_and_by_metadata() -> None:
    by_customer = el.by_data("customer_id")
    assert by_customer.key(ev(1, "order-1", {"customer_id": 7})) == "7"
    assert by_customer.routing_hash(ev(1, "order-1", {"customer_id": 7})) == el.stable_hash("7")
    assert by_customer.key(ev(1, "order-1", {})) == "order-1"  # falls back to the stream
    assert el.by_data("customer_id", fallback="none").key(ev(1, "order-1")) is None
    tenant = el.by_metadata("tenant")
    assert tenant.key(ev(1, "x", metadata={"tenant": "acme"})) == "acme"
    with pytest.raises(ValueError, match="non-empty property name"):
        el.by_data("")
    with pytest.raises(ValueError, match="fallback"):
        el.by_metadata("tenant", fallback="random")


def test_any_callable_is_a_policy() -> None:
    policy = as_policy(lambda e: e.data.get("k"))
    assert policy.key(ev(1, data={"k": "a"})) == "a"
    assert policy.key(ev(1)) is None
    with pytest.raises(TypeError, match="callable"):
        as_policy(42)  # type: ignore[arg-type]


def test_an_aggregations_field_key_routes_a_batch_as_it_routes_each_event(tmp_path) -> None:
    """``key="k"`` routes a batch in one pass: every event to where the per-event path sends
    it, whatever the batch holds (decoded already or not, no key, a key that is not text, a
    type the aggregation does not fold, data that does not decode)."""
    app = el.App(f"sqlite:///{tmp_path}/e.db")
    agg = app.aggregation("a", key="k", initial=dict)
    agg.on("T")(lambda state, event: None)
    policy = agg.policy
    raw = [
        ev(1, data={"k": "x"}),
        Event(2, "s", 1, "T", '{"k": "y"}', "{}", 0, 0),
        Event(3, "s", 1, "T", '{"k": 7}', "{}", 0, 0),  # not text: rendered per event
        Event(4, "s", 1, "T", '{"other": 1}', "{}", 0, 0),  # no key: by position
        Event(5, "s", 1, "U", '{"k": "x"}', "{}", 0, 0),  # not folded: by position
        Event(6, "s", 1, "T", '{"k": "é"}', "{}", 0, 0),
    ]
    each = [policy.routing_hash(e) for e in raw]
    fresh = [Event(e.position, "s", 1, e.type, e._data, "{}", 0, 0) for e in raw]
    assert policy.routing_hashes(fresh) == each
    assert each[0] == el.stable_hash("x") and each[2] == el.stable_hash("7")
    assert each[4] == el.stable_hash("#5") and each[3] == el.stable_hash("#4")
    corrupt = [*fresh[:2], Event(7, "s", 1, "T", "[1]", "{}", 0, 0)]
    assert policy.routing_hashes(corrupt) == [policy.routing_hash(e) for e in corrupt]
    app.close()
