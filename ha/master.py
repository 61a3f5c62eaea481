"""The master side of replication: stream the commit log to slaves, count their acks.

Theory of operation
-------------------
A slave connects, sends a Handshake (its id, epoch map, max offset); the master answers with its
own epoch map; the slave repairs its log and sends an Ack with the offset it wants data from.
From then on the master streams Transfer frames from that offset: raw commit-log bytes in large
chunks, each tagged with the epoch that wrote it, never crossing an epoch boundary, carrying the
master's confirm offset. An empty Transfer is a heartbeat. The slave acks its max offset after
each write.

The decisions are not made here: `ha.ackpolicy` says how many acks a write needs and what the
confirm offset is; `ha.syncstate` says when to propose a SyncStateSet change. This module only
moves bytes, records acks and calls them. Acks count only for SyncStateSet members (the union
with a pending proposal), since only they may be elected without losing data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidelog.clusterauth import new_nonce
from tidelog.commitlog import CommitLog
from tidelog.commitlog.epochs import OPEN_END
from tidelog.commitlog.waiters import OffsetWaiters
from tidelog.errors import (
    FlushSlaveTimeoutError,
    HaProtocolError,
    NotMasterError,
    TidelogError,
    UnavailableError,
)
from tidelog.ha import ackpolicy
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
    encode,
    encode_transfer_header,
    read_frame,
)
from tidelog.ha.syncstate import Proposal, SyncStateTracker
from tidelog.invariants import require
from tidelog.tasks import cancel_and_wait, within

log = logging.getLogger(__name__)

# The largest range a slave may ask to have sent again (one record at most: a record never
# exceeds max_message_bytes, whose default is 4 MiB).
MAX_REPAIR_BYTES = 16 << 20


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class SlaveConnection:
    broker_id: int
    peer: str
    ack_offset: int = -1
    send_offset: int = 0
    sent_end: int = 0  # end of the bytes written to this connection: no ack may pass it
    last_sent_master_max: int = 0
    last_sent_ms: int = 0
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)


class HaMaster:
    """Replication state of one broker while it is master of `epoch`."""

    def __init__(self, commitlog: CommitLog, *, broker_set: str, broker_id: int, epoch: int,
                 sync_state_set: frozenset[int], sss_epoch: int, slave_timeout_ms: int = 3000,
                 max_not_catchup_ms: int = 15000, batch_bytes: int = 1 << 20,
                 heartbeat_interval_ms: int = 1000, idle_timeout_ms: int = 5000,
                 propose: Callable[[Proposal], Awaitable[None]] | None = None,
                 on_confirm: Callable[[int], None] | None = None,
                 on_ledger_fenced: Callable[[int], None] | None = None, secret: str = "") -> None:
        self.log = commitlog
        self.secret = secret
        self.broker_set = broker_set
        self.broker_id = broker_id
        self.epoch = epoch
        self.slave_timeout = slave_timeout_ms / 1000.0
        self.batch_bytes = batch_bytes
        self.heartbeat_interval = heartbeat_interval_ms / 1000.0
        self.idle_timeout = idle_timeout_ms / 1000.0
        # A master is always in its SyncStateSet (the controller makes it so at election); one
        # handed a set without it has a role from somewhere else and must not stream.
        require(broker_id in sync_state_set, f"[{broker_set}/{broker_id}] master of epoch {epoch} is not in its "
                                             f"SyncStateSet {sorted(sync_state_set)}")
        self.tracker = SyncStateTracker(broker_id, frozenset(sync_state_set), sss_epoch,
                                        max_not_catchup_ms=max_not_catchup_ms, now_ms=now_ms())
        self.connections: dict[int, SlaveConnection] = {}
        self._propose = propose
        self._on_confirm = on_confirm
        self._on_ledger_fenced = on_ledger_fenced
        self._waiters: dict[int, OffsetWaiters] = {}
        self._new_data = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._ctx = f"[{broker_set}/{broker_id} master epoch {epoch}]"
        self.update_confirm()

    # ------------------------------------------------------------------ state

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The set the confirm offset waits for: confirmed, plus a pending change (conservative)."""
        return self.tracker.effective

    @property
    def ack_set(self) -> frozenset[int]:
        """The members whose acks count toward a write: only the controller-confirmed set.

        A member of a pending expansion is not electable yet; a write it acknowledged could be
        lost if the controller never applies the expansion and elects someone else.
        """
        return self.tracker.local

    def acks(self) -> dict[int, int]:
        return {c.broker_id: c.ack_offset for c in self.connections.values() if c.ack_offset >= 0}

    def update_confirm(self) -> None:
        """Recompute the confirm offset and release producers whose acks are in."""
        master_max = self.log.max_offset
        acks = self.acks()
        sss = self.tracker.effective
        new = ackpolicy.confirm_offset(self.broker_id, master_max, acks, set(self.connections), sss,
                                       self.log.confirm_offset)
        require(new <= master_max, f"{self._ctx} confirm {new} would pass max {master_max}")
        if new != self.log.confirm_offset:
            self.log.confirm_offset = new
            if self._on_confirm is not None:
                self._on_confirm(new)
            # Slaves learn the confirm offset from frames; wake the senders so readers of a slave
            # see an acknowledged write within a round trip, not a heartbeat interval later.
            self._wake_senders()
        voters = self.tracker.local
        for needed, waiters in self._waiters.items():
            waiters.release(ackpolicy.acked_by(needed, self.broker_id, master_max, acks, voters))

    def on_appended(self) -> None:
        """The owner appended records: wake the senders, move the confirm offset."""
        self._wake_senders()
        self.update_confirm()

    def _wake_senders(self) -> None:
        ev, self._new_data = self._new_data, asyncio.Event()
        ev.set()

    def on_controller_state(self, sync_state_set: frozenset[int], sss_epoch: int) -> None:
        self.tracker.on_controller_state(frozenset(sync_state_set), sss_epoch)
        self.update_confirm()

    async def wait_acks(self, end_offset: int, needed: int) -> None:
        """Wait until `needed` SyncStateSet members (the master included) hold `end_offset`."""
        if self._closed:
            raise NotMasterError(f"broker {self.broker_id} stopped being master of epoch {self.epoch} before "
                                 "the replicas acknowledged; the message may or may not survive")
        if needed <= 1:
            return
        if ackpolicy.acked_by(needed, self.broker_id, self.log.max_offset, self.acks(),
                              self.tracker.local) >= end_offset:
            return
        waiters = self._waiters.get(needed)
        if waiters is None:
            waiters = self._waiters[needed] = OffsetWaiters()
        try:
            # Registered at once, timeout inside: an ack handled before a wait_for task would
            # first run must not be missed (it would wait for the next heartbeat's release).
            await waiters.wait(end_offset, self.slave_timeout)
        except TimeoutError:
            raise FlushSlaveTimeoutError(
                f"{needed} in-sync replicas did not acknowledge offset {end_offset} within "
                f"{self.slave_timeout:.1f}s; the message is stored on the master and may still replicate"
            ) from None

    # ------------------------------------------------------------------ SyncStateSet upkeep

    def _maybe_propose(self, proposal: Proposal | None) -> None:
        if proposal is None or self._propose is None:
            return
        log.info("%s proposes SyncStateSet %s (set epoch %d)", self._ctx, sorted(proposal.new_sync_state_set),
                 proposal.sss_epoch)
        self._spawn(self._run_proposal(proposal))

    async def _run_proposal(self, proposal: Proposal) -> None:
        if self._propose is None:
            return
        epoch_before = self.tracker.sss_epoch
        try:
            await self._propose(proposal)
        except (UnavailableError, TimeoutError) as exc:
            # Unknown outcome: the controller may still apply it. Keep counting the union until a
            # newer set arrives; if none does within a few heartbeats, the change was not made.
            log.warning("%s SyncStateSet change %s: no answer (%s); waiting for the controller's state",
                        self._ctx, sorted(proposal.new_sync_state_set), exc)
            await asyncio.sleep(3 * self.heartbeat_interval)
            if self.tracker.sss_epoch == epoch_before and self.tracker.pending == proposal:
                self.tracker.on_alter_failed()
        except Exception as exc:  # refused: the next check proposes again
            log.warning("%s SyncStateSet change %s refused: %s", self._ctx, sorted(proposal.new_sync_state_set), exc)
            self.tracker.on_alter_failed()
        self.update_confirm()

    def check_shrink(self) -> None:
        self._maybe_propose(self.tracker.check_shrink(now_ms=now_ms()))

    # ------------------------------------------------------------------ connections

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: AuthHello) -> None:
        """Run one slave connection whose AuthHello was already read: prove the cluster secret to
        the slave, check its proof, read its Handshake, then `serve`. Nothing of the log is sent
        before the slave's proof checks out; every frame read here is small (MAX_AUTH_FRAME)."""
        peer = writer.get_extra_info("peername")
        if hello.broker_set != self.broker_set or hello.broker_id == self.broker_id:
            await _send_error(writer, "HA_PROTOCOL", f"this is broker {self.broker_id} of {self.broker_set}, not "
                                                     f"a master for {hello.broker_set}/{hello.broker_id}")
            return
        nonce = new_nonce()
        fields = (self.broker_set, self.broker_id, hello.broker_id, self.epoch, hello.nonce, nonce)
        writer.write(encode(AuthChallenge(self.broker_id, self.epoch, nonce, ha_auth.master_proof(self.secret, *fields))))
        await writer.drain()
        proof = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(proof, AuthProof) or not ha_auth.check_slave(self.secret, proof.proof, *fields):
            log.warning("%s HA connection from %s claiming broker %d did not prove the cluster secret; closing",
                        self._ctx, peer, hello.broker_id)
            await _send_error(writer, "UNAUTHENTICATED", "the cluster secret was not proven")
            return
        first = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(first, Handshake) or (first.broker_set, first.broker_id) != (hello.broker_set,
                                                                                       hello.broker_id):
            raise HaProtocolError("the handshake does not match the identity the slave proved")
        await self.serve(reader, writer, first)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: Handshake) -> None:
        """Run one authenticated slave connection whose Handshake was already read."""
        peer = str(writer.get_extra_info("peername"))
        if first.broker_set != self.broker_set:
            await _send_error(writer, "HA_PROTOCOL", f"this is broker set {self.broker_set}, not {first.broker_set}")
            return
        slave_id = first.broker_id
        log.info("%s slave %d connected from %s (its max offset %d)", self._ctx, slave_id, peer, first.max_offset)
        writer.write(encode(HandshakeReply(self.broker_id, self.epoch, self.log.max_offset, self.log.min_offset,
                                           tuple(self.log.epochs.pairs()))))
        await writer.drain()
        start = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        while isinstance(start, LedgerFenced):  # the slave's fences come before its first ack
            self._ledger_fenced(slave_id, start.ledger_id)
            start = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(start, Ack):
            raise HaProtocolError(f"expected the slave's start offset, got {type(start).__name__}")
        if start.max_offset > self.log.max_offset or start.max_offset < self.log.min_offset:
            await _send_error(writer, "OFFSET_MISMATCH",
                              f"cannot stream from {start.max_offset}: this log holds "
                              f"[{self.log.min_offset}, {self.log.max_offset})")
            return
        old = self.connections.get(slave_id)
        if old is not None and old.writer is not None:
            old.writer.close()
        conn = SlaveConnection(slave_id, peer, ack_offset=start.max_offset, send_offset=start.max_offset,
                               sent_end=start.max_offset, writer=writer)
        self.connections[slave_id] = conn
        self._on_ack(conn, start.max_offset)
        sender = asyncio.ensure_future(self._send_loop(conn, writer))
        try:
            while not self._closed:
                # a slave sends only small frames (acks, fences, errors)
                frame = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
                if isinstance(frame, Ack):
                    self._on_ack(conn, frame.max_offset)
                elif isinstance(frame, LedgerFenced):
                    self._ledger_fenced(slave_id, frame.ledger_id)
                elif isinstance(frame, RangeRequest):
                    self._send_range(conn, writer, frame)
                elif isinstance(frame, ErrorFrame):
                    log.warning("%s slave %d reports %s: %s", self._ctx, slave_id, frame.code, frame.message)
                    return
                else:
                    raise HaProtocolError(f"unexpected {type(frame).__name__} from slave {slave_id}")
        finally:
            await cancel_and_wait(sender)
            if self.connections.get(slave_id) is conn:
                del self.connections[slave_id]
                log.info("%s slave %d disconnected (acked %d)", self._ctx, slave_id, conn.ack_offset)
                if not self._closed:
                    self._maybe_propose(self.tracker.on_disconnect(slave_id, now_ms=now_ms()))
                    self.update_confirm()

    def _send_range(self, conn: SlaveConnection, writer: asyncio.StreamWriter, req: RangeRequest) -> None:
        """A slave found bytes of its log damaged: send it this log's copy of that range.

        Only confirmed bytes (identical on every in-sync replica) and at most MAX_REPAIR_BYTES; one
        write, so the frame never interleaves with the sender's transfers."""
        end = req.offset + req.length
        if req.offset < self.log.min_offset or end > self.log.confirm_offset or req.length > MAX_REPAIR_BYTES:
            raise HaProtocolError(f"slave {conn.broker_id} asked for [{req.offset}, {end}): outside "
                                  f"[{self.log.min_offset}, confirm {self.log.confirm_offset}) or too long")
        data, _ = self.log.read_raw_chunk(req.offset, req.length)
        log.warning("%s slave %d reports damaged bytes [%d, %d): sending this log's copy", self._ctx,
                    conn.broker_id, req.offset, end)
        writer.write(encode(RangeData(req.offset, data)))

    def _ledger_fenced(self, slave_id: int, ledger_id: int) -> None:
        # Synchronous on purpose: the fence must take effect before the slave's next ack is
        # counted, and frames of one connection are handled in order.
        log.info("%s slave %d fenced ledger %d", self._ctx, slave_id, ledger_id)
        if self._on_ledger_fenced is not None:
            self._on_ledger_fenced(ledger_id)

    def _on_ack(self, conn: SlaveConnection, offset: int) -> None:
        if offset > conn.sent_end:
            # Only what this connection carried can be held because of it: a higher ack is a
            # confused or hostile peer, and counting it could acknowledge writes no replica holds.
            raise HaProtocolError(f"slave {conn.broker_id} acked {offset}, beyond the {conn.sent_end} sent to it "
                                  f"(this log's max {self.log.max_offset})")
        conn.ack_offset = max(conn.ack_offset, offset)
        entry = self.log.epochs.find(max(self.log.max_offset - 1, 0))
        epoch_start = entry.start if entry is not None and entry.epoch == self.epoch else self.log.max_offset
        proposal = self.tracker.on_ack(conn.broker_id, conn.ack_offset, now_ms=now_ms(),
                                       master_max=self.log.max_offset,
                                       last_sent_master_max=conn.last_sent_master_max,
                                       last_sent_ms=conn.last_sent_ms,
                                       confirm_offset=self.log.confirm_offset, epoch_start=epoch_start)
        self.update_confirm()
        self._maybe_propose(proposal)

    async def _send_loop(self, conn: SlaveConnection, writer: asyncio.StreamWriter) -> None:
        offset = conn.send_offset
        while not self._closed:
            event = self._new_data
            if offset < self.log.max_offset:
                entry = self.log.epochs.find(offset)
                epoch, epoch_start, epoch_end = (entry.epoch, entry.start, entry.end) if entry else (0, 0, OPEN_END)
                limit = self.batch_bytes if epoch_end == OPEN_END else min(self.batch_bytes, epoch_end - offset)
                data, nxt = self.log.read_raw_chunk(offset, limit)
                conn.last_sent_master_max = self.log.max_offset
                conn.last_sent_ms = now_ms()
                conn.sent_end = nxt  # before the write: the slave may ack before drain() returns
                # one write, so header and data leave in one send
                writer.writelines((encode_transfer_header(offset, epoch, epoch_start, self.log.confirm_offset,
                                                          len(data)), data))
                await writer.drain()
                offset = conn.send_offset = nxt
                continue
            # A heartbeat speaks for the current term, even before its first record: tagging it
            # with the epoch of the last byte would look like a deposed master to the slave.
            pairs = self.log.epochs.pairs()
            epoch, epoch_start = pairs[-1] if pairs else (self.epoch, 0)
            conn.last_sent_master_max = self.log.max_offset
            conn.last_sent_ms = now_ms()
            writer.write(encode_transfer_header(offset, epoch, epoch_start, self.log.confirm_offset, 0))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await within(event.wait(), self.heartbeat_interval)

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, why: TidelogError | None = None) -> None:
        """Stop being master: drop slaves, fail waiting producers (their outcome is unknown)."""
        self._closed = True
        err = why or NotMasterError("this broker stopped being master while the write waited for "
                                    "replicas; the message may or may not survive")
        for waiters in self._waiters.values():
            waiters.fail_all(err)
        for conn in list(self.connections.values()):
            if conn.writer is not None:
                conn.writer.close()
        for task in list(self._tasks):
            task.cancel()
        ev, self._new_data = self._new_data, asyncio.Event()
        ev.set()


async def _send_error(writer: asyncio.StreamWriter, code: str, message: str) -> None:
    writer.write(encode(ErrorFrame(code, message)))
    with contextlib.suppress(ConnectionError):
        await writer.drain()
