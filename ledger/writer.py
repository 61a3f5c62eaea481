"""`AsyncWriteHandle`: the one writer of a ledger (the handle `create_ledger` returns).

Entry ids come from `WriterLedger` (0, 1, 2, …) at call time; adds are sent to the set's master
at once (pipelined) and complete in id order once the master reports AQ replicas (rules W1–W3
in RULES.md). "Not here / not now" answers are retried on the same entry id after a refresh of
the master, until the add timeout; a fenced answer fails every pending add with
LedgerFencedError; any other failure fails that add and every later pending one, and the handle
refuses further adds. `close` seals the ledger at its LAC by a metadata CAS.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

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
from tidelog.proto import ledger_pb2 as lpb

log = logging.getLogger(__name__)

__all__ = ["AsyncWriteHandle"]


@dataclass
class _PendingAdd:
    entry_id: int
    request: lpb.AddRequest
    future: asyncio.Future[int]
    task: asyncio.Task[None] | None = None


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
        self._pushed_length = 0
        self._failure: TidelogError | None = None
        self._closing: asyncio.Future[None] | None = None

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
        """Send an entry now and return a future of its id, which completes once AQ replicas hold
        it, in id order. Bad data raises IncorrectParameterError and a closed or failed handle
        LedgerClosedError here, at call time: the id is handed out only if the entry is sent."""
        data = check_entry_data(data, self._ledgers.max_entry_bytes)
        if self._failure is not None and not self._core.closed:
            raise LedgerClosedError(
                f"ledger {self.ledger_id}: the handle failed and takes no more adds ({self._failure})",
                ledger_id=self.ledger_id,
            )
        entry_id = self._core.begin_add(len(data))  # LedgerClosedError once closed or fenced
        self._pushed_length += len(data)
        lac = self._core.lac
        request = lpb.AddRequest(
            ledger_id=self.ledger_id,
            entry_id=entry_id,
            password=self._password,
            lac=lac,
            length=self._pushed_length,
            digest=self._digester.compute(self.ledger_id, entry_id, lac, self._pushed_length, data),
            data=data,
        )
        loop = asyncio.get_running_loop()
        add = _PendingAdd(entry_id, request, loop.create_future())
        self._pending[entry_id] = add
        add.task = loop.create_task(self._send(add))
        return add.future

    async def _send(self, add: _PendingAdd) -> None:
        deadline = time.monotonic() + self._ledgers.add_timeout
        while True:
            try:
                reply = await self._ledgers.call_master(
                    self._meta.broker_set,
                    "Add",
                    add.request,
                    deadline=deadline,
                    what=f"add of ledger {self.ledger_id} entry {add.entry_id}",
                )
            except LedgerFencedError:
                self._on_fenced(add.entry_id)
                return
            except TidelogError as err:
                # The master completes adds in id order and refuses this one when an earlier one
                # failed there; if that earlier one is still being retried here, wait for it and
                # send this one again (its id stays the same), rather than fail the handle.
                earlier = [
                    a.future for e, a in self._pending.items() if e < add.entry_id and not a.future.done()
                ]
                if earlier and time.monotonic() < deadline:
                    await asyncio.wait(earlier, timeout=deadline - time.monotonic())
                    if add.future.done():
                        return  # an earlier add failed for good, and this one with it
                    if not any(f.done() and not f.cancelled() and f.exception() is not None for f in earlier):
                        continue
                self._on_failed(add.entry_id, err)
                return
            self._on_added(add.entry_id, reply)
            return

    def _on_added(self, entry_id: int, reply: lpb.AddReply) -> None:
        if self._core.closed or entry_id not in self._pending:
            return  # the add was failed already (fence, close, an earlier failure)
        holders = sorted(set(reply.replicas) & set(self._core.replicas))
        if len(holders) < self._meta.ack_quorum:
            self._on_failed(
                entry_id,
                NotEnoughBookiesError(
                    f"entry {entry_id}: the master reported {sorted(reply.replicas)}, fewer than "
                    f"{self._meta.ack_quorum} replicas of the ensemble {list(self._core.replicas)}"
                ),
            )
            return
        confirmed: list[int] = []
        for r in holders:
            confirmed.extend(self._core.on_ack(entry_id, r))
        for e in confirmed:  # in id order (W1)
            add = self._pending.pop(e, None)
            if add is not None and not add.future.done():
                add.future.set_result(e)

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
        MetadataVersionError if someone else closed it elsewhere. A second close waits for the first."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        failed, last, length = self._core.close()
        leftover = {
            e: LedgerClosedError(f"entry {e}: the handle was closed", entry_id=e)
            for e in self._pending
            if e not in failed
        }
        tasks = [a.task for a in self._pending.values() if a.task is not None]
        self._fail({**failed, **leftover})
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
