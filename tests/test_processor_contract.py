"""The processor contract (eventlanes.testing.contracts.processor) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from eventlanes.testing.contracts.processor import ProcessorContract


class TestSQLiteProcessors(ProcessorContract):
    @pytest.fixture
    def contract_url(self, tmp_path) -> str:  # type: ignore[no-untyped-def]
        return f"sqlite:///{tmp_path}/events.db"


class TestPostgresProcessors(ProcessorContract):
    @pytest.fixture
    def contract_url(self, request: pytest.FixtureRequest) -> str:
        from tests.conftest import _unique_prefix

        base = request.getfixturevalue("pg_url")
        sep = "&" if "?" in base else "?"
        return f"{base}{sep}prefix={_unique_prefix()}"
