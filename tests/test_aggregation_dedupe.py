"""The batch paths of aggregations (Python fold and declarative) drop exactly what the
one-input-at-a-time rule of the design drops, in the cases a batch shortcut could get wrong:
a republished duplicate in the same batch as its original, chained events (whose root is this
very store) after chain-less ones of the same key, and a replay from a reset position while the
states already hold later offsets (inputs folded and not folded in the same batch)."""

from __future__ import annotations

import json
import random
from typing import Any

import eventlanes as el

E = el.NewEvent
KEYS = ["a", "b", "c", "d"]


def define(app: el.App, batch_size: int, suffix: str = "") -> list[str]:
    app.aggregation(f"declared{suffix}", key="robot", on="Fastened", batch_size=batch_size,
                    fields={"n": el.count(), "sum": el.sum("v"), "last": el.last("v", int)},
                    persist_every=0.05)  # fmt: skip
    python = app.aggregation(f"python{suffix}", key="robot", initial=lambda: {"n": 0, "sum": 0,
                             "last": None}, batch_size=batch_size, persist_every=0.05)  # fmt: skip

    @python.on("Fastened")
    def add(state: dict, event: el.Event) -> None:
        state["n"] += 1
        state["sum"] += event.data["v"]
        state["last"] = event.data["v"]

    return [f"declared{suffix}", f"python{suffix}"]


def append_mix(store: el.EventStore, rng: random.Random, count: int) -> None:
    """Chain-less events, outputs of an upstream source (some appended twice, the duplicate
    often right after its original), and outputs whose root is this store itself: some at a
    position at or below what their key already folded (dropped), some above it."""
    own = store.events_table
    sent: list[dict[str, Any]] = []
    for _ in range(count):
        robot, v = rng.choice(KEYS), rng.randrange(-50, 100)
        r = rng.random()
        if r < 0.4:
            meta: dict[str, Any] = {}
        elif r < 0.6:
            meta = {"source_chain": [{"source": "up", "partition": "", "offset": rng.randrange(60),
                                      "out": rng.randrange(2)}]}  # fmt: skip
        elif r < 0.75 and sent:
            old = rng.choice(sent[-5:])  # a republisher's crash window: appended again
            robot, v, meta = old["robot"], old["v"], old["meta"]
        else:
            head = store.head()
            meta = {"source_chain": [{"source": own, "partition": "",
                                      "offset": rng.randrange(max(1, head - 8), head + 3),
                                      "out": rng.randrange(2)}]}  # fmt: skip
        sent.append({"robot": robot, "v": v, "meta": meta})
        store.append(f"cell-{rng.randrange(3)}", [E("Fastened", {"robot": robot, "v": v}, meta)])


def reference(
    events: list[el.Event], own: str, states: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """The design's rule, one input at a time: the root of the chain (or the event itself)
    must be newer than the key's stored coordinates for its source, same partition."""
    states = states if states is not None else {}
    for e in events:
        st = states.setdefault(
            e.data["robot"], {"value": {"n": 0, "sum": 0, "last": None}, "offsets": {},
                              "dropped": 0, "dropped_by": None},
        )  # fmt: skip
        chain = e.metadata.get("source_chain")
        if chain:
            root = chain[0]
            source, partition = root["source"], root.get("partition", "")
            path = [root["offset"], *(h.get("out", 0) for h in chain)]
        else:
            source, partition, path = own, "", [e.position]
        seen = st["offsets"].get(source)
        if seen is not None and seen[0] == partition and path <= seen[1]:
            st["dropped"] += 1
            by = st["dropped_by"] = st["dropped_by"] or {}
            by[source] = by.get(source, 0) + 1
            continue
        st["offsets"][source] = [partition, path]
        st["value"]["n"] += 1
        st["value"]["sum"] += e.data["v"]
        st["value"]["last"] = e.data["v"]
    return states


def stored(app: el.App, name: str) -> dict[str, dict[str, Any]]:
    t = app.db.table("aggregates")
    rows = app.db.query(
        app.db.sql(f"SELECT key, value, offsets, dropped, dropped_by FROM {t} "
                   "WHERE aggregation = ?"), (name,)
    )  # fmt: skip
    return {k: {"value": json.loads(v), "offsets": json.loads(o), "dropped": d,
                "dropped_by": None if b is None else json.loads(b)}
            for k, v, o, d, b in rows}  # fmt: skip


def run(app: el.App, names: list[str]) -> None:
    app.start(names)
    try:
        app.wait_until_caught_up(60, names)
    finally:
        app.stop()


def test_batches_drop_exactly_what_the_one_at_a_time_rule_drops(store_url: str) -> None:
    app = el.App(store_url, claim_timeout=5)
    # the whole history in one batch; and many small ones
    names = define(app, 1000, "_big") + define(app, 7, "_small")
    append_mix(app.store, random.Random(3), 300)
    run(app, names)
    want = reference(list(app.store.iter_events()), app.store.events_table)
    assert sum(s["dropped"] for s in want.values()) > 20  # the mix has duplicates
    by_source: dict[str, int] = {}
    for s in want.values():
        for source, n in (s["dropped_by"] or {}).items():
            by_source[source] = by_source.get(source, 0) + n
    assert len(by_source) == 2  # the upstream source and this store's own events
    for name in names:
        assert stored(app, name) == want, name
        assert app.status(name).dropped_by == by_source, name


def test_a_replay_over_folded_inputs_drops_them_and_folds_the_new_ones(store_url: str) -> None:
    """After a reset, the states keep offsets past the token: a batch holds inputs already
    folded (dropped) and new ones (folded), for the same keys."""
    app = el.App(store_url, claim_timeout=5)
    names = define(app, 1000)
    rng = random.Random(7)
    append_mix(app.store, rng, 200)
    run(app, names)
    first = list(app.store.iter_events())
    append_mix(app.store, rng, 100)
    target = [app.reset(name, to=first[len(first) // 2].position) for name in names][0]
    run(app, names)
    replayed = [e for e in app.store.iter_events() if e.position > target]
    want = reference(replayed, app.store.events_table, reference(first, app.store.events_table))
    assert len(replayed) > 150 and len(replayed) < len(first) + 100  # old and new inputs
    for name in names:
        assert stored(app, name) == want, name


def test_a_replay_of_chainless_inputs_drops_those_already_folded(store_url: str) -> None:
    """Batches without any chain (the fast path) over states whose offsets are past them."""
    app = el.App(store_url, claim_timeout=5)
    names = define(app, 25)
    rng = random.Random(11)
    for _ in range(150):
        app.store.append(
            "cell", [E("Fastened", {"robot": rng.choice(KEYS), "v": rng.randrange(9)})]
        )
    run(app, names)
    first = list(app.store.iter_events())
    for _ in range(40):
        app.store.append(
            "cell", [E("Fastened", {"robot": rng.choice(KEYS), "v": rng.randrange(9)})]
        )
    target = [app.reset(name, to=first[40].position) for name in names][0]
    run(app, names)
    replayed = [e for e in app.store.iter_events() if e.position > target]
    want = reference(replayed, app.store.events_table, reference(first, app.store.events_table))
    assert sum(s["dropped"] for s in want.values()) == len(first) - 41
    for name in names:
        assert stored(app, name) == want, name


def test_a_chained_input_after_chainless_batches_sees_their_offsets(store_url: str) -> None:
    """Chain-less batches record their keys' offsets lazily; a later batch with a chain rooted
    in this store must still compare with them (an older root: dropped; the same position
    with an output index, or a newer root: folded)."""
    app = el.App(store_url, claim_timeout=5)
    names = define(app, 10)
    own = app.store.events_table
    positions = [app.store.append("cell", [E("Fastened", {"robot": "a", "v": i})])[0]
                 for i in range(30)]  # fmt: skip
    for root in (positions[19], positions[29], positions[29] + 500):
        meta = {"source_chain": [{"source": own, "partition": "", "offset": root, "out": 0}]}
        app.store.append("derived", [E("Fastened", {"robot": "a", "v": 100}, meta)])
    run(app, names)
    want = reference(list(app.store.iter_events()), own)
    assert want["a"]["dropped"] == 1 and want["a"]["value"]["n"] == 32
    for name in names:
        assert stored(app, name) == want, name
