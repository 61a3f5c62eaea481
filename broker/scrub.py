"""The scrub: a running broker re-reads its own commit log against the records' CRCs, so that
damage on disk (bit flips) is found before a reader or an election meets it.

Every second it checks the next `scrub_bytes_per_s` bytes of the log below its stable end (min of
the flushed and confirm offsets), wrapping to the log's start at the end; `commitlog/verify.py::
scrub_chunk` does the reading and checking, on a thread. Damage found goes to
`Replica.on_corrupt`, as a damaged read does: a slave asks its master for the range, a master
asks a connected slave whose acks cover it.

While this replica knows of damage it has not seen repaired, `damaged` is true and the broker's
heartbeats carry `DAMAGED_PRIORITY` (the worst there is) instead of its configured priority: the
controller then never elects it over a SyncStateSet member that holds as much of the log
(docs/SECURITY.md, probe 7). Each round first checks the known damaged ranges again: one found
whole (repaired) stops counting at once, one still damaged is asked of a replica that holds it
again (`Replica.request_repair`): so a master elected with damage (it held the most of the log,
or was the only one alive) repairs it from the first slave to connect that holds the range.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from tidelog.errors import CorruptRecordError, TidelogError
from tidelog.invariants import stop_if_violated
from tidelog.tasks import within

if TYPE_CHECKING:
    from tidelog.broker.replica import Replica

log = logging.getLogger(__name__)

#: The election priority a damaged replica reports (lower wins; unset is 2^31 - 1).
DAMAGED_PRIORITY = 2**62
INTERVAL_S = 1.0
#: Bytes read at a time (a round of `scrub_bytes_per_s` is several such reads).
CHUNK = 1 << 20
#: Known damaged ranges checked again each round.
RECHECK = 16


class Scrubber:
    """The scrub of one broker replica."""

    def __init__(self, replica: Replica, bytes_per_s: int) -> None:
        self.replica = replica
        self.bytes_per_s = bytes_per_s
        self.cursor = 0
        self.damage: dict[int, int] = {}  # start -> end of damage found and not seen repaired
        self.passes = 0  # whole passes over the log, for status and tests
        self.found = 0  # damaged ranges found, ever

    @property
    def damaged(self) -> bool:
        return bool(self.damage)

    async def run(self, stopping: asyncio.Event) -> None:
        """Rounds until `stopping` is set (none when `bytes_per_s` is 0)."""
        if self.bytes_per_s <= 0:
            return
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), INTERVAL_S)
            if stopping.is_set():
                return
            try:
                await self.recheck()
                await self.round()
            except (TidelogError, OSError) as exc:
                # the store closed, or a segment went (retention, truncation) under the read:
                # start the pass over rather than guess
                log.warning("%s scrub round failed: %s", self.replica.ctx, exc)
                self.cursor = 0
            except Exception as exc:
                stop_if_violated(exc)
                log.exception("%s scrub round failed", self.replica.ctx)

    async def recheck(self) -> None:
        """Check again each range known damaged (at most RECHECK of them), so that one repaired
        stops counting at once rather than when the next pass reaches it."""
        log_ = self.replica.log
        for start in sorted(self.damage)[:RECHECK]:
            if start < log_.min_offset:
                del self.damage[start]  # gone with retention
                continue
            end = self.damage[start]
            nxt, damage = await asyncio.to_thread(log_.scrub, start, end - start)
            if damage is None and nxt > start:
                log.info("%s scrub: [%d, %d) is whole again", self.replica.ctx, start, self.damage.pop(start))
            elif damage is not None and damage.start == start:
                # still damaged: ask for a copy again (a replica that holds it may have connected
                # since, the role may have changed, or the answer was lost with a connection)
                self.replica.request_repair(start, end - start)

    async def round(self) -> None:
        """Check up to `bytes_per_s` bytes from the cursor."""
        budget = self.bytes_per_s
        log_ = self.replica.log
        while budget > 0:
            start = max(self.cursor, log_.min_offset)
            nxt, damage = await asyncio.to_thread(log_.scrub, start, min(budget, CHUNK))
            # ranges found before and now behind the cursor without damage: repaired
            for s in [s for s in self.damage if start <= s < nxt and (damage is None or s != damage.start)]:
                log.info("%s scrub: [%d, %d) is whole again", self.replica.ctx, s, self.damage.pop(s))
            if damage is not None:
                if damage.start not in self.damage:
                    self.found += 1
                self.damage[damage.start] = damage.end
                self.replica.on_corrupt(
                    CorruptRecordError(
                        damage.path, damage.start, damage.reason, size=damage.end - damage.start
                    )
                )
            if nxt == start:  # the stable end: start over from the log's start next round
                self.cursor = log_.min_offset
                self.passes += 1
                self.damage = {s: e for s, e in self.damage.items() if s >= log_.min_offset}
                return
            budget -= nxt - start
            self.cursor = nxt
