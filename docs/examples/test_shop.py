"""Tests of the getting-started app's processors (docs/how-to/testing.md runs them)."""

from __future__ import annotations

import importlib

import pytest

import eventlanes as el
from eventlanes.testing import ProcessorFailed, given, rows, run_until_caught_up, states


@pytest.fixture
def shop(eventlanes_url, monkeypatch):
    """The app module on this test's own store: it reads its URL from SHOP_URL."""
    monkeypatch.setenv("SHOP_URL", eventlanes_url)
    import shop

    module = importlib.reload(shop)
    module.setup()
    yield module
    module.app.close()


def test_orders_and_revenue(shop) -> None:
    given(shop.app, {
        "order-1": [el.NewEvent("OrderPlaced", {"customer": "ada", "total": 30})],
        "order-2": [el.NewEvent("OrderPlaced", {"customer": "bob", "total": 5}),
                    el.NewEvent("OrderCancelled", {})],
    })  # fmt: skip
    run_until_caught_up(shop.app)
    orders = shop.app.table("orders")
    assert rows(shop.app, f"SELECT id, total FROM {orders}") == [("order-1", 30)]
    assert states(shop.app, "revenue") == {
        "ada": {"orders": 1, "total": 30},
        "bob": {"orders": 1, "total": 5},
    }


def test_an_order_without_a_customer_fails_the_projection(shop) -> None:
    given(shop.app, {"order-3": [el.NewEvent("OrderPlaced", {"total": 1})]})
    with pytest.raises(ProcessorFailed, match="customer"):
        run_until_caught_up(shop.app, "orders")
