"""The token-store contract, run on every backend: in memory, SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

import eventlanes as el
from eventlanes.testing.contracts.token_store import TokenStoreContract
from eventlanes.tokens import TokenStore


class TestInMemoryTokenStore(TokenStoreContract):
    def create_token_store(self, claim_timeout: float = 10.0) -> TokenStore:
        return el.InMemoryTokenStore(claim_timeout)


class _SQLTokenStoreContract(TokenStoreContract):
    url: str

    def create_token_store(self, claim_timeout: float = 10.0) -> TokenStore:
        return el.open_token_store(self.url, claim_timeout=claim_timeout)

    def reopen_token_store(self, store: TokenStore) -> TokenStore:
        return el.open_token_store(self.url, claim_timeout=store.claim_timeout)

    def close_token_store(self, store: TokenStore) -> None:
        assert isinstance(store, el.SQLTokenStore)
        store.db.close()


class TestSQLiteTokenStore(_SQLTokenStoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, tmp_path) -> None:
        self.url = f"sqlite:///{tmp_path}/tokens.db"


class TestPostgresTokenStore(_SQLTokenStoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        sep = "&" if "?" in pg_url else "?"
        self.url = f"{pg_url}{sep}prefix=c{uuid.uuid4().hex[:12]}_"
