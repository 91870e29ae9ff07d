"""The runtime: what processing needs from the outside, built once by the ``App``.

Runners, workers, admin commands and the Spark executors depend on this narrow object (the
store, the token store, dead letters, aggregation states, other sources, the observer), never
on the ``App``. Everything is opened on first use: modules that define an app are imported by
the CLI and by worker processes, and must not connect on import.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property

from ..db import Database, parse_url
from ..errors import InvalidInputError, VersionError
from ..names import split_version
from ..observe import NO_OBSERVER, Observer
from ..schema import Migrated, migrate
from ..segments import Segment
from ..store import EventStore, open_store
from ..store.read_wait import ReadWaitWatch
from ..tokens import DEFAULT_CLAIM_TIMEOUT, InMemoryTokenStore, TokenStore, open_token_store
from ..tokens.base import Initial, check_seconds
from ..upcasting import Upcasters
from .segment import Progress
from .tables.dead_letters import DeadLetterStore
from .tables.states import StateTable
from .tables.windows import WindowTable

log = logging.getLogger("eventlanes.processing")


class Runtime:
    """``url``: the store; ``token_store``: a URL, "memory", a TokenStore, or None for the
    store's own database (so ``ctx.execute`` writes commit together with the tokens)."""

    def __init__(
        self,
        url: str,
        *,
        token_store: str | TokenStore | None = None,
        claim_timeout: float = DEFAULT_CLAIM_TIMEOUT,
        poll_interval: float | None = None,
        observer: Observer | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise InvalidInputError(f"App needs a store URL, got {url!r}")
        # A bad URL (scheme, prefix, path) fails here, where it is written; nothing connects.
        #: the store's table prefix (known without connecting: ``proc.table(name)`` at import)
        self.prefix = parse_url(url).prefix
        if isinstance(token_store, str) and token_store != "memory":
            parse_url(token_store)
        claim_timeout = check_seconds(claim_timeout, "claim_timeout")
        if poll_interval is not None:
            poll_interval = check_seconds(poll_interval, "poll_interval")
        self.url = url
        self._token_store_spec = token_store
        self.claim_timeout = float(claim_timeout)
        self.poll_interval = poll_interval
        self.observer = observer or NO_OBSERVER
        self._sources: dict[str, EventStore] = {}
        self._initialized: set[str] = set()
        self._lock = threading.Lock()
        self.progress = Progress()  # commits of this process's runners
        #: old shapes of stored events turned into current ones at read time (every executor)
        self.upcasters = Upcasters()

    @cached_property
    def store(self) -> EventStore:
        return open_store(self.url)

    @property
    def db(self) -> Database:
        return self.store.db

    @cached_property
    def tokens(self) -> TokenStore:
        spec = self._token_store_spec
        if isinstance(spec, TokenStore):
            return spec
        if spec == "memory":
            return InMemoryTokenStore(self.claim_timeout)
        return open_token_store(spec or self.db, claim_timeout=self.claim_timeout)

    @cached_property
    def read_waits(self) -> ReadWaitWatch:
        """Warns once when readers wait behind an open transaction (checked by heartbeats)."""
        return ReadWaitWatch(self.store)

    @cached_property
    def dead_letters(self) -> DeadLetterStore:
        return DeadLetterStore(self.db)

    @cached_property
    def states(self) -> StateTable:
        return StateTable(self.db)

    @cached_property
    def windows(self) -> WindowTable:
        """Windowed aggregations' rows (schema version 5)."""
        return WindowTable(self.db)

    def migrate(self) -> list[Migrated]:
        """Create or upgrade the schema of the store, and of the token store when that is
        another database given by URL; what each found and applied."""
        targets = [self.url]
        spec = self._token_store_spec
        if isinstance(spec, str) and spec not in ("memory", self.url):
            targets.append(spec)
        return [migrate(target) for target in targets]

    def source_store(self, target: str | EventStore) -> EventStore:
        """An extra source of a multi-source processor, opened once per runtime."""
        if isinstance(target, EventStore):
            return target
        if target == self.url:
            raise InvalidInputError(f"source {target!r} is the app's own store")
        with self._lock:
            if target not in self._sources:
                self._sources[target] = open_store(target)
            return self._sources[target]

    def store_at(self, url: str | None) -> EventStore:
        """The app's own store (``url`` None) or another one, opened once per runtime: where
        a republisher appends its outputs."""
        return self.store if url is None else self.source_store(url)

    def initialize(
        self,
        name: str,
        segments: int,
        initial: Initial,
        after: tuple[str, ...] = (),
        per_part: bool = True,
    ) -> None:
        """Create a processor's token rows if missing (once per runtime: it is a locking
        transaction). Only runners and commands that change tokens call this; status reads.
        ``after``: the earlier versions of a new version (see :meth:`TokenStore.initialize`).
        A retired processor is refused: its tokens were dropped for good."""
        if name not in self._initialized:
            created = self.tokens.initialize(
                name, segments=segments, initial=initial, store=self.store, after=after,
                per_part=per_part, context={"version": split_version(name)[1]} if after else None,
            )  # fmt: skip
            self._initialized.add(name)
            if not created and not self.tokens.retired(name):  # retired: refused below
                note = layout_note(segments, self.tokens.segments(name))
                if note is not None:  # once per process: the stored layout is the one that runs
                    log.warning("%s: %s", name, note)
        if self.tokens.retired(name):  # also when initialised here before it was retired
            raise VersionError(
                f"processor {name!r} was retired (its tokens and tables were dropped): remove "
                "it from the app"
            )

    def close(self) -> None:
        for store in self._sources.values():
            store.close()
        self._sources.clear()
        if "store" in self.__dict__:
            self.store.close()


def layout_note(declared: int, stored: list[Segment]) -> str | None:
    """What to say when the processor's stored segments are not the ``declared`` count (another
    node declared another count first, or splits and merges changed it); None when they are."""
    if len(stored) == declared:
        return None
    shown = ", ".join(str(s) for s in stored[:8]) + (", ..." if len(stored) > 8 else "")
    return (
        f"declared segments={declared}, but the stored layout has {len(stored)} segment(s) "
        f"({shown}), and that layout is the one that runs (split or merge to change it)"
    )
