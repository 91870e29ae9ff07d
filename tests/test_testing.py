"""eventlanes.testing: what a team needs to test its own processors, and the caught-up wait it
relies on."""

from __future__ import annotations

import time

import eventlanes as el

E = el.NewEvent


def test_caught_up_waits_for_every_source_of_a_processor(store_url: str, tmp_path) -> None:
    """A processor that reads another store besides the app's own: caught up means every
    source's head reached. The wait returned at once when the app's own store was empty (its
    own head reached), with the other source's events not handled yet."""
    legacy_url = f"sqlite:///{tmp_path}/legacy.db"
    with el.open_store(legacy_url) as legacy:
        for i in range(30):
            legacy.append(f"s-{i % 7}", [E("Imported")])
    app = el.App(store_url)
    proc = app.processor("merged", segments=2, batch_size=4, sources={"legacy": legacy_url})
    handled: list[int] = []

    @proc.on_any
    def slow(event: el.Event, ctx: el.Context) -> None:
        time.sleep(0.02)  # slow enough that returning early cannot go unseen
        handled.append(event.position)

    app.start()
    try:
        app.wait_until_caught_up(60)
        seen = len(handled)
    finally:
        app.stop()
        app.close()
    assert seen == len(set(handled)) == 30
