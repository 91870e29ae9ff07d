"""The shipped event store contract, run for SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

import eventlanes as el
from eventlanes.testing.contracts.event_store import EventStoreContract


class TestSQLiteEventStore(EventStoreContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path) -> None:
        self.path = tmp_path / "events.db"

    def create_store(self) -> el.EventStore:
        return el.open_store(f"sqlite:///{self.path}")


class TestPostgresEventStore(EventStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, pg_url: str) -> None:
        self.url = pg_url

    def create_store(self) -> el.EventStore:
        sep = "&" if "?" in self.url else "?"
        return el.open_store(f"{self.url}{sep}prefix=c{uuid.uuid4().hex[:12]}_")
