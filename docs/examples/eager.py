"""An app module that creates its table at import: the mistake troubleshooting.md shows."""

import os

import eventlanes as el

app = el.App(os.environ.get("SHOP_URL", "sqlite:///shop.db"))
app.db.run_ddl([f"CREATE TABLE {app.db.table('orders')} (id TEXT PRIMARY KEY)"])  # wrong: at import
orders = app.processor("orders")
