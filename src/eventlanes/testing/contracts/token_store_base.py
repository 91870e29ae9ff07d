"""What every token-store contract test stands on: how a backend is opened, the stores a
test opened closed after it, and real threads run at once (``token_store.TokenStoreContract``
is the suite to subclass)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

import pytest

from ...tokens import TokenStore
from ...tokens.base import DEFAULT_CLAIM_TIMEOUT

P = "contract"


class TokenStoreFixtures(ABC):
    """Opening and closing the stores of one test."""

    # -- how a backend is opened: subclasses implement ------------------------------------------
    @abstractmethod
    def create_token_store(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> TokenStore:
        """A token store on fresh, empty storage for the current test."""

    def reopen_token_store(self, store: TokenStore) -> TokenStore | None:
        """The same storage opened again, as after a restart; None if nothing survives one."""
        return None

    def close_token_store(self, store: TokenStore) -> None:
        store.close()

    # -- plumbing ----------------------------------------------------------------------------------
    @pytest.fixture(autouse=True)
    def _close_opened_stores(self) -> Iterator[None]:
        self._opened: list[TokenStore] = []
        yield
        for store in reversed(self._opened):
            self.close_token_store(store)

    def new_store(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> TokenStore:
        store = self.create_token_store(claim_timeout)
        self._opened.append(store)
        return store

    def reopen(self, store: TokenStore) -> TokenStore:
        again = self.reopen_token_store(store)
        if again is None:
            pytest.skip(f"{type(store).__name__} keeps nothing across restarts")
        self._opened.append(again)
        return again


def run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> None:
    """Run targets on real threads at once; re-raise the first failure."""
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
