"""Reading a segmented log: entries in list order across its ledgers, for readers and owners alike.

`SegmentReader` keeps what reading learns and reuses: open read handles (a few, least recently
used first out) and the ends of CLOSED ledgers, which never change. It plans each read with
`plan_read` (ledger/seglog_plan.py), learning the end of each ledger the plan needs: a CLOSED
ledger's from its metadata, the open one's LAC through a non-recovery open that fences nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tidelog.errors import TidelogError, UnavailableError
from tidelog.ledger.ledgers import AsyncLedgers
from tidelog.ledger.metadata import LedgerState
from tidelog.ledger.seglog_plan import LedgerEnd, locate, plan_read
from tidelog.ledger.seglog_record import START, LogEntry, Position, SegmentedLogRecord, check_position

__all__ = ["SegmentReader"]


class SegmentReader:
    """Reads the ledgers of one segmented log; `record` returns the log's record as stored now."""

    def __init__(
        self,
        ledgers: AsyncLedgers,
        password: bytes,
        record: Callable[[], Awaitable[SegmentedLogRecord]],
        *,
        cached_readers: int = 8,
    ) -> None:
        self._ledgers = ledgers
        self._password = password
        self._record = record
        # ends of CLOSED ledgers never change; read handles are reused (LRU)
        self._closed_ends: dict[int, LedgerEnd] = {}
        self._readers: OrderedDict[int, Any] = OrderedDict()
        self._cached_readers = max(1, cached_readers)

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

    async def read_from(
        self, from_position: Position = START, max_entries: int = 100
    ) -> tuple[list[LogEntry], Position]:
        """`read`, plus the position to continue from."""
        from_position = check_position(from_position)
        rec = await self._record()
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

    async def entries(
        self,
        from_position: Position = START,
        *,
        follow: bool = False,
        batch: int = 100,
        poll_timeout: float = 1.0,
    ) -> AsyncIterator[LogEntry]:
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
        rec = await self._record()
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
        """Close the cached read handles."""
        readers, self._readers = list(self._readers.values()), OrderedDict()
        for handle in readers:
            with contextlib.suppress(TidelogError):
                await handle.close()
