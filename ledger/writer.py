"""`AsyncWriteHandle`: the one writer of a ledger (the handle `create_ledger` returns).

Entry ids come from `WriterLedger` (0, 1, 2, …) at call time; adds go to the set's master in
batches (one `AddBatch` call each) and complete in id order once the master reports AQ replicas
(rules W1–W3 in RULES.md). Batching is Kafka-style: an add made while the handle has a free
request slot goes at once (with whatever else was added in the same turn of the event loop); while
`MAX_IN_FLIGHT_BATCHES` calls are in flight, later adds queue and go together as the next batch
(at most `MAX_BATCH_ENTRIES` entries / `MAX_BATCH_BYTES`). So one add alone costs one round trip,
and a pipelined writer pays one round trip, one append and one fsync per batch, not per entry.
A long queue is shared over the free slots (`batch_size`): a writer that refills its whole window
at once then keeps two calls in flight, one being written on the master while the next travels.

"Not here / not now" answers are retried (the same batch, same ids) after a refresh of the master,
until the add timeout; a fenced answer fails every pending add with LedgerFencedError; any other
failure fails the batch's adds and every later pending one, and the handle refuses further adds.
`close` seals the ledger at its LAC by a metadata CAS.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog import dataport_frames as df
from tidelog.errors import (
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    TidelogError,
)
from tidelog.ledger.calls import LedgerCalls
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import LedgerEvent, LedgerMetadata, apply_transition
from tidelog.ledger.params import check_entry_data
from tidelog.ledger.recovery import WriterLedger

log = logging.getLogger(__name__)

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_ENTRIES", "MAX_IN_FLIGHT_BATCHES", "AsyncWriteHandle"]

MAX_BATCH_ENTRIES = 1_000
MAX_BATCH_BYTES = 4 << 20  # of entry data; a single larger entry still goes, alone
# More than one call in flight keeps the pipe full while a reply travels back; the master
# completes them in id order whatever order they arrive in (broker/ledgers.py).
MAX_IN_FLIGHT_BATCHES = 2
MIN_SPLIT = 64  # a queue shorter than twice this goes in one call even when two slots are free


@dataclass
class _PendingAdd:
    entry_id: int
    entry: df.LedgerEntry
    future: asyncio.Future[int]
    task: asyncio.Task[None] | None = None  # the call carrying it, once sent


def take_batch(
    queue: collections.deque[_PendingAdd], live: Mapping[int, object], max_entries: int, max_bytes: int
) -> list[_PendingAdd]:
    """Take the next batch off the head of `queue`: adds still `live` (failed ones are dropped), up
    to `max_entries` and `max_bytes` of data, but always at least one add when there is one."""
    batch: list[_PendingAdd] = []
    size = 0
    while queue and len(batch) < max_entries:
        add = queue[0]
        if add.entry_id not in live:
            queue.popleft()
            continue
        if batch and size + len(add.entry.data) > max_bytes:
            break
        batch.append(queue.popleft())
        size += len(add.entry.data)
    return batch


def batch_size(queued: int, free_slots: int) -> int:
    """How many adds the next call takes: the queue shared over the free request slots, so that
    a writer that refills its window at once keeps two calls in flight (one being written and
    fsync'd on the master while the next travels) rather than one call and an idle slot; but
    never fewer than MIN_SPLIT (small calls cost more than they overlap) nor more than
    MAX_BATCH_ENTRIES."""
    share = -(-queued // max(1, free_slots))
    return min(MAX_BATCH_ENTRIES, max(MIN_SPLIT, share))


class AsyncWriteHandle:
    """The writer of one ledger (the handle `create_ledger` returns; the only one that adds)."""

    def __init__(self, ledgers: LedgerCalls, metadata: LedgerMetadata, password: bytes) -> None:
        self._ledgers = ledgers
        self._meta = metadata
        self._password = password
        self.ledger_id = metadata.ledger_id
        self._core = WriterLedger(metadata.replicas, metadata.ack_quorum)
        self._digester = Digester(metadata.digest_type, password)
        self._pending: dict[int, _PendingAdd] = {}
        self._queue: collections.deque[_PendingAdd] = collections.deque()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._kick_scheduled = False
        self._pushed_length = 0
        self._failure: TidelogError | None = None
        self._closing: asyncio.Future[None] | None = None
        #: AddBatch calls made (one per batch; a batch resent after "not here / not now" counts once)
        self.add_requests = 0

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._core.lac

    @property
    def last_add_pushed(self) -> int:
        return self._core.lap

    @property
    def length(self) -> int:
        """Bytes through the LAC."""
        return self._core.length

    @property
    def is_closed(self) -> bool:
        return self._core.closed or self._failure is not None

    async def add_entry(self, data: bytes) -> int:
        return await self.add_entry_async(data)

    def add_entry_async(self, data: bytes) -> asyncio.Future[int]:
        """Queue an entry for the next batch and return a future of its id, which completes once
        AQ replicas hold it, in id order. Bad data raises IncorrectParameterError and a closed or
        failed handle LedgerClosedError here, at call time: the id is handed out only if the
        entry is sent."""
        data = check_entry_data(data, self._ledgers.max_entry_bytes)
        if self._failure is not None and not self._core.closed:
            raise LedgerClosedError(
                f"ledger {self.ledger_id}: the handle failed and takes no more adds ({self._failure})",
                ledger_id=self.ledger_id,
            )
        entry_id = self._core.begin_add(len(data))  # LedgerClosedError once closed or fenced
        self._pushed_length += len(data)
        lac = self._core.lac
        entry = df.LedgerEntry(
            entry_id,
            lac,
            self._pushed_length,
            self._digester.compute(self.ledger_id, entry_id, lac, self._pushed_length, data),
            data,
        )
        loop = asyncio.get_running_loop()
        add = _PendingAdd(entry_id, entry, loop.create_future())
        self._pending[entry_id] = add
        self._queue.append(add)
        if len(self._in_flight) < MAX_IN_FLIGHT_BATCHES and not self._kick_scheduled:
            # at the end of this turn of the loop: adds made in the same turn share the call
            self._kick_scheduled = True
            loop.call_soon(self._kick)
        return add.future

    def _kick(self) -> None:
        """Send queued adds while a request slot is free, one batch per slot."""
        self._kick_scheduled = False
        loop = asyncio.get_running_loop()
        while self._queue and len(self._in_flight) < MAX_IN_FLIGHT_BATCHES:
            size = batch_size(len(self._queue), MAX_IN_FLIGHT_BATCHES - len(self._in_flight))
            batch = take_batch(self._queue, self._pending, size, MAX_BATCH_BYTES)
            if not batch:
                return
            task = loop.create_task(self._send_batch(batch))
            self._in_flight.add(task)
            self.add_requests += 1
            for add in batch:
                add.task = task

    async def _send_batch(self, batch: list[_PendingAdd]) -> None:
        try:
            await self._deliver(batch)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._in_flight.discard(task)
            if self._queue and not self._kick_scheduled:
                self._kick_scheduled = True
                asyncio.get_running_loop().call_soon(self._kick)

    async def _deliver(self, batch: list[_PendingAdd]) -> None:
        first, last = batch[0].entry_id, batch[-1].entry_id
        entries = [a.entry for a in batch]
        ledger_id, password = self.ledger_id, self._password
        deadline = time.monotonic() + self._ledgers.add_timeout
        while True:
            try:
                reply = await self._ledgers.call_master(
                    self._meta.broker_set,
                    lambda address, timeout: self._ledgers.add_batch(
                        address, ledger_id, password, entries, timeout
                    ),
                    deadline=deadline,
                    what=f"add of ledger {self.ledger_id} entries {first}..{last}",
                )
            except LedgerFencedError:
                self._on_fenced(first)
                return
            except TidelogError as err:
                if await self._retry_after_earlier(batch[0], deadline):
                    continue
                if not batch[0].future.done():
                    self._on_failed(first, err)
                return
            self._on_batch_added(batch, reply)
            return

    async def _retry_after_earlier(self, add: _PendingAdd, deadline: float) -> bool:
        """The master completes adds in id order and refuses a batch when an earlier one failed
        there; if that earlier one is still being retried here, wait for it: True to send this
        batch again (its ids stay the same), False when it is to fail (or already failed)."""
        earlier = [a.future for e, a in self._pending.items() if e < add.entry_id and not a.future.done()]
        if not earlier or time.monotonic() >= deadline:
            return False
        await asyncio.wait(earlier, timeout=deadline - time.monotonic())
        if add.future.done():
            return False  # an earlier add failed for good, and this one with it
        return not any(f.done() and not f.cancelled() and f.exception() is not None for f in earlier)

    def _on_batch_added(self, batch: list[_PendingAdd], reply: df.LedgerAdded) -> None:
        if self._core.closed:
            return  # the adds were failed already (fence, close)
        holders = sorted(set(reply.replicas) & set(self._core.replicas))
        if len(holders) < self._meta.ack_quorum:
            self._on_failed(
                batch[0].entry_id,
                NotEnoughBookiesError(
                    f"entries {batch[0].entry_id}..{batch[-1].entry_id}: the master reported "
                    f"{sorted(reply.replicas)}, fewer than {self._meta.ack_quorum} replicas of the "
                    f"ensemble {list(self._core.replicas)}"
                ),
            )
            return
        confirmed: list[int] = []
        for add in batch:
            if add.entry_id in self._pending:  # not failed meanwhile (an earlier failure)
                for r in holders:
                    confirmed.extend(self._core.on_ack(add.entry_id, r))
        for e in confirmed:  # in id order (W1), earlier batches' adds included when their reply came later
            done = self._pending.pop(e, None)
            if done is not None and not done.future.done():
                done.future.set_result(e)

    def _fail(self, errors: Mapping[int, BaseException], *, keep: asyncio.Task[None] | None = None) -> None:
        for e in sorted(errors):
            add = self._pending.pop(e, None)
            if add is None:
                continue
            if not add.future.done():
                add.future.set_exception(errors[e])
                add.future.exception()  # retrieved: a caller that dropped the future is not warned
            if add.task is not None and add.task is not keep and add.task is not asyncio.current_task():
                add.task.cancel()

    def _on_fenced(self, entry_id: int) -> None:
        log.info("ledger %d: entry %d refused as fenced; the writer is closed", self.ledger_id, entry_id)
        self._fail(self._core.on_fenced(entry_id))

    def _on_failed(self, entry_id: int, err: TidelogError) -> None:
        if self._core.closed:
            return
        log.warning("ledger %d: add of entry %d failed: %s", self.ledger_id, entry_id, err)
        if self._failure is None:
            self._failure = err
        # the failed add and every later one fail; earlier ones may still be confirmed
        self._fail({e: err for e in self._pending if e >= entry_id})

    async def close(self) -> None:
        """Seal the ledger at its LAC (rule W3): pending adds fail with LedgerClosedError, then the
        metadata is CAS'd OPEN → CLOSED. LedgerFencedError if a recovery is under way,
        MetadataVersionError if someone else closed it elsewhere. A second close waits for the first,
        or tries again when the first failed retryably (CONTROLLER_UNAVAILABLE: the metadata CAS
        needs a controller quorum; the handle takes no more adds meanwhile)."""
        if self._closing is None or _failed_retryably(self._closing):
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        failed, last, length = self._core.close()
        leftover = {
            e: LedgerClosedError(f"entry {e}: the handle was closed", entry_id=e)
            for e in self._pending
            if e not in failed
        }
        tasks = list(self._in_flight)
        self._fail({**failed, **leftover})
        self._queue.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        current = self._meta
        while True:
            new = apply_transition(current, LedgerEvent.WRITER_CLOSE, last_entry_id=last, length=length)
            if new is None:
                break  # CLOSED already at our end (our own earlier close whose answer was lost)
            stored = await self._ledgers.cas_metadata(new, current.version, self._password)
            if stored is not None:
                current = stored
                break
            current = await self._ledgers.read_metadata(self.ledger_id)
        self._meta = current
        await self._ledgers.seal_on_brokers(current, self._password)
        log.info("closed ledger %d at entry %d (length %d)", self.ledger_id, last, length)

    async def __aenter__(self) -> AsyncWriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _failed_retryably(task: asyncio.Future[None]) -> bool:
    if not task.done() or task.cancelled():
        return False
    exc = task.exception()
    return isinstance(exc, TidelogError) and exc.retryable
