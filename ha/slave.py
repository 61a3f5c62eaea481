"""The slave side of replication: follow the master the controller named, repair forks, copy bytes.

Theory of operation
-------------------
`HaSlave.run()` loops until stopped: connect to the master's HA address, send a Handshake (this
broker's id, epoch map and max offset), read the master's epoch map, compute the last point
where both histories agree (`commitlog.epochs.last_consistent_point`) and truncate the local
log, consume queues and epoch file there. Then ack the local max offset; the master streams from
it. A master whose epoch is older than any this slave knows (from the controller or its own
epoch file) is refused at the handshake: a deposed master cannot write here. Each Transfer is
checked before it touches the log: its epoch must not go back from the last one the stream (or
the repaired log) holds, and its offset must be exactly the local max (otherwise re-handshake). New epochs are recorded in the epoch file as their first bytes arrive.
The slave's confirm offset follows the master's, never past its own max.

Any protocol violation or I/O error closes the connection and the loop starts over after a
short pause; it never stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from tidelog.clusterauth import new_nonce
from tidelog.commitlog import CommitLog
from tidelog.commitlog.epochs import last_consistent_point
from tidelog.errors import HaProtocolError, OffsetMismatchError, TidelogError
from tidelog.ha import auth as ha_auth
from tidelog.ha.protocol import (
    MAX_AUTH_FRAME,
    Ack,
    AuthChallenge,
    AuthHello,
    AuthProof,
    ErrorFrame,
    Handshake,
    HandshakeReply,
    LedgerFenced,
    RangeData,
    RangeRequest,
    Transfer,
    encode,
    read_frame,
)
from tidelog.invariants import stop_if_violated
from tidelog.tasks import cancel_and_wait, within

log = logging.getLogger(__name__)


class HaSlave:
    def __init__(self, commitlog: CommitLog, *, broker_set: str, broker_id: int, master_id: int,
                 master_address: str, master_epoch: int, flush_sync: bool = False,
                 ack_interval_ms: int = 1000, idle_timeout_ms: int = 5000, retry_ms: int = 500,
                 on_progress: Callable[[], None] | None = None,
                 fenced_ledgers: Callable[[], Iterable[int]] | None = None, secret: str = "",
                 unclean_epoch: int = 0) -> None:
        self.log = commitlog
        self.secret = secret
        # The last epoch the controller elected outside the SyncStateSet: only a replica whose history
        # ends before it may have its confirmed tail cut by fork repair (a clean election keeps
        # what every in-sync member held; an unclean one may not have).
        self.unclean_epoch = unclean_epoch
        self.refusals = 0  # masters refused for demanding a cut below the confirm offset
        self._repairs: set[tuple[int, int]] = set()  # damaged ranges asked of the master
        self.repaired: list[tuple[int, int]] = []  # ranges rewritten from the master's copy
        self.broker_set = broker_set
        self.broker_id = broker_id
        self.master_id = master_id
        self.master_address = master_address
        self.master_epoch = master_epoch
        self.flush_sync = flush_sync
        self.ack_interval = ack_interval_ms / 1000.0
        self.idle_timeout = idle_timeout_ms / 1000.0
        self.retry = retry_ms / 1000.0
        self.on_progress = on_progress
        self.fenced_ledgers = fenced_ledgers
        self._writer: asyncio.StreamWriter | None = None
        self.connected = False
        self.handshakes = 0
        self.truncations: list[tuple[int, int]] = []  # (from max offset, to offset), for tests and status
        self._seen_epoch = commitlog.epochs.last_epoch
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._ctx = f"[{broker_set}/{broker_id} slave of {master_id}@{master_address} epoch {master_epoch}]"

    def start(self) -> HaSlave:
        self._task = asyncio.ensure_future(self.run())
        return self

    async def stop(self) -> None:
        self._stopped = True  # the loop ends even if a cancellation were lost on the way
        await cancel_and_wait(self._task)
        self._task = None
        self.connected = False

    async def run(self) -> None:
        while not self._stopped:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                log.info("%s connection lost: %s", self._ctx, exc or type(exc).__name__)
            except TidelogError as exc:
                log.warning("%s %s", self._ctx, exc)
            except Exception as exc:  # a bug: log it and keep following the master (unless an invariant broke)
                stop_if_violated(exc)
                log.exception("%s replication failed", self._ctx)
            self.connected = False
            await asyncio.sleep(self.retry)

    async def _session(self) -> None:
        host, _, port = self.master_address.rpartition(":")
        reader, writer = await within(asyncio.open_connection(host, int(port)), self.idle_timeout)
        try:
            await self._authenticate(reader, writer)
            writer.write(encode(Handshake(self.broker_set, self.broker_id, self.log.max_offset,
                                          tuple(self.log.epochs.pairs()))))
            await writer.drain()
            reply = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
            if isinstance(reply, ErrorFrame):
                raise HaProtocolError(f"master refused the handshake: {reply.code}: {reply.message}")
            if not isinstance(reply, HandshakeReply):
                raise HaProtocolError(f"expected a handshake reply, got {type(reply).__name__}")
            known = max(self.master_epoch, self.log.epochs.last_epoch)
            if reply.master_epoch < known:
                raise HaProtocolError(f"{self.master_address} is master of epoch {reply.master_epoch}, "
                                      f"older than epoch {known} known here")
            self._repair(reply)
            # Within the stream, epochs never go back from what the repaired log already holds; a
            # lagging slave still takes older epochs' records beyond its max (the master's history).
            self._seen_epoch = self.log.epochs.last_epoch
            self.handshakes += 1
            if self.flush_sync:  # the first ack counts too: it must not cover bytes not yet on disk
                await self.log.flushed(self.log.max_offset)
            # Fences first, then the first ack, with no await in between: a fence made here after
            # this point goes out through notify_fenced on the same writer, so the master always
            # learns of a fence before it counts an ack that could cover a fenced ledger's record.
            for ledger_id in (self.fenced_ledgers() if self.fenced_ledgers is not None else ()):
                writer.write(encode(LedgerFenced(ledger_id)))
            writer.write(encode(Ack(self.log.max_offset)))
            self._writer = writer
            await writer.drain()
            self.connected = True
            log.info("%s streaming from offset %d", self._ctx, self.log.max_offset)
            acker = asyncio.ensure_future(self._ack_loop(writer))
            try:
                await self._receive(reader, writer)
            finally:
                await cancel_and_wait(acker)
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Prove the cluster secret to the master and check its proof, before anything else: a
        stranger answering on the master's address never gets to steer this log."""
        nonce = new_nonce()
        writer.write(encode(AuthHello(self.broker_set, self.broker_id, nonce)))
        await writer.drain()
        challenge = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if isinstance(challenge, ErrorFrame):
            raise HaProtocolError(f"master refused the connection: {challenge.code}: {challenge.message}")
        if not isinstance(challenge, AuthChallenge):
            raise HaProtocolError(f"expected the master's challenge, got {type(challenge).__name__}")
        if challenge.master_id != self.master_id:
            raise HaProtocolError(f"{self.master_address} answers as broker {challenge.master_id}, "
                                  f"not the master {self.master_id} the controller named")
        fields = (self.broker_set, self.master_id, self.broker_id, challenge.master_epoch, nonce, challenge.nonce)
        if not ha_auth.check_master(self.secret, challenge.proof, *fields):
            log.error("%s %s did not prove the cluster secret: not following it", self._ctx, self.master_address)
            raise HaProtocolError(f"{self.master_address} did not prove the cluster secret")
        writer.write(encode(AuthProof(ha_auth.slave_proof(self.secret, *fields))))

    def request_repair(self, offset: int, length: int) -> bool:
        """Ask the master for its copy of bytes found damaged here; False when not connected."""
        if self._writer is None or self._writer.is_closing() or (offset, length) in self._repairs:
            return False
        log.error("%s damaged bytes [%d, %d) in this replica's log: asking the master for its copy", self._ctx,
                  offset, offset + length)
        self._repairs.add((offset, length))
        self._writer.write(encode(RangeRequest(offset, length)))
        return True

    def _repair_range(self, frame: RangeData) -> None:
        self._repairs = {r for r in self._repairs if r[0] != frame.offset}
        try:
            self.log.repair_range(frame.offset, frame.data)
            self.repaired.append((frame.offset, frame.offset + len(frame.data)))
        except TidelogError as exc:  # the master's copy is no better, or the range moved: say so
            log.error("%s could not repair [%d, %d) with the master's copy: %s", self._ctx, frame.offset,
                      frame.offset + len(frame.data), exc)

    def notify_fenced(self, ledger_id: int) -> None:
        """Tell the master at once that this replica fenced `ledger_id` (before any later ack).

        Not connected: the next connection repeats every fence before its first ack."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode(LedgerFenced(ledger_id)))

    def _repair(self, reply: HandshakeReply) -> None:
        """Cut the local log back to the last point both histories agree on."""
        local = self.log.epochs.pairs()
        local_max = self.log.max_offset
        empty = local_max == self.log.min_offset
        if empty and not local:
            if local_max < reply.min_offset:
                raise OffsetMismatchError(f"this empty replica starts at {local_max}, below the master's "
                                          f"retention ({reply.min_offset}); seed it from a copy of the master")
            return
        point = last_consistent_point(local, local_max, list(reply.epochs), reply.max_offset)
        if point < 0:
            # No epoch in common: this log comes from a history the controller did not keep.
            point = self.log.min_offset
            log.error("%s no epoch in common with the master (local %s, master %s): discarding the local log "
                      "from %d", self._ctx, local, list(reply.epochs), point)
        confirm = self.log.confirm_offset
        if point < confirm and self.unclean_epoch <= (local[-1][0] if local else 0):
            # Below the confirm offset lies what every in-sync replica held; a master elected
            # cleanly (from the SyncStateSet) holds all of it, so a demand to cut there comes from a
            # history the controller did not choose. Refuse, keep the log, and keep retrying: the
            # controller may name another master, or declare the election unclean.
            self.refusals += 1
            log.error("%s refusing fork repair to %d: below this replica's confirm offset %d and the election "
                      "was not unclean (local epochs %s, master epochs %s)", self._ctx, point, confirm, local,
                      list(reply.epochs))
            raise HaProtocolError(f"master {self.master_id} demands a cut to {point}, below the confirm offset "
                                  f"{confirm}; refused")
        if point < local_max:
            log.warning("%s fork repair: truncating from %d to %d (local epochs %s, master epochs %s)",
                        self._ctx, local_max, point, local, list(reply.epochs))
            self.log.truncate(point)
            self.truncations.append((local_max, point))

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            frame = await within(read_frame(reader), self.idle_timeout)
            if isinstance(frame, ErrorFrame):
                raise HaProtocolError(f"master says {frame.code}: {frame.message}")
            if isinstance(frame, RangeData):
                self._repair_range(frame)
                continue
            if not isinstance(frame, Transfer):
                raise HaProtocolError(f"unexpected {type(frame).__name__} from the master")
            if frame.epoch < self._seen_epoch:
                raise HaProtocolError(f"data of epoch {frame.epoch} after epoch {self._seen_epoch}: "
                                      "refusing a deposed master")
            if frame.offset != self.log.max_offset:
                raise OffsetMismatchError(f"transfer at {frame.offset}, local max is {self.log.max_offset}; "
                                          "re-handshaking")
            if frame.data:
                if frame.epoch > self.log.epochs.last_epoch:
                    self.log.epochs.append(frame.epoch, frame.epoch_start)
                self.log.append_raw(frame.offset, frame.data)
                if self.flush_sync:
                    await self.log.flushed(self.log.max_offset)
                writer.write(encode(Ack(self.log.max_offset)))
            self._seen_epoch = max(self._seen_epoch, frame.epoch)
            confirm = min(frame.confirm_offset, self.log.max_offset)
            if confirm > self.log.confirm_offset:
                self.log.confirm_offset = confirm
            if self.on_progress is not None:
                self.on_progress()
            await writer.drain()

    async def _ack_loop(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self.ack_interval)
            # Under flush: sync an ack promises the bytes are on this replica's disk.
            writer.write(encode(Ack(self.log.flushed_offset if self.flush_sync else self.log.max_offset)))
            await writer.drain()
