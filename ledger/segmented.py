"""`SegmentedLog`: an unbounded log made of ledgers, owned by one writer at a time (a managed ledger).

Theory of operation
-------------------
A segmented log is a list of ledgers kept in ONE record of the controller's metadata store, under
`seglog/<name>`: the ledger ids in order, the owner's token and a generation (bumped by every
`acquire`). Every change of the record is a compare-and-set on its version, so two writers can
never both believe they appended the same ledger to the list.

- `acquire()`: read the record; if its last ledger is not CLOSED, recover it (a recovery open
  fences it on the replicas and closes it where its acknowledged entries end); create a new
  ledger; CAS the record appending that ledger with generation + 1 and our token. A lost CAS
  deletes the new ledger and starts over. Only then does `append` work.
- `append(data) -> Position`: add to the current ledger. Before an add, `should_roll` decides
  (size, entry count or age) whether to seal the current ledger and move to a new one: wait for
  the adds in flight, close the ledger (its end is its LAC), create a new one, CAS it onto the
  list (the CAS names the owner and generation it expects, so a roll cannot revive a lost
  ownership).
- Fencing is what makes ownership exclusive. A new owner's acquire recovers the old owner's
  ledger, so the old owner's next add fails with LedgerFencedError (or LedgerClosedError) and it
  raises `SegmentedLogOwnershipLostError`: it never moves on silently. A ledger has exactly one
  writer (the handle that created it), so no ledger ever holds two owners' entries, and every
  ledger in the list but the last is CLOSED (the owner closes before it CASes a new one on).
- Readers address entries by `Position(ledger_id, entry_id)` and read across ledgers in list
  order: a CLOSED ledger up to its last entry id, the last (open) ledger up to its LAC, through a
  non-recovery open that fences nothing. A reader never sees an entry a recovery could drop.

The pure parts (the record and its deterministic JSON, the record changes of acquire and roll,
the roll decision with the time passed in, the walk from a position over the list) are plain
functions below; the classes only do I/O. Ledger ids come from a counter and a ledger is only
appended after reading a record that holds every earlier one, so ids increase along the list;
`SegmentedLogRecord` refuses a list that does not, and positions order like the list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import re
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from tidelog.client.runner import SyncFacade
from tidelog.errors import (
    IllegalOpError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    MetadataVersionMismatchError,
    NoSuchLedgerExistsError,
    SegmentedLogOwnershipLostError,
    TidelogError,
    UnavailableError,
)
from tidelog.ledger.metadata import LedgerState, is_int

if TYPE_CHECKING:
    from tidelog.client import Client
    from tidelog.client.aio import AsyncClient

log = logging.getLogger(__name__)

__all__ = [
    "KEY_PREFIX",
    "RECORD_FORMAT",
    "AsyncSegmentedLog",
    "LedgerEnd",
    "LogEntry",
    "Position",
    "ReadPlan",
    "RollPolicy",
    "SegmentedLog",
    "SegmentedLogRecord",
    "acquired_record",
    "check_log_name",
    "choose_ensemble_size",
    "locate",
    "plan_read",
    "record_key",
    "rolled_record",
    "should_roll",
]

KEY_PREFIX = "seglog/"
RECORD_FORMAT = 1  # the JSON layout of SegmentedLogRecord; bump it (and keep reading the old one) on change

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_log_name(name: str) -> str:
    """A log name is 1–200 characters of letters, digits, '.', '_' and '-', starting with a letter or digit."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise IncorrectParameterError(
            f"a segmented log name is 1-200 characters of letters, digits, '.', '_' and '-', starting "
            f"with a letter or digit; got {name!r}")
    return name


def record_key(name: str) -> str:
    """The metadata store key of log `name`'s record."""
    return KEY_PREFIX + check_log_name(name)


# --- positions -----------------------------------------------------------------------------


class Position(NamedTuple):
    """Where an entry of a segmented log is: its ledger and its entry id in that ledger.

    Positions order like the log (ledger ids increase along the list). `Position(0, 0)` is before
    every entry; `Position(l, e + 1)` right after entry e of ledger l, which is what a reader passes
    on to continue.
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """'LEDGER:ENTRY' (as `str` prints it) → Position; anything else is IncorrectParameterError."""
        parts = text.split(":") if isinstance(text, str) else []
        try:
            if len(parts) != 2:
                raise ValueError
            ledger_id, entry_id = int(parts[0]), int(parts[1])
        except ValueError:
            raise IncorrectParameterError(f"a position is LEDGER_ID:ENTRY_ID, got {text!r}") from None
        return check_position(cls(ledger_id, entry_id))


START = Position(0, 0)


def check_position(position: Any) -> Position:
    if (not isinstance(position, tuple) or len(position) != 2 or not all(is_int(v) for v in position)
            or position[0] < 0 or position[1] < 0):
        raise IncorrectParameterError(f"a position is (ledger id ≥ 0, entry id ≥ 0), got {position!r}")
    return Position(*position)


class LogEntry(NamedTuple):
    position: Position
    data: bytes


# --- the record ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentedLogRecord:
    """The one metadata record of a segmented log: its ledgers in order, and who owns it."""

    name: str
    ledgers: tuple[int, ...] = ()
    owner: str = ""         # the token of the owner that last acquired the log ("" = never)
    generation: int = 0     # bumped by every acquire; a roll keeps it
    format_version: int = RECORD_FORMAT
    version: int = field(default=0, compare=False)  # the store's CAS version, not part of the value

    def __post_init__(self) -> None:
        object.__setattr__(self, "ledgers", tuple(self.ledgers))
        check_log_name(self.name)
        if self.format_version != RECORD_FORMAT:
            raise IncorrectParameterError(f"unknown segmented log record format {self.format_version!r}")
        if not all(is_int(lid) and lid >= 0 for lid in self.ledgers):
            raise IncorrectParameterError(f"ledger ids are non-negative integers, got {list(self.ledgers)}")
        if any(b <= a for a, b in zip(self.ledgers, self.ledgers[1:], strict=False)):
            raise IncorrectParameterError(f"the ledgers of a segmented log strictly increase, got "
                                          f"{list(self.ledgers)}")
        if not isinstance(self.owner, str):
            raise IncorrectParameterError(f"owner must be a string, got {self.owner!r}")
        if not is_int(self.generation) or self.generation < 0:
            raise IncorrectParameterError(f"generation must be a non-negative integer, got {self.generation!r}")

    @property
    def key(self) -> str:
        return record_key(self.name)

    @property
    def last_ledger(self) -> int | None:
        return self.ledgers[-1] if self.ledgers else None

    def encode(self) -> bytes:
        """Deterministic JSON (sorted keys, compact); equal records, equal bytes."""
        doc = {"format": self.format_version, "name": self.name, "ledgers": list(self.ledgers),
               "owner": self.owner, "generation": self.generation}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, *, version: int = 0) -> SegmentedLogRecord:
        try:
            doc = json.loads(bytes(data).decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc["format"] != RECORD_FORMAT:
                raise IncorrectParameterError(f"unknown segmented log record format {doc['format']!r}")
            if not isinstance(doc["ledgers"], list):
                raise ValueError("ledgers is not a list")
            return cls(name=doc["name"], ledgers=tuple(doc["ledgers"]), owner=doc["owner"],
                       generation=doc["generation"], format_version=doc["format"], version=version)
        except TidelogError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IncorrectParameterError(f"undecodable segmented log record: {exc}") from exc


def acquired_record(current: SegmentedLogRecord | None, name: str, new_ledger: int,
                    owner: str) -> SegmentedLogRecord:
    """The record an acquire CASes: `new_ledger` appended, `owner` named, the generation bumped.

    `current` is None when the log does not exist yet (the acquire creates it). The result keeps
    `current.version`: the CAS expects it and the store assigns the next.
    """
    if current is None:
        return SegmentedLogRecord(name=name, ledgers=(new_ledger,), owner=owner, generation=1)
    if current.name != name:
        raise IncorrectParameterError(f"record of log {current.name!r} read for log {name!r}")
    return replace(current, ledgers=current.ledgers + (new_ledger,), owner=owner,
                   generation=current.generation + 1)


def rolled_record(current: SegmentedLogRecord, new_ledger: int, owner: str,
                  generation: int) -> SegmentedLogRecord:
    """The record a roll CASes: `new_ledger` appended by the owner that holds `generation`.

    If the record names another owner or generation, ownership was taken over in between:
    SegmentedLogOwnershipLostError (the caller must not append to the new ledger).
    """
    if (current.owner, current.generation) != (owner, generation):
        raise SegmentedLogOwnershipLostError(
            f"segmented log {current.name!r} is now owned by generation {current.generation} "
            f"({current.owner or 'nobody'}), not by this owner's generation {generation}",
            owner=current.owner, generation=current.generation)
    return replace(current, ledgers=current.ledgers + (new_ledger,))


def cas_applied(after: SegmentedLogRecord | None, intended: SegmentedLogRecord) -> bool:
    """After a CAS whose answer was a version mismatch (or lost), whether it was applied anyway.

    The controller client retries a write whose answer was lost, and the retry then finds its own
    write in place. The owner token, generation and last ledger identify our write exactly: no
    other writer can produce that triple (nobody else holds our token; the ledger is ours).
    """
    return (after is not None and after.owner == intended.owner and after.generation == intended.generation
            and after.last_ledger == intended.last_ledger)


# --- rolling -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RollPolicy:
    """When an owner seals its ledger and moves to a new one (checked before each append).

    A ledger is rolled once it holds `max_entries` entries or `max_bytes` bytes of entry data, or
    has been open `max_age_s` seconds; an empty ledger is never rolled (an idle log makes no
    empty ledgers). None switches a limit off.
    """

    max_entries: int | None = 50_000
    max_bytes: int | None = 256 << 20
    max_age_s: float | None = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise IncorrectParameterError(f"{name} must be a positive integer or None, got {value!r}")
        age = self.max_age_s
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or not age > 0):
            raise IncorrectParameterError(f"max_age_s must be a positive number or None, got {age!r}")


def should_roll(entries: int, size_bytes: int, opened_at: float, now: float, policy: RollPolicy) -> bool:
    """Whether the current ledger (`entries` entries, `size_bytes` bytes, opened at `opened_at`) is full."""
    if entries <= 0:
        return False
    if policy.max_entries is not None and entries >= policy.max_entries:
        return True
    if policy.max_bytes is not None and size_bytes >= policy.max_bytes:
        return True
    return policy.max_age_s is not None and now - opened_at >= policy.max_age_s


# --- reading across ledgers ----------------------------------------------------------------


class LedgerEnd(NamedTuple):
    """What a reader knows of a ledger's end: the last readable entry id (−1: none) and whether it is final."""

    last: int
    closed: bool


class Span(NamedTuple):
    ledger_id: int
    first: int
    last: int


class ReadPlan(NamedTuple):
    """What to read next: spans in log order, the position after them, and a ledger whose end is
    needed to plan further (None when the plan is complete)."""

    spans: tuple[Span, ...]
    next_position: Position
    need: int | None


def locate(ledgers: Sequence[int], position: Position) -> tuple[int, int]:
    """(index in `ledgers`, entry id) where reading from `position` starts.

    The first ledger whose id is ≥ the position's: at the position's entry if it is that ledger,
    at entry 0 of a later one (the position's ledger is gone from the list, e.g. trimmed).
    `(len(ledgers), 0)` when the position is after every ledger.
    """
    for index, lid in enumerate(ledgers):
        if lid == position.ledger_id:
            return index, position.entry_id
        if lid > position.ledger_id:
            return index, 0
    return len(ledgers), 0


def plan_read(ledgers: Sequence[int], ends: Mapping[int, LedgerEnd], start: Position,
              max_entries: int) -> ReadPlan:
    """Plan reading up to `max_entries` entries from `start`, with the ledger ends known so far.

    Walks the list from `start`: a ledger with a known end gives the span [entry, min(end, ...)];
    a CLOSED ledger read to its end moves on to entry 0 of the next; an open one stops the walk
    (nothing past it is readable yet). A ledger whose end is not in `ends` stops the walk with
    `need` set to it: the caller learns its end and plans again. Pure.
    """
    if not is_int(max_entries) or max_entries < 1:
        raise IncorrectParameterError(f"max_entries must be a positive integer, got {max_entries!r}")
    start = check_position(start)
    index, entry = locate(ledgers, start)
    spans: list[Span] = []
    left = max_entries
    position = start
    while index < len(ledgers):
        lid = ledgers[index]
        position = Position(lid, entry)
        end = ends.get(lid)
        if end is None:
            return ReadPlan(tuple(spans), position, lid)
        if entry <= end.last:
            last = min(end.last, entry + left - 1)
            spans.append(Span(lid, entry, last))
            left -= last - entry + 1
            entry = last + 1
            position = Position(lid, entry)
        if left == 0 or not end.closed or entry <= end.last:
            break
        index, entry = index + 1, 0
    return ReadPlan(tuple(spans), position, None)


def choose_ensemble_size(replica_counts: Sequence[int]) -> int:
    """The ensemble size for ledgers when none is given: the replica count shared by every broker set
    that has a master. Sets of different sizes need an explicit choice (IncorrectParameterError)."""
    counts = sorted(set(replica_counts))
    if not counts:
        raise IncorrectParameterError("no broker set has a master: cannot choose an ensemble size")
    if len(counts) > 1:
        raise IncorrectParameterError(f"broker sets have {counts} replicas: give the ensemble size (it must "
                                      f"equal the replica count of the broker set the ledger goes to)")
    return counts[0]


async def default_ensemble_size(client: AsyncClient) -> int:
    """`choose_ensemble_size` over the cluster's broker sets that have a master now."""
    reply = await client.controller.describe_broker_sets()
    return choose_ensemble_size([len(b.members) for b in reply.broker_sets if b.role.has_master])


def default_owner() -> str:
    """A token no other owner holds: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


# --- the I/O shell -------------------------------------------------------------------------


class AsyncSegmentedLog:
    """An unbounded log of ledgers; `acquire()` to own it and `append`, or just `read` it.

    `client` is an `AsyncClient`. Ledgers of the log are created with `ensemble_size` (default:
    the replica count of the cluster's broker sets), `ack_quorum` (default: all replicas),
    `digest` and `password`; readers need the same password.
    """

    def __init__(self, client: AsyncClient, name: str, *, password: bytes = b"",
                 ensemble_size: int | None = None, ack_quorum: int | None = None, digest: str = "crc32c",
                 roll: RollPolicy | None = None, owner: str | None = None, broker_set: str | None = None,
                 clock: Any = time.monotonic, max_acquire_attempts: int = 20, acquire_backoff_s: float = 0.05,
                 cached_readers: int = 8) -> None:
        if not isinstance(password, bytes):
            raise IncorrectParameterError("a segmented log's password is bytes (empty is allowed)")
        self.name = check_log_name(name)
        self.key = record_key(name)
        self._client = client
        self._ledgers = client.ledgers()
        self._password = password
        self._ensemble_size = ensemble_size
        self._ack_quorum = ack_quorum
        self._digest = digest
        self._broker_set = broker_set
        self.roll_policy = roll or RollPolicy()
        self.owner = owner or default_owner()
        self._clock = clock
        self._max_acquire_attempts = max_acquire_attempts
        self._acquire_backoff_s = acquire_backoff_s
        self._lock = asyncio.Lock()
        # owner state
        self._writer: Any = None            # the current ledger's write handle
        self._generation = 0
        self._lost: SegmentedLogOwnershipLostError | None = None
        self._must_roll = False             # an add failed with an unknown outcome: seal before the next
        self._entries = 0
        self._bytes = 0
        self._opened_at = 0.0
        self._pending: set[asyncio.Future[int]] = set()
        # reader state: ends of CLOSED ledgers never change; read handles are reused (LRU)
        self._closed_ends: dict[int, LedgerEnd] = {}
        self._readers: OrderedDict[int, Any] = OrderedDict()
        self._cached_readers = max(1, cached_readers)

    # --- the record ---

    async def record(self) -> SegmentedLogRecord:
        """The log's record as stored now (MetadataNotFoundError if the log was never acquired)."""
        rec = await self._get_record()
        if rec is None:
            raise MetadataNotFoundError(f"no segmented log named {self.name!r}", key=self.key,
                                        hint="a log exists once an owner acquired it; check the name")
        return rec

    async def _get_record(self) -> SegmentedLogRecord | None:
        try:
            entry = await self._client.controller.meta_get(self.key)
        except MetadataNotFoundError:
            return None
        return SegmentedLogRecord.decode(entry.value, version=entry.version)

    async def _write_record(self, current: SegmentedLogRecord | None, new: SegmentedLogRecord) -> bool:
        """CAS `new` over `current` (create it when `current` is None). False when another write won."""
        try:
            if current is None:
                await self._client.controller.meta_create(self.key, new.encode())
            else:
                await self._client.controller.meta_cas(self.key, new.encode(), current.version)
            return True
        except (MetadataExistsError, MetadataVersionMismatchError):
            return cas_applied(await self._get_record(), new)

    # --- ownership ---

    @property
    def is_owner(self) -> bool:
        """True between a successful `acquire` and a detected loss (or `release`)."""
        return self._writer is not None and self._lost is None

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def current_ledger(self) -> int | None:
        return None if self._writer is None else int(self._writer.ledger_id)

    async def _ledger_params(self) -> tuple[int, int]:
        if self._ensemble_size is None:
            self._ensemble_size = await default_ensemble_size(self._client)
        return self._ensemble_size, self._ack_quorum or self._ensemble_size

    async def _create_ledger(self) -> Any:
        e, aq = await self._ledger_params()
        return await self._ledgers.create_ledger(
            e, e, aq, self._password, digest=self._digest,
            custom_metadata={"seglog": self.name.encode(), "owner": self.owner.encode()},
            broker_set=self._broker_set)

    async def _discard_ledger(self, handle: Any) -> None:
        """Delete a ledger that never made it onto the list (best effort: an orphan only costs space)."""
        with contextlib.suppress(TidelogError):
            await handle.close()
        try:
            await self._ledgers.delete_ledger(handle.ledger_id, self._password)
        except TidelogError as exc:
            log.warning("segmented log %s: could not delete unlisted ledger %s: %s", self.name, handle.ledger_id, exc)

    async def _seal(self, ledger_id: int) -> None:
        """Make sure `ledger_id` is CLOSED: recover it (fencing its writer) unless it already is."""
        try:
            meta = await self._ledgers.get_metadata(ledger_id)
        except NoSuchLedgerExistsError:
            log.warning("segmented log %s: ledger %s on its list no longer exists", self.name, ledger_id)
            return
        if meta.state is LedgerState.CLOSED:
            return
        handle = await self._ledgers.open_ledger(ledger_id, self._password, recovery=True)
        log.info("segmented log %s: recovered ledger %s, it ends at %s", self.name, ledger_id,
                 handle.last_add_confirmed)
        await handle.close()

    async def acquire(self) -> SegmentedLogRecord:
        """Become the log's only writer: seal the previous owner's ledger, start our own, CAS it on.

        Creates the log if it does not exist. Raises LedgerRecoveryError (retry) if the previous
        owner's ledger cannot be recovered now; a lost race with another acquirer starts over, up to
        `max_acquire_attempts` times (then MetadataVersionMismatchError).
        """
        async with self._lock:
            if self.is_owner:
                current = await self._get_record()
                if current is not None and (current.owner, current.generation) == (self.owner, self._generation):
                    return current
                # the record names someone else: ownership was taken over; acquire it back
            await self._drop_writer()
            for attempt in range(self._max_acquire_attempts):
                current = await self._get_record()
                if current is not None and current.last_ledger is not None:
                    await self._seal(current.last_ledger)
                handle = await self._create_ledger()
                try:
                    new = acquired_record(current, self.name, handle.ledger_id, self.owner)
                    won = await self._write_record(current, new)
                except BaseException:
                    await self._discard_ledger(handle)
                    raise
                if not won:
                    log.info("segmented log %s: another owner changed the record; acquiring again", self.name)
                    await self._discard_ledger(handle)
                    # every attempt fences the ledger it finds last; two acquirers retrying in step
                    # would fence each other's fresh ledgers over and over: back off, with jitter
                    b = self._acquire_backoff_s
                    await asyncio.sleep(random.uniform(b, b * 2 ** min(attempt, 4)))
                    continue
                self._start_ledger(handle)
                self._generation = new.generation
                self._lost = None
                log.info("segmented log %s: acquired as generation %d, writing ledger %s",
                         self.name, new.generation, handle.ledger_id)
                return new
            raise MetadataVersionMismatchError(
                f"segmented log {self.name!r}: lost the record to other owners {self._max_acquire_attempts} times")

    def _start_ledger(self, handle: Any) -> None:
        self._writer = handle
        self._entries = 0
        self._bytes = 0
        self._opened_at = self._clock()
        self._must_roll = False
        self._pending = set()

    async def _drop_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None and not writer.is_closed:
            with contextlib.suppress(TidelogError):
                await writer.close()

    def _lose(self, cause: BaseException, ledger: int | None = None) -> SegmentedLogOwnershipLostError:
        if self._lost is None:
            ledger = self.current_ledger if ledger is None else ledger
            if isinstance(cause, SegmentedLogOwnershipLostError):
                self._lost = cause
            else:
                what = f"{cause.code}: {cause.message}" if isinstance(cause, TidelogError) else repr(cause)
                self._lost = SegmentedLogOwnershipLostError(
                    f"segmented log {self.name!r}: ledger {ledger} was fenced or closed by another client "
                    f"(a new owner acquired the log, or the ledger was recovered): {what}",
                    ledger_id=ledger, generation=self._generation)
            log.warning("%s", self._lost)
        return self._lost

    def _check_owner(self) -> None:
        if self._lost is not None:
            raise self._lost
        if self._writer is None:
            raise IllegalOpError(f"segmented log {self.name!r}: acquire() it before appending")

    async def _roll(self) -> None:
        old = self._writer
        # A writer's close fails the adds still in flight (RULES W3): let them finish first.
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._lost is not None:
            raise self._lost
        try:
            await old.close()
        except (LedgerFencedError, LedgerClosedError, MetadataVersionError) as exc:
            raise self._lose(exc) from exc
        handle = await self._create_ledger()
        try:
            current = await self.record()
            new = rolled_record(current, handle.ledger_id, self.owner, self._generation)
            won = await self._write_record(current, new)
            if not won:
                after = await self.record()
                # the CAS lost: either another owner took over, or (never by this code) something
                # else wrote the record; in both cases this owner's list is no longer the list
                raise SegmentedLogOwnershipLostError(
                    f"segmented log {self.name!r}: the record changed under the owner (now generation "
                    f"{after.generation} of {after.owner or 'nobody'})", generation=after.generation)
        except SegmentedLogOwnershipLostError as exc:
            await self._discard_ledger(handle)
            raise self._lose(exc) from exc
        except BaseException:
            await self._discard_ledger(handle)
            raise
        log.info("segmented log %s: rolled from ledger %s (%d entries) to %s", self.name, old.ledger_id,
                 self._entries, handle.ledger_id)
        self._start_ledger(handle)

    async def append(self, data: bytes) -> Position:
        """Add `data` to the log; its position once the ack quorum confirmed it (in append order).

        SegmentedLogOwnershipLostError once another owner acquired the log (this append's outcome
        is unknown; every later append fails the same way until `acquire` is called again).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise IncorrectParameterError(f"an entry is bytes, got {type(data).__name__}")
        data = bytes(data)
        async with self._lock:
            self._check_owner()
            if self._must_roll or should_roll(self._entries, self._bytes, self._opened_at, self._clock(),
                                              self.roll_policy):
                await self._roll()
            handle = self._writer
            try:
                future = handle.add_entry_async(data)
            except (LedgerFencedError, LedgerClosedError) as exc:
                raise self._lose(exc) from exc
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)
            self._entries += 1
            self._bytes += len(data)
        try:
            entry_id = await future
        except (LedgerFencedError, LedgerClosedError) as exc:
            raise self._lose(exc) from exc
        except TidelogError:
            # the add's outcome is unknown and the handle may refuse more: seal the ledger at its LAC
            # (dropping this entry if it is beyond) and continue in a new one
            self._must_roll = True
            raise
        return Position(int(handle.ledger_id), int(entry_id))

    async def release(self) -> None:
        """Stop owning the log: wait for adds in flight and close the current ledger (the next owner
        then needs no recovery). The record keeps its owner; the next acquire replaces it."""
        async with self._lock:
            if self._pending:
                await asyncio.gather(*self._pending, return_exceptions=True)
            writer, self._writer = self._writer, None
            if writer is not None and self._lost is None:
                try:
                    await writer.close()
                except (LedgerFencedError, LedgerClosedError, MetadataVersionError) as exc:
                    raise self._lose(exc, int(writer.ledger_id)) from exc

    # --- reading ---

    async def _reader(self, ledger_id: int) -> Any:
        handle = self._readers.get(ledger_id)
        if handle is not None:
            self._readers.move_to_end(ledger_id)
            return handle
        handle = await self._ledgers.open_ledger(ledger_id, self._password, recovery=False)
        self._readers[ledger_id] = handle
        while len(self._readers) > self._cached_readers:
            _, old = self._readers.popitem(last=False)
            with contextlib.suppress(TidelogError):
                await old.close()
        return handle

    async def _end(self, ledger_id: int) -> LedgerEnd:
        known = self._closed_ends.get(ledger_id)
        if known is not None:
            return known
        meta = await self._ledgers.get_metadata(ledger_id)
        if meta.state is LedgerState.CLOSED:
            end = self._closed_ends[ledger_id] = LedgerEnd(int(meta.last_entry_id), True)
            # a handle opened while the ledger was open knows an older LAC and would refuse to read
            # up to the end: open it again, as a closed ledger
            stale = self._readers.pop(ledger_id, None)
            if stale is not None:
                with contextlib.suppress(TidelogError):
                    await stale.close()
            return end
        # open (or being recovered): readable up to the LAC, and nothing after it yet
        handle = await self._reader(ledger_id)
        return LedgerEnd(int(await handle.read_last_add_confirmed()), False)

    async def read(self, from_position: Position = START, max_entries: int = 100) -> list[LogEntry]:
        """Up to `max_entries` confirmed entries from `from_position` on, in log order.

        Continue from `Position(last.ledger_id, last.entry_id + 1)` (or `next_position`). Empty when
        nothing confirmed is there yet.
        """
        entries, _ = await self.read_from(from_position, max_entries)
        return entries

    async def read_from(self, from_position: Position = START,
                        max_entries: int = 100) -> tuple[list[LogEntry], Position]:
        """`read`, plus the position to continue from."""
        from_position = check_position(from_position)
        rec = await self.record()
        ends: dict[int, LedgerEnd] = {}
        while True:
            plan = plan_read(rec.ledgers, ends, from_position, max_entries)
            if plan.need is None:
                break
            ends[plan.need] = await self._end(plan.need)
        out: list[LogEntry] = []
        for span in plan.spans:
            handle = await self._reader(span.ledger_id)
            first = span.first
            while first <= span.last:
                got = await handle.read_entries(first, span.last)
                if not got:
                    raise UnavailableError(f"ledger {span.ledger_id} returned no entries from {first}")
                for e in got:
                    out.append(LogEntry(Position(span.ledger_id, int(e.entry_id)), bytes(e.data)))
                first = int(got[-1].entry_id) + 1
        return out, plan.next_position

    async def entries(self, from_position: Position = START, *, follow: bool = False,
                      batch: int = 100, poll_timeout: float = 1.0) -> AsyncIterator[LogEntry]:
        """Every confirmed entry from `from_position` on; with `follow`, wait for new ones for ever."""
        position = check_position(from_position)
        while True:
            got, position = await self.read_from(position, batch)
            for entry in got:
                yield entry
            if got:
                continue
            if not follow:
                return
            await self._wait_for_more(position, poll_timeout)

    async def _wait_for_more(self, position: Position, timeout: float) -> None:
        rec = await self.record()
        index, entry = locate(rec.ledgers, position)
        if index >= len(rec.ledgers):
            await asyncio.sleep(timeout)
            return
        lid = rec.ledgers[index]
        end = await self._end(lid)
        if end.closed:
            if index + 1 < len(rec.ledgers):
                return  # a roll sealed it while we looked: read on in the next ledger
            # released by its owner and no new owner yet: look again later
            await asyncio.sleep(min(timeout, 0.5))
            return
        handle = await self._reader(lid)
        await handle.wait_for_lac(max(entry - 1, end.last), timeout)

    async def close(self) -> None:
        """Release ownership (if held) and close cached read handles."""
        try:
            if self._writer is not None and self._lost is None:
                await self.release()
        finally:
            readers, self._readers = list(self._readers.values()), OrderedDict()
            for handle in readers:
                with contextlib.suppress(TidelogError):
                    await handle.close()

    async def __aenter__(self) -> AsyncSegmentedLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SegmentedLog(SyncFacade):
    """The synchronous face of `AsyncSegmentedLog`: `SegmentedLog(client, name, ...)` with a `Client`.

    Every coroutine method of the async log runs on the client's event loop and is waited for;
    its properties read through.
    """

    _target: AsyncSegmentedLog

    def __init__(self, client: Client, name: str, **options: Any) -> None:
        self.aio = AsyncSegmentedLog(client.aio, name, **options)
        super().__init__(client.runner, self.aio)

    def entries(self, from_position: Position = START, *, batch: int = 100) -> Iterator[LogEntry]:
        """Every entry confirmed now from `from_position` on (no following; use the async API to tail)."""
        position = check_position(from_position)
        while True:
            got, position = self.read_from(position, batch)
            if not got:
                return
            yield from got
