"""`AsyncSegmentedLog`: an unbounded log of ledgers, owned by one writer at a time.

This is the I/O shell of the segmented log (the theory of operation is in ledger/segmented.py):
the record's reads and CASes, `acquire` (seal the previous owner's ledger, start our own, CAS it
onto the list), `append` with its roll to a new ledger, `release`, and the detection of a lost
ownership. Reading is delegated to `SegmentReader` (ledger/seglog_reader.py). The decisions are
the pure functions of ledger/seglog_record.py, ledger/seglog_rolling.py and ledger/seglog_plan.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

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
)
from tidelog.ledger.ledgers import AsyncLedgers
from tidelog.ledger.metadata import LedgerState
from tidelog.ledger.seglog_reader import SegmentReader
from tidelog.ledger.seglog_record import (
    START,
    LogEntry,
    Position,
    SegmentedLogRecord,
    acquired_record,
    cas_applied,
    check_log_name,
    record_key,
    rolled_record,
)
from tidelog.ledger.seglog_rolling import RollPolicy, default_ensemble_size, default_owner, should_roll

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

log = logging.getLogger(__name__)

__all__ = ["AsyncSegmentedLog"]


class AsyncSegmentedLog:
    """An unbounded log of ledgers; `acquire()` to own it and `append`, or just `read` it.

    `client` is an `AsyncClient`. Ledgers of the log are created with `ensemble_size` (default:
    the replica count of the cluster's broker sets), `ack_quorum` (default: all replicas),
    `digest` and `password`; readers need the same password. `ledgers` replaces the ledger API
    the log works through (by default `AsyncLedgers(client)`).
    """

    def __init__(
        self,
        client: Transport,
        name: str,
        *,
        password: bytes = b"",
        ensemble_size: int | None = None,
        ack_quorum: int | None = None,
        digest: str = "crc32c",
        roll: RollPolicy | None = None,
        owner: str | None = None,
        broker_set: str | None = None,
        clock: Any = time.monotonic,
        max_acquire_attempts: int = 20,
        acquire_backoff_s: float = 0.05,
        cached_readers: int = 8,
        ledgers: AsyncLedgers | None = None,
    ) -> None:
        if not isinstance(password, bytes):
            raise IncorrectParameterError("a segmented log's password is bytes (empty is allowed)")
        self.name = check_log_name(name)
        self.key = record_key(name)
        self._client = client
        self._ledgers = AsyncLedgers(client) if ledgers is None else ledgers
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
        self._writer: Any = None  # the current ledger's write handle
        self._generation = 0
        self._lost: SegmentedLogOwnershipLostError | None = None
        self._must_roll = False  # an add failed with an unknown outcome: seal before the next
        self._entries = 0
        self._bytes = 0
        self._opened_at = 0.0
        self._pending: set[asyncio.Future[int]] = set()
        self._reading = SegmentReader(self._ledgers, password, self.record, cached_readers=cached_readers)

    # --- the record ---

    async def record(self) -> SegmentedLogRecord:
        """The log's record as stored now (MetadataNotFoundError if the log was never acquired)."""
        rec = await self._get_record()
        if rec is None:
            raise MetadataNotFoundError(
                f"no segmented log named {self.name!r}",
                key=self.key,
                hint="a log exists once an owner acquired it; check the name",
            )
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
            e,
            e,
            aq,
            self._password,
            digest=self._digest,
            custom_metadata={"seglog": self.name.encode(), "owner": self.owner.encode()},
            broker_set=self._broker_set,
        )

    async def _discard_ledger(self, handle: Any) -> None:
        """Delete a ledger that never made it onto the list (best effort: an orphan only costs space)."""
        with contextlib.suppress(TidelogError):
            await handle.close()
        try:
            await self._ledgers.delete_ledger(handle.ledger_id, self._password)
        except TidelogError as exc:
            log.warning(
                "segmented log %s: could not delete unlisted ledger %s: %s", self.name, handle.ledger_id, exc
            )

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
        log.info(
            "segmented log %s: recovered ledger %s, it ends at %s",
            self.name,
            ledger_id,
            handle.last_add_confirmed,
        )
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
                if current is not None and (current.owner, current.generation) == (
                    self.owner,
                    self._generation,
                ):
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
                log.info(
                    "segmented log %s: acquired as generation %d, writing ledger %s",
                    self.name,
                    new.generation,
                    handle.ledger_id,
                )
                return new
            raise MetadataVersionMismatchError(
                f"segmented log {self.name!r}: lost the record to other owners {self._max_acquire_attempts} times"
            )

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
                    ledger_id=ledger,
                    generation=self._generation,
                )
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
                    f"{after.generation} of {after.owner or 'nobody'})",
                    generation=after.generation,
                )
        except SegmentedLogOwnershipLostError as exc:
            await self._discard_ledger(handle)
            raise self._lose(exc) from exc
        except BaseException:
            await self._discard_ledger(handle)
            raise
        log.info(
            "segmented log %s: rolled from ledger %s (%d entries) to %s",
            self.name,
            old.ledger_id,
            self._entries,
            handle.ledger_id,
        )
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
            if self._must_roll or should_roll(
                self._entries, self._bytes, self._opened_at, self._clock(), self.roll_policy
            ):
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

    # --- reading (ledger/seglog_reader.py) ---

    async def read(self, from_position: Position = START, max_entries: int = 100) -> list[LogEntry]:
        """Up to `max_entries` confirmed entries from `from_position` on, in log order.

        Continue from `Position(last.ledger_id, last.entry_id + 1)` (or `next_position`). Empty when
        nothing confirmed is there yet.
        """
        return await self._reading.read(from_position, max_entries)

    async def read_from(
        self, from_position: Position = START, max_entries: int = 100
    ) -> tuple[list[LogEntry], Position]:
        """`read`, plus the position to continue from."""
        return await self._reading.read_from(from_position, max_entries)

    def entries(
        self,
        from_position: Position = START,
        *,
        follow: bool = False,
        batch: int = 100,
        poll_timeout: float = 1.0,
    ) -> AsyncIterator[LogEntry]:
        """Every confirmed entry from `from_position` on; with `follow`, wait for new ones for ever."""
        return self._reading.entries(from_position, follow=follow, batch=batch, poll_timeout=poll_timeout)

    async def close(self) -> None:
        """Release ownership (if held) and close cached read handles."""
        try:
            if self._writer is not None and self._lost is None:
                await self.release()
        finally:
            await self._reading.close()

    async def __aenter__(self) -> AsyncSegmentedLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
