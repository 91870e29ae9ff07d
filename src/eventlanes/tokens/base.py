"""The token store contract: one row per (processor, segment) with token, owner and claim."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import ClaimLostError, CorruptTokenError, InvalidInputError, ProcessorPausedError
from ..names import split_version, validate_owner, validate_processor_name
from ..segments import Segment
from .token import Token

if TYPE_CHECKING:
    from ..store import EventStore

DEFAULT_CLAIM_TIMEOUT = 10.0
MAX_BACKOFF = 60.0
Initial = str | int | datetime
REQUESTS = ("split", "merge", "release")
MAX_REASON = 4000  # characters kept of an error or a refusal reason
#: The owner of a retired processor's one remaining row (see :meth:`TokenStore.retire`): no
#: node of any release can claim it, so nothing runs a retired version again.
RETIRED = "(retired)"
RETIRED_NOTE = (
    "retired (eventlanes retire): its tokens were dropped and it never runs again; remove it "
    "from the app"
)


def backoff(errors: int) -> float:
    """Seconds before a failing segment is retried: 1 s doubling to 60 s."""
    return min(MAX_BACKOFF, 2.0 ** max(0, errors - 1))


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A claimed (or inspected) segment and its token."""

    processor: str
    segment: Segment
    token: Token
    owner: str | None


@dataclass(frozen=True, slots=True)
class SegmentStatus:
    processor: str
    segment: Segment
    token: Token
    owner: str | None
    claim_age: float | None  # seconds since the current owner claimed it
    claim_expires_in: float | None  # seconds until the claim may be stolen (negative: expired)
    request: str | None  # a split/merge asked for by another node, for the owner to carry out
    last_error: str | None
    updated_at: float  # epoch seconds of the last token write
    errors: int = 0  # consecutive failed attempts
    retry_in: float | None = None  # seconds until a failing segment may be retried
    paused: bool = False  # the processor is paused: nobody may claim the segment
    request_refused: str | None = None  # why the owner refused the last request (until the next)
    #: the row's token_detail could not be decoded: ``token`` holds only its position column,
    #: and nothing may run from it (claims refuse it; :meth:`TokenStore.token` raises this)
    corrupt: CorruptTokenError | None = None

    @property
    def position(self) -> int:
        """The segment's token position."""
        return self.token.position


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """A version of a processor in ``{prefix}versions`` (times: epoch seconds, the database's
    clock; None: never)."""

    processor: str  # the stored name: ``orders``, ``orders@v2``
    base: str
    version: int
    started_at: float | None = None  # its first node created its token rows
    promoted_at: float | None = None  # readers were switched to it
    retired_at: float | None = None  # its tokens were dropped for good


def resolve_initial(initial: Initial, store: EventStore | None) -> int:
    """Initial position: "tail" (0, from the beginning), "head", a position, or a time."""
    if isinstance(initial, bool):
        raise InvalidInputError(f"invalid initial token {initial!r}")
    if isinstance(initial, int):
        if initial < 0:
            raise InvalidInputError(f"initial position must be >= 0, got {initial}")
        return initial
    if initial == "tail":
        return 0
    if initial == "head" or isinstance(initial, datetime):
        if store is None:
            raise InvalidInputError(f"initial={initial!r} needs the event store: pass store=")
        if not isinstance(initial, datetime):
            return store.head()
        first = store.position_at(initial)
        return store.head() if first is None else first - 1
    raise InvalidInputError(
        f"invalid initial token {initial!r}: use 'tail', 'head', a position or a datetime"
    )


#: the longest timeout or interval taken (about 31 years): beyond it, milliseconds overflow the
#: databases' 64-bit deadlines and Python's waits raise OverflowError
MAX_SECONDS = 1e9


def check_seconds(value: object, what: str, zero: bool = False) -> float:
    """``value`` as seconds, refused unless a finite number above zero (``zero``: or zero):
    nan and inf pass a ``> 0`` test and then break deadlines far from where they were written."""
    bound = ">= 0" if zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be a number of seconds {bound}, got {value!r}")
    low = value >= 0 if zero else value > 0
    if not math.isfinite(value) or not low or value > MAX_SECONDS:
        raise InvalidInputError(
            f"{what} must be a finite number of seconds, {bound} and <= {MAX_SECONDS:g}, "
            f"got {value!r}"
        )
    return float(value)


class TokenStore(ABC):
    """Operations are atomic and fenced by ownership; deadlines use one clock for all nodes."""

    def __init__(self, claim_timeout: float = DEFAULT_CLAIM_TIMEOUT) -> None:
        self.claim_timeout = check_seconds(claim_timeout, "claim_timeout")

    @property
    def timeout_ms(self) -> int:
        """``claim_timeout`` in milliseconds (claims' deadlines are on the database's clock)."""
        return int(self.claim_timeout * 1000)

    # The public methods validate, then delegate to the backend's ``_`` methods.
    def initialize(
        self,
        processor: str,
        segments: int = 1,
        initial: Initial = "tail",
        store: EventStore | None = None,
        *,
        after: tuple[str, ...] | list[str] = (),
        per_part: bool = True,
        context: Any = None,
    ) -> bool:
        """Create the processor's segment rows once; True if this call created them.

        Safe when many processes start at once: exactly one creates the rows, the others see
        them. A processor that exists keeps its rows (and any splits and merges since).

        ``after``: processors this one succeeds (the earlier versions of a processor). The
        call that creates the rows reads theirs in the same transaction, and every event they
        had handled (or passed over) by then is a replay for this one, per part of their
        segments mapped onto its own (:meth:`Token.succeeding`; ``per_part=False`` when it
        routes events otherwise than they do: then only what all of one of them had passed),
        with ``context`` as the replay context. That moment is fixed once, by whichever node
        creates the rows. A version (``name@vN``) also gets its row in ``{prefix}versions``.
        """
        validate_processor_name(processor)
        segs = _initial_segments(segments)
        position = resolve_initial(initial, store)
        if not after and split_version(processor)[1] == 1:
            return self._initialize(processor, segs, position)
        names = [validate_processor_name(n) for n in after]
        return self._initialize_after(processor, segs, position, names, per_part, context)

    def add_segments(self, processor: str, rows: list[tuple[Segment, int]]) -> list[Segment]:
        """Create the rows of segments ``processor`` does not have yet, each at its position,
        and keep those it has (a Kafka ingestor's partitions, found while it runs). Returns the
        segments this call created."""
        validate_processor_name(processor)
        for segment, position in rows:
            if (
                not isinstance(segment, Segment)
                or isinstance(position, bool)
                or not (isinstance(position, int) and position >= 0)
            ):
                raise InvalidInputError(f"invalid segment row {(segment, position)!r}")
        return self._add_segments(processor, rows) if rows else []

    def claim(
        self,
        processor: str,
        segment_id: int,
        owner: str,
        ignore_backoff: bool = False,
        *,
        ignore_pause: bool = False,
    ) -> TokenRecord | None:
        """Claim a segment: succeeds if unclaimed, already ours, or its claim expired (steal),
        it is not backing off after errors (``ignore_backoff``: for resets) and the processor
        is not paused (``ignore_pause``: for admin work on a paused processor, e.g. reset).
        Returns None otherwise, also to the current owner while the processor is paused."""
        return self._claim(
            validate_processor_name(processor),
            _segment_id(segment_id),
            validate_owner(owner),
            bool(ignore_backoff),
            bool(ignore_pause),
        )

    def extend(self, processor: str, segment_id: int, owner: str) -> None:
        """Push the claim's deadline out; raises ClaimLostError if ``owner`` lost it, and
        ProcessorPausedError (a ClaimLostError) while the processor is paused."""
        self._extend(
            validate_processor_name(processor), _segment_id(segment_id), validate_owner(owner)
        )

    def extend_all(self, processor: str, owner: str) -> list[int]:
        """Extend every claim ``owner`` holds on ``processor``; returns their segment ids.

        While the processor is paused nothing is extended and the list is empty: the owner
        must persist its tokens and release (its claims expire otherwise)."""
        return self._extend_all(validate_processor_name(processor), validate_owner(owner))

    def release(self, processor: str, segment_id: int, owner: str, hold_off: float = 0.0) -> bool:
        """Give a claim up. ``hold_off`` seconds: ``owner`` will not get it back before then
        (others may claim it at once)."""
        if isinstance(hold_off, bool) or not isinstance(hold_off, int | float) or not hold_off >= 0:
            raise InvalidInputError(f"hold_off must be >= 0 seconds, got {hold_off!r}")
        return self._release(
            validate_processor_name(processor),
            _segment_id(segment_id),
            validate_owner(owner),
            float(hold_off),
        )

    def release_all(self, processor: str, owner: str) -> int:
        """Release every claim ``owner`` holds (also while paused); returns how many."""
        validate_owner(owner)
        held = [s.segment.id for s in self.status(processor) if s.owner == owner]
        return sum(self._release(processor, seg_id, owner, 0.0) for seg_id in held)

    def store(
        self, processor: str, segment_id: int, token: Token | int, owner: str, conn: Any = None
    ) -> None:
        """Write a token, fenced: raises ClaimLostError (so the caller's transaction rolls back)
        unless ``owner`` holds the claim. ``conn``: the caller's open transaction, so that
        projection writes and the token commit together. Also extends the claim."""
        tok = Token(token) if isinstance(token, int) else token
        if not isinstance(tok, Token) or tok.position < 0:
            raise InvalidInputError(f"invalid token {token!r}")
        self._store(
            validate_processor_name(processor), _segment_id(segment_id), tok, validate_owner(owner),
            conn,
        )  # fmt: skip

    def fail(self, processor: str, segment_id: int, owner: str, error: str) -> float:
        """Record a failed attempt and release the claim; the segment may be claimed again
        (by any node) after the back-off, which is returned in seconds."""
        if not isinstance(error, str):
            raise InvalidInputError(f"error must be text, got {error!r}")
        return self._fail(
            validate_processor_name(processor), _segment_id(segment_id), validate_owner(owner),
            error[:MAX_REASON],
        )  # fmt: skip

    def request(self, processor: str, segment_id: int, what: str | None) -> bool:
        """Ask the segment's owner to ``split``, ``merge`` or ``release`` it (None: withdraw).

        A new request clears the reason of an earlier refusal; withdrawing keeps it. False if
        the processor has no such segment."""
        if what is not None and what not in REQUESTS:
            raise InvalidInputError(f"unknown request {what!r}: use one of {', '.join(REQUESTS)}")
        return self._request(validate_processor_name(processor), _segment_id(segment_id), what)

    def refuse(self, processor: str, segment_id: int, reason: str, what: str | None = None) -> bool:
        """The owner will not carry out the pending request: clear it and record ``reason``
        (``SegmentStatus.request_refused``) so that whoever asked can stop waiting and say why.

        ``what``: refuse only if the pending request is that one (a newer, different request
        stays). False if there was no (such) request pending or no such segment."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError(f"a refusal needs a reason (non-empty text), got {reason!r}")
        if what is not None and what not in REQUESTS:
            raise InvalidInputError(f"unknown request {what!r}: use one of {', '.join(REQUESTS)}")
        return self._refuse(
            validate_processor_name(processor), _segment_id(segment_id), reason[:MAX_REASON], what
        )

    def pause(self, processor: str) -> bool:
        """Pause a processor everywhere: from now on nobody can claim its segments (owners see
        ``extend_all`` return nothing and let go). Persisted; works before the processor's
        rows exist. True if this call paused it, False if it was paused already."""
        return self._set_paused(validate_processor_name(processor), True)

    def resume(self, processor: str) -> bool:
        """Undo ``pause``; True if the processor was paused."""
        return self._set_paused(validate_processor_name(processor), False)

    def is_paused(self, processor: str) -> bool:
        """Whether the processor is paused (nobody claims its segments)."""
        return self._is_paused(validate_processor_name(processor))

    def heartbeat(self, processor: str, node: str) -> None:
        """Record that ``node`` is alive and working for ``processor`` (for fair shares)."""
        self._heartbeat(validate_processor_name(processor), validate_owner(node), leave=False)

    def leave(self, processor: str, node: str) -> None:
        """Forget node ``node`` of the processor's live nodes (a node stopping cleanly)."""
        self._heartbeat(validate_processor_name(processor), validate_owner(node), leave=True)

    def live_nodes(self, processor: str) -> list[str]:
        """Nodes whose heartbeat is younger than the claim timeout."""
        return self._live_nodes(validate_processor_name(processor))

    def split(self, processor: str, segment_id: int, owner: str) -> tuple[Segment, Segment]:
        """Split a segment ``owner`` holds; both halves get its token, the new half is unclaimed."""
        return self._split(
            validate_processor_name(processor), _segment_id(segment_id), validate_owner(owner)
        )

    def merge(self, processor: str, segment_id: int, owner: str) -> Segment:
        """Merge a segment with its sibling; ``owner`` must hold both claims. Refused
        (InvalidInputError) when the sibling is split further."""
        return self._merge(
            validate_processor_name(processor), _segment_id(segment_id), validate_owner(owner)
        )

    def segments(self, processor: str) -> list[Segment]:
        """The processor's segments as stored (its layout)."""
        return [s.segment for s in self.status(processor)]

    def status(self, processor: str) -> list[SegmentStatus]:
        """One row per segment, by id; empty for a processor without rows. Never writes."""
        return self._status(validate_processor_name(processor))

    def token(self, processor: str, segment_id: int) -> Token | None:
        """The stored token of one segment (None when the segment does not exist)."""
        for s in self.status(processor):
            if s.segment.id == segment_id:
                if s.corrupt is not None:
                    raise s.corrupt
                return s.token
        return None

    # -- versions of a processor -----------------------------------------------------------
    def versions(self, base: str) -> list[VersionRecord]:
        """The rows of ``{prefix}versions`` of processor ``base`` (its versions started,
        promoted or retired), by version. Never writes."""
        return self._versions(validate_processor_name(base))

    def promote(self, processor: str) -> None:
        """Record that readers now see ``processor`` (a version): the last one promoted is the
        one that serves. The caller checks first that it may (``eventlanes.admin.versions``)."""
        self._promote(validate_processor_name(processor))

    def retire(self, processor: str, owner: str, conn: Any = None) -> int:
        """Drop a processor's token rows, node heartbeats and pause for good, fenced: ``owner``
        must hold every segment's claim. One row stays, owned by :data:`RETIRED` and never
        claimable, so that a node still running the processor (of this release or an older
        one) starts nothing again instead of handling all of history as new; its
        ``{prefix}versions`` row records when. ``conn``: the caller's open transaction (its
        tables go in the same commit). Returns how many segment rows were dropped."""
        return self._retire(validate_processor_name(processor), validate_owner(owner), conn)

    def retired(self, processor: str) -> bool:
        """Whether ``processor`` was retired (its one row is the :data:`RETIRED` marker)."""
        rows = self.status(processor)
        return bool(rows) and all(s.owner == RETIRED for s in rows)

    @abstractmethod
    def processors(self) -> list[str]:
        """The names of the processors that have token rows here."""

    @abstractmethod
    def _initialize(self, processor: str, segments: list[Segment], position: int) -> bool: ...

    @abstractmethod
    def _add_segments(self, processor: str, rows: list[tuple[Segment, int]]) -> list[Segment]: ...

    @abstractmethod
    def _claim(
        self, processor: str, segment_id: int, owner: str, ignore_backoff: bool, ignore_pause: bool
    ) -> TokenRecord | None: ...

    @abstractmethod
    def _extend(self, processor: str, segment_id: int, owner: str) -> None: ...

    @abstractmethod
    def _extend_all(self, processor: str, owner: str) -> list[int]: ...

    @abstractmethod
    def _release(self, processor: str, segment_id: int, owner: str, hold_off: float) -> bool: ...

    @abstractmethod
    def _store(
        self, processor: str, segment_id: int, token: Token, owner: str, conn: Any
    ) -> None: ...

    @abstractmethod
    def _fail(self, processor: str, segment_id: int, owner: str, error: str) -> float: ...

    @abstractmethod
    def _request(self, processor: str, segment_id: int, what: str | None) -> bool: ...

    @abstractmethod
    def _refuse(self, processor: str, segment_id: int, reason: str, what: str | None) -> bool: ...

    @abstractmethod
    def _set_paused(self, processor: str, paused: bool) -> bool: ...

    @abstractmethod
    def _is_paused(self, processor: str) -> bool: ...

    @abstractmethod
    def _heartbeat(self, processor: str, node: str, leave: bool) -> None: ...

    @abstractmethod
    def _live_nodes(self, processor: str) -> list[str]: ...

    @abstractmethod
    def _split(self, processor: str, segment_id: int, owner: str) -> tuple[Segment, Segment]: ...

    @abstractmethod
    def _merge(self, processor: str, segment_id: int, owner: str) -> Segment: ...

    @abstractmethod
    def _status(self, processor: str) -> list[SegmentStatus]: ...

    @abstractmethod
    def _initialize_after(
        self,
        processor: str,
        segments: list[Segment],
        position: int,
        after: list[str],
        per_part: bool,
        context: Any,
    ) -> bool: ...

    @abstractmethod
    def _versions(self, base: str) -> list[VersionRecord]: ...

    @abstractmethod
    def _promote(self, processor: str) -> None: ...

    @abstractmethod
    def _retire(self, processor: str, owner: str, conn: Any) -> int: ...

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Close the connections this token store opened itself."""
        pass


def _segment_id(segment_id: object) -> int:
    if isinstance(segment_id, bool) or not isinstance(segment_id, int) or segment_id < 0:
        raise InvalidInputError(f"invalid segment id {segment_id!r}: a whole number >= 0")
    return segment_id


def paused_error(processor: str) -> ProcessorPausedError:
    return ProcessorPausedError(
        f"processor {processor!r} is paused: its claims must be released until it is resumed"
    )


def _initial_segments(n: int) -> list[Segment]:
    try:
        return Segment.initial(n)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


def split_checked(
    processor: str, segment_id: int, row: tuple[int, str | None] | None, owner: str
) -> tuple[Segment, Segment]:
    """Checks shared by the backends' split: returns the two halves."""
    if row is None:
        raise InvalidInputError(f"processor {processor!r} has no segment {segment_id}")
    mask, seg_owner = row
    if seg_owner != owner:
        raise ClaimLostError(
            f"split of segment {segment_id} of {processor!r} needs its claim; "
            f"it is held by {seg_owner or 'nobody'}, not {owner}"
        )
    try:
        return Segment(segment_id, mask).split()
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


def succeeding_tokens(
    processor: str,
    segments: list[Segment],
    position: int,
    rows: list[tuple[str, Segment, Token, str | None]],
    per_part: bool,
    context: Any,
) -> list[Token]:
    """The first token of each segment of ``processor``, succeeding the processors of ``rows``
    (name, segment, token, owner), shared by the backends' ``_initialize_after``."""
    handled: dict[str, list[tuple[Segment, Token]]] = {}
    for name, segment, token, _ in rows:
        handled.setdefault(name, []).append((segment, token))
    return [Token.succeeding(handled, seg, position, context, per_part) for seg in segments]


def retire_checked(
    processor: str, rows: list[tuple[Segment, Token, str | None]], owner: str
) -> int:
    """Checks shared by the backends' retire (every claim held by ``owner``); the position of
    the retired marker: the lowest the processor's segments had reached."""
    if not rows:
        raise InvalidInputError(f"processor {processor!r} has no token rows: nothing to retire")
    if any(holder == RETIRED for _, _, holder in rows):
        raise InvalidInputError(f"processor {processor!r} is retired already")
    for segment, _, holder in rows:
        if holder != owner:
            raise ClaimLostError(
                f"retiring {processor!r} needs every claim; {segment} is held by "
                f"{holder or 'nobody'}, not {owner}"
            )
    return min(token.position for _, token, _ in rows)


def merge_rows(
    processor: str, rows: dict[int, tuple[int, Token, str | None]], segment_id: int, owner: str
) -> tuple[Segment, Segment, Token]:
    """Checks shared by the backends' merge: returns (kept, removed, merged token)."""
    if segment_id not in rows:
        raise InvalidInputError(f"processor {processor!r} has no segment {segment_id}")
    mask, tok, seg_owner = rows[segment_id]
    segment = Segment(segment_id, mask)
    if mask == 0:
        raise InvalidInputError(f"segment {segment} of {processor!r} is the root: nothing to merge")
    sibling = segment.sibling()
    if sibling.id not in rows or rows[sibling.id][0] != mask:
        raise InvalidInputError(
            f"cannot merge segment {segment} of {processor!r}: its sibling {sibling} "
            "is split further; merge those first"
        )
    sib_mask, sib_tok, sib_owner = rows[sibling.id]
    for seg, holder in ((segment, seg_owner), (sibling, sib_owner)):
        if holder != owner:
            raise ClaimLostError(
                f"merge of {segment} and {sibling} of {processor!r} needs both claims; "
                f"{seg} is held by {holder or 'nobody'}, not {owner}"
            )
    merged = Token.merged(segment, tok, sibling, sib_tok)
    low, high = sorted([segment, sibling])
    return low, high, merged
