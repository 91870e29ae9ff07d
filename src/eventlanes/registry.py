"""What an App defines: its processors (every kind, every version) and its Kafka ingestors, by
name. One table of names: a processor and an ingestor never share one (they share the token
table)."""

from __future__ import annotations

from typing import Any

from .errors import InvalidInputError
from .kafka.ingestor import Ingestor
from .processing.processor import Processor, check_versions


class Registry:
    def __init__(self) -> None:
        self.processors: dict[str, Processor] = {}
        self.ingestors: dict[str, Ingestor] = {}

    def add(self, proc: Any) -> Any:
        """Register a definition; refused when its name is taken or when it breaks what its
        other versions declare."""
        if proc.name in self.processors or proc.name in self.ingestors:
            raise InvalidInputError(f"processor {proc.name!r} is already defined in this app")
        for other in self.versions_of(proc.base):
            check_versions(other, proc)
        self.processors[proc.name] = proc
        return proc

    def add_ingestor(self, ingestor: Ingestor) -> Ingestor:
        name = ingestor.name
        if name in self.processors or name in self.ingestors:
            raise InvalidInputError(f"{name!r} is already defined in this app")
        self.ingestors[name] = ingestor
        return ingestor

    def get(self, name: str) -> Processor:
        """The processor defined with this name (``orders@v2`` for a version); InvalidInputError
        naming the defined ones otherwise."""
        try:
            return self.processors[name]
        except KeyError:
            known = ", ".join(self.processors) or "none"
            raise InvalidInputError(f"unknown processor {name!r} (defined: {known})") from None

    def ingestor(self, name: str) -> Ingestor:
        try:
            return self.ingestors[name]
        except KeyError:
            known = ", ".join(self.ingestors) or "none"
            raise InvalidInputError(f"unknown ingestor {name!r} (defined: {known})") from None

    def versions_of(self, base: str) -> list[Processor]:
        """The versions of processor ``base`` defined, lowest first."""
        found = [p for p in self.processors.values() if p.base == base]
        return sorted(found, key=lambda p: p.version)

    def selected(self, names: list[str] | None) -> list[Processor]:
        """The processors named (all when none is)."""
        if not names:
            return list(self.processors.values())
        return [self.get(n) for n in names]

    def split(self, names: list[str] | None) -> tuple[list[Processor], list[Ingestor]]:
        """The processors and the ingestors among ``names`` (None: all of both; names of
        ingestors only: no processor)."""
        ingest = [n for n in (names or self.ingestors) if n in self.ingestors]
        named = None if not names else [n for n in names if n not in self.ingestors]
        procs = [] if named == [] else self.selected(named)
        return procs, [self.ingestors[n] for n in ingest]
