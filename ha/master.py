"""The master side of replication: stream the commit log to slaves, count their acks.

Theory of operation
-------------------
A slave connects, sends a Handshake (its id, epoch map, max offset); the master answers with its
own epoch map; the slave repairs its log and sends an Ack with the offset it wants data from.
From then on the master streams Transfer frames from that offset: raw commit-log bytes in large
chunks, each tagged with the epoch that wrote it, never crossing an epoch boundary, carrying the
master's confirm offset. An empty Transfer is a heartbeat. The slave acks its max offset after
each write.

The decisions are not made here: every event (an append, a slave joining or leaving, bytes sent,
an ack, the controller's SyncStateSet, a failed proposal, a producer starting to wait) goes to
`ha.mastercore.MasterCore.step`, and this module carries out the actions it returns (store the
confirm offset and wake readers, release producers, propose a SyncStateSet change, close a slave
that broke the protocol). This module only moves bytes and runs the handshake.

It also owns the HA port's connection slots (`HaSlots`): connections that have not proven the
cluster secret are few, displaceable and short-lived, so that strangers cannot lock slaves out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidelog.clusterauth import new_nonce
from tidelog.commitlog import CommitLog
from tidelog.commitlog.epochs import OPEN_END
from tidelog.commitlog.reads import RawSpan
from tidelog.commitlog.waiters import OffsetWaiters
from tidelog.errors import (
    ControllerAlterSyncStateSetFailedError,
    ControllerFencedMasterEpochError,
    ControllerFencedSyncStateSetEpochError,
    ControllerInvalidMasterError,
    FlushSlaveTimeoutError,
    HaProtocolError,
    NotMasterError,
    TidelogError,
    UnavailableError,
)
from tidelog.ha import auth as ha_auth
from tidelog.ha.ackpolicy import EVERY_MEMBER
from tidelog.ha.mastercore import (
    Acked,
    AlterFailed,
    Appended,
    ControllerState,
    Event,
    Flushed,
    MasterCore,
    Propose,
    Reject,
    Release,
    Sent,
    SetConfirm,
    ShrinkCheck,
    SlaveJoined,
    SlaveLeft,
    Waiting,
)
from tidelog.ha.protocol import (
    MAX_AUTH_FRAME,
    MAX_RANGE_FRAME,
    MAX_REPAIR_BYTES,
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
from tidelog.invariants import InvariantViolation, stop_if_violated
from tidelog.tasks import cancel_and_wait, within

log = logging.getLogger(__name__)

#: A range asked of a slave that has not come is asked again (of it or another) after this long.
REPAIR_RETRY_S = 10.0


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Asked:
    """A damaged range of the master's log asked of a slave."""

    length: int
    slave_id: int
    at: float  # time.monotonic() when asked
    answered: bool = False  # the slave answered that it has no copy


@dataclass
class SlaveConnection:
    """One slave's socket and the offset its sender has reached (its counted state is in the core)."""

    broker_id: int
    peer: str
    send_offset: int = 0
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)
    # the sender waits for new data with nothing of its own unwritten: an append may send inline
    parked: bool = False
    # the socket, when its transport is plain TCP: chunks go from the page cache to it with
    # os.sendfile (TLS must encrypt them in this process, so they are read and written)
    socket_fd: int | None = None


def plain_socket_fd(writer: asyncio.StreamWriter) -> int | None:
    """The socket under a connection that is plain TCP, None under TLS."""
    if writer.get_extra_info("ssl_object") is not None or writer.get_extra_info("sslcontext") is not None:
        return None
    sock = writer.get_extra_info("socket")
    return None if sock is None else int(sock.fileno())


class HaSlot:
    """One HA connection's place in `HaSlots`: unproven until `proven`, then counted apart."""

    __slots__ = ("heard", "owner", "timer", "transport")

    def __init__(self, owner: HaSlots, transport: asyncio.WriteTransport, timer: asyncio.TimerHandle) -> None:
        self.owner = owner
        self.timer: asyncio.TimerHandle | None = timer  # the handshake deadline, until proven
        self.transport = transport
        self.heard = False  # the peer has sent its hello: it is trying, not idle

    def hello(self) -> None:
        """The peer's first frame arrived: a silent stranger is evicted before this one."""
        self.heard = True

    def proven(self) -> bool:
        """The peer proved the cluster secret: the handshake deadline no longer applies and the
        slot leaves the unproven ones. False (the caller closes the connection) when
        `max_proven` proven connections are open already."""
        return self.owner.prove(self)

    def release(self) -> None:
        """The connection ended (idempotent)."""
        self.owner.release(self)

    @property
    def is_proven(self) -> bool:
        """Whether the peer proved the cluster secret (and the connection is still counted)."""
        return self in self.owner.proven


class HaSlots:
    """The HA port's connection slots, so that strangers cannot lock the real slaves out.

    Connections that have not yet proven the cluster secret are at most `max_unproven`, each
    closed when it has not proven it `handshake_timeout` seconds after it opened. One beyond that
    does not wait or get refused: it takes the slot of the oldest unproven connection that has
    sent nothing yet (else the oldest unproven one), which is closed. Idle strangers, however many,
    thus cost at most `max_unproven` sockets for at most the handshake deadline, and a real slave,
    which sends its hello at once and proves within a round trip, gets in while they are connected:
    to keep it out a peer must open more than `max_unproven` connections, each sending a hello,
    within each of the slave's handshakes. Proven connections are counted apart (at most
    `max_proven`), so no flood of strangers closes a slave that is replicating.
    """

    def __init__(self, max_unproven: int, max_proven: int, handshake_timeout: float) -> None:
        self.max_unproven = max_unproven
        self.max_proven = max_proven
        self.handshake_timeout = handshake_timeout
        self.unproven: dict[HaSlot, None] = {}  # oldest first
        self.proven: set[HaSlot] = set()
        self.evicted = 0  # unproven connections closed to make room, for logs and tests

    def admit(self, transport: asyncio.WriteTransport) -> HaSlot:
        """A slot for a new connection, closing the connection it displaces if the unproven ones
        are full; the new connection is closed (aborted) at its handshake deadline unless proven."""
        if len(self.unproven) >= self.max_unproven:
            victim = next((v for v in self.unproven if not v.heard), None) or next(iter(self.unproven))
            self.evicted += 1
            victim.release()
            victim.transport.abort()  # its task ends on the reset
        timer = asyncio.get_running_loop().call_later(self.handshake_timeout, transport.abort)
        slot = HaSlot(self, transport, timer)
        self.unproven[slot] = None
        return slot

    def prove(self, slot: HaSlot) -> bool:
        """See `HaSlot.proven`."""
        self._stop_timer(slot)
        if slot not in self.unproven:
            return False  # evicted (or released) meanwhile
        del self.unproven[slot]
        if len(self.proven) >= self.max_proven:
            return False
        self.proven.add(slot)
        return True

    def release(self, slot: HaSlot) -> None:
        """See `HaSlot.release`."""
        self._stop_timer(slot)
        self.unproven.pop(slot, None)
        self.proven.discard(slot)

    @staticmethod
    def _stop_timer(slot: HaSlot) -> None:
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None


class HaMaster:
    """Replication of one broker while it is master of `epoch`: the I/O around `MasterCore`."""

    def __init__(
        self,
        commitlog: CommitLog,
        *,
        broker_set: str,
        broker_id: int,
        epoch: int,
        sync_state_set: frozenset[int],
        sss_epoch: int,
        slave_timeout_ms: int = 3000,
        max_not_catchup_ms: int = 15000,
        batch_bytes: int = 1 << 20,
        zero_copy: bool = True,
        heartbeat_interval_ms: int = 1000,
        idle_timeout_ms: int = 5000,
        propose: Callable[[Proposal, int], Awaitable[None]] | None = None,
        on_confirm: Callable[[int], None] | None = None,
        on_ledger_fenced: Callable[[int], None] | None = None,
        secret: str = "",
    ) -> None:
        self.log = commitlog
        self.secret = secret
        self.broker_set = broker_set
        self.broker_id = broker_id
        self.epoch = epoch
        self.slave_timeout = slave_timeout_ms / 1000.0
        self.batch_bytes = batch_bytes
        self.heartbeat_interval = heartbeat_interval_ms / 1000.0
        self.idle_timeout = idle_timeout_ms / 1000.0
        self._ctx = f"[{broker_set}/{broker_id} master epoch {epoch}]"
        try:
            self.core = MasterCore.start(
                broker_id=broker_id,
                epoch=epoch,
                sync_state_set=frozenset(sync_state_set),
                sss_epoch=sss_epoch,
                master_max=commitlog.max_offset,
                confirm=commitlog.confirm_offset,
                epoch_start=_epoch_start(commitlog, epoch),
                max_not_catchup_ms=max_not_catchup_ms,
                now_ms=now_ms(),
                # flush: sync: only what is on this disk counts toward the confirm offset
                durable=commitlog.flushed_offset if commitlog.flush_mode == "sync" else None,
            )
        except InvariantViolation as exc:
            raise InvariantViolation(f"{self._ctx} {exc}") from None
        self.connections: dict[int, SlaveConnection] = {}
        # damaged ranges of this log asked of a slave: offset -> (length, slave id, when asked)
        self._asked: dict[int, _Asked] = {}
        self.repaired: list[tuple[int, int]] = []  # ranges rewritten from a slave's copy
        # slave -> its last ack when its connection ended: how far behind a slave that is gone is
        # (the replication-lag metrics); a reconnected slave's own ack supersedes it
        self.departed_acks: dict[int, int] = {}
        self._propose = propose
        # Each AlterSyncStateSet attempt is numbered, increasing within this epoch, so that the
        # controller refuses a late copy of an attempt older than one it answered (RULES.md A4b).
        # From the wall clock: a master that resumes its epoch after a clean restart numbers on
        # past its previous run's attempts.
        self._attempt = time.time_ns() // 1_000_000
        self._on_confirm = on_confirm
        self._on_ledger_fenced = on_ledger_fenced
        self._waiters: dict[int, OffsetWaiters] = {}
        self._new_data = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._flush_listener: Callable[[float, int], None] | None = None
        if self.core.durable is not None:
            loop = asyncio.get_running_loop()

            def flushed(_seconds: float, _nbytes: int) -> None:  # on the flusher thread
                loop.call_soon_threadsafe(self._on_flushed)

            self._flush_listener = flushed
            commitlog.flush_listeners.append(flushed)
        # Transfers to plain-TCP slaves go with os.sendfile (`_send_span`); bytes sent each way.
        self.zero_copy = zero_copy
        self.sent_zero_copy = 0
        self.sent_copied = 0

    # ------------------------------------------------------------------ state

    @property
    def tracker(self) -> SyncStateTracker:
        return self.core.tracker

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The set the confirm offset waits for: confirmed, plus a pending change (conservative)."""
        return self.core.tracker.effective

    @property
    def ack_set(self) -> frozenset[int]:
        """The members whose acks count toward a write: only the controller-confirmed set."""
        return self.core.tracker.local

    @property
    def write_set_size(self) -> int:
        """How many members a write is sized for (`ackpolicy.required_acks`): the effective set,
        a pending expansion included. A member being added is elected as soon as the controller
        applies the change, so a write acknowledged meanwhile must be one it holds: sized for the
        larger set but counted over the confirmed one, the write waits until the controller's
        answer makes the new member's ack count, and that ack covers it. Sized for the confirmed
        set alone, it was acknowledged by the master alone and lost when the new member, elected
        before it had copied the write, took over (the dr-rehearsal drill found this)."""
        return len(self.core.tracker.effective)

    def acks(self) -> dict[int, int]:
        return self.core.acks()

    def _step(self, event: Event) -> None:
        """Feed one event to the core and carry out what it decides."""
        confirmed = False
        for action in self.core.step(event, now_ms()):
            match action:
                case SetConfirm(offset):
                    self.log.confirm_offset = offset
                    confirmed = True
                case Release(needed, offset):
                    waiters = self._waiters.get(needed)
                    if waiters is not None:
                        waiters.release(offset)
                case Propose(proposal):
                    self._spawn_proposal(proposal)
                case Reject(_, reason):
                    raise HaProtocolError(reason)
        if confirmed:
            # After the releases: the writers they wake answer their clients first; the long
            # polls and the senders run next. Slaves learn the confirm offset from frames, so the
            # senders are woken for readers of a slave to see an acknowledged write within a
            # round trip, not a heartbeat later.
            if self._on_confirm is not None:
                self._on_confirm(self.log.confirm_offset)
            self._wake_senders()

    def on_appended(self) -> None:
        """The owner appended records: send them, move the confirm offset.

        A slave's sender that waits for data with its socket's buffer empty gets the records
        written here, in the appending task: waking the sender would cost the write a turn of
        the event loop, which is a share of every acknowledgement's latency. A sender that is
        busy (writing, or its slave not taking bytes) is woken and sends them itself."""
        self._step(Appended(self.log.max_offset))
        for conn in self.connections.values():
            writer = conn.writer
            if (
                conn.parked
                and writer is not None
                and not writer.is_closing()
                and writer.transport.get_write_buffer_size() == 0
            ):
                try:
                    conn.send_offset = self._send_chunk(conn, writer, conn.send_offset)
                except Exception as exc:  # the sender meets it again, and ends its connection
                    stop_if_violated(exc)
        # Busy senders, and appends longer than a chunk, are left to the senders. (A sender woken
        # with nothing left to send writes a heartbeat: none is woken needlessly.)
        end = self.log.max_offset
        if any(conn.send_offset < end for conn in self.connections.values()):
            self._wake_senders()

    def _on_flushed(self) -> None:
        if not self._closed:
            self._step(Flushed(self.log.flushed_offset))

    def _wake_senders(self) -> None:
        ev, self._new_data = self._new_data, asyncio.Event()
        ev.set()

    def on_controller_state(self, sync_state_set: frozenset[int], sss_epoch: int) -> None:
        self._step(ControllerState(frozenset(sync_state_set), sss_epoch))

    async def wait_acks(self, end_offset: int, needed: int) -> None:
        """Wait until `needed` SyncStateSet members (the master included) hold `end_offset`."""
        if self._closed:
            raise NotMasterError(
                f"broker {self.broker_id} stopped being master of epoch {self.epoch} before "
                "the replicas acknowledged; the message may or may not survive"
            )
        # No shortcut for needed == 1: a member may have joined (pending) since the write was sized,
        # and then it must hold the write too (MasterCore.acked_by).
        if self.core.acked_by(needed) >= end_offset:
            return
        waiters = self._waiters.get(needed)
        if waiters is None:
            waiters = self._waiters[needed] = OffsetWaiters()
            self._step(Waiting(needed))
        try:
            # Registered at once, timeout inside: an ack handled before a wait_for task would
            # first run must not be missed (it would wait for the next heartbeat's release).
            await waiters.wait(end_offset, self.slave_timeout)
        except TimeoutError:
            who = "every in-sync replica" if needed == EVERY_MEMBER else f"{needed} in-sync replicas"
            raise FlushSlaveTimeoutError(
                f"{who} did not acknowledge offset {end_offset} within "
                f"{self.slave_timeout:.1f}s; the message is stored on the master and may still replicate"
            ) from None

    # ------------------------------------------------------------------ SyncStateSet upkeep

    def _spawn_proposal(self, proposal: Proposal) -> None:
        if self._propose is None:
            return
        log.info(
            "%s proposes SyncStateSet %s (set epoch %d)",
            self._ctx,
            sorted(proposal.new_sync_state_set),
            proposal.sss_epoch,
        )
        self._spawn(self._run_proposal(proposal))

    async def _run_proposal(self, proposal: Proposal) -> None:
        """Ask the controller for `proposal` until it answers; the proposal stays pending (counted in
        the effective set) until the answer, or a newer set, ends it.

        No answer is no refusal: the controller may still apply the change, and the member it adds
        is then electable. A master that gave the proposal up after a timeout would stop counting
        that member's acks, and, acknowledging without a lease (docs/ARCHITECTURE.md §3.5), lose
        writes the new member lacks if it is elected. So it asks again until it hears."""
        if self._propose is None:
            return
        epoch_before = self.core.tracker.sss_epoch
        retried = False
        while not self._closed:
            self._attempt += 1
            try:
                await self._propose(proposal, self._attempt)
                return
            except (UnavailableError, TimeoutError) as exc:
                log.warning(
                    "%s SyncStateSet change %s: no answer (%s); it stays counted, asking again",
                    self._ctx,
                    sorted(proposal.new_sync_state_set),
                    exc,
                )
            except (
                ControllerFencedMasterEpochError,
                ControllerFencedSyncStateSetEpochError,
                ControllerInvalidMasterError,
            ) as exc:
                # The controller's state moved on (a newer set or master): the heartbeat that brings
                # it ends the proposal, or this broker's role; until then it stays counted.
                log.warning(
                    "%s SyncStateSet change %s overtaken: %s",
                    self._ctx,
                    sorted(proposal.new_sync_state_set),
                    exc,
                )
                return
            except Exception as exc:  # refused: the next check proposes again
                if retried and isinstance(exc, ControllerAlterSyncStateSetFailedError):
                    # A repeat of a change that an unanswered first attempt already made reads as
                    # "the set is already this one": the newer set arrives with the next heartbeat.
                    return
                log.warning(
                    "%s SyncStateSet change %s refused: %s",
                    self._ctx,
                    sorted(proposal.new_sync_state_set),
                    exc,
                )
                if not self._closed:
                    self._step(AlterFailed(proposal, epoch_before))
                return
            await asyncio.sleep(3 * self.heartbeat_interval)
            tracker = self.core.tracker
            if tracker.pending != proposal or tracker.sss_epoch != epoch_before:
                return  # a newer set arrived meanwhile and ended it
            retried = True

    def check_shrink(self) -> None:
        self._step(ShrinkCheck())

    # ------------------------------------------------------------------ connections

    async def accept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: AuthHello,
        slot: HaSlot | None = None,
    ) -> None:
        """Run one slave connection whose AuthHello was already read: prove the cluster secret to
        the slave, check its proof, read its Handshake, then `serve`. Nothing of the log is sent
        before the slave's proof checks out; every frame read here is small (MAX_AUTH_FRAME).
        `slot`, the connection's place on the HA port (`HaSlots`), is marked proven once the
        proof checks out."""
        peer = writer.get_extra_info("peername")
        if hello.broker_set != self.broker_set or hello.broker_id == self.broker_id:
            await _send_error(
                writer,
                "HA_PROTOCOL",
                f"this is broker {self.broker_id} of {self.broker_set}, not "
                f"a master for {hello.broker_set}/{hello.broker_id}",
            )
            return
        nonce = new_nonce()
        fields = (self.broker_set, self.broker_id, hello.broker_id, self.epoch, hello.nonce, nonce)
        writer.write(
            encode(
                AuthChallenge(self.broker_id, self.epoch, nonce, ha_auth.master_proof(self.secret, *fields))
            )
        )
        await writer.drain()
        proof = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(proof, AuthProof) or not ha_auth.check_slave(self.secret, proof.proof, *fields):
            await _send_error(writer, "UNAUTHENTICATED", "the cluster secret was not proven")
            # the caller logs it, rate-limited per peer: strangers may send many
            raise HaProtocolError(
                f"{self._ctx} HA connection claiming broker {hello.broker_id} did not prove the cluster secret"
            )
        if slot is not None and not slot.proven():
            log.warning(
                "%s HA connection from %s (broker %d) closed: %d proven HA connections are open already",
                self._ctx,
                peer,
                hello.broker_id,
                len(slot.owner.proven),
            )
            return
        first = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(first, Handshake) or (first.broker_set, first.broker_id) != (
            hello.broker_set,
            hello.broker_id,
        ):
            raise HaProtocolError("the handshake does not match the identity the slave proved")
        await self.serve(reader, writer, first)

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: Handshake
    ) -> None:
        """Run one authenticated slave connection whose Handshake was already read."""
        peer = str(writer.get_extra_info("peername"))
        if first.broker_set != self.broker_set:
            await _send_error(
                writer, "HA_PROTOCOL", f"this is broker set {self.broker_set}, not {first.broker_set}"
            )
            return
        slave_id = first.broker_id
        log.info(
            "%s slave %d connected from %s (its max offset %d)", self._ctx, slave_id, peer, first.max_offset
        )
        writer.write(
            encode(
                HandshakeReply(
                    self.broker_id,
                    self.epoch,
                    self.log.max_offset,
                    self.log.min_offset,
                    tuple(self.log.epochs.pairs()),
                )
            )
        )
        await writer.drain()
        start = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        while isinstance(start, LedgerFenced):  # the slave's fences come before its first ack
            self._ledger_fenced(slave_id, start.ledger_id)
            start = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if not isinstance(start, Ack):
            raise HaProtocolError(f"expected the slave's start offset, got {type(start).__name__}")
        if start.max_offset > self.log.max_offset or start.max_offset < self.log.min_offset:
            await _send_error(
                writer,
                "OFFSET_MISMATCH",
                f"cannot stream from {start.max_offset}: this log holds "
                f"[{self.log.min_offset}, {self.log.max_offset})",
            )
            return
        old = self.connections.get(slave_id)
        if old is not None and old.writer is not None:
            old.writer.close()
        conn = SlaveConnection(
            slave_id, peer, send_offset=start.max_offset, writer=writer, socket_fd=plain_socket_fd(writer)
        )
        self.connections[slave_id] = conn
        if conn.socket_fd is not None and self.zero_copy:
            # drain() waits until the transport holds nothing: the next chunk then finds it empty
            # and goes by sendfile (the socket's own buffer is the queue that keeps the link busy)
            writer.transport.set_write_buffer_limits(high=0)
        self._step(SlaveJoined(slave_id, start.max_offset))
        sender = asyncio.ensure_future(self._send_loop(conn, writer))
        try:
            await self._read_slave_frames(reader, writer, conn)
        finally:
            await cancel_and_wait(sender)
            if self.connections.get(slave_id) is conn:
                del self.connections[slave_id]
                if slave_id in self.core.slaves:
                    self.departed_acks[slave_id] = self.core.slaves[slave_id].ack_offset
                log.info(
                    "%s slave %d disconnected (acked %d)",
                    self._ctx,
                    slave_id,
                    self.core.slaves[slave_id].ack_offset if slave_id in self.core.slaves else -1,
                )
                if not self._closed:
                    self._step(SlaveLeft(slave_id))

    async def _read_slave_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: SlaveConnection
    ) -> None:
        slave_id = conn.broker_id
        while not self._closed:
            # a slave sends only small frames (acks, fences, errors)
            limit = functools.partial(self._frame_limit, slave_id)
            frame = await within(read_frame(reader, limit), self.idle_timeout)
            if isinstance(frame, Ack):
                self._step(Acked(slave_id, frame.max_offset))
            elif isinstance(frame, LedgerFenced):
                self._ledger_fenced(slave_id, frame.ledger_id)
            elif isinstance(frame, RangeRequest):
                self._send_range(conn, writer, frame)
            elif isinstance(frame, RangeData):
                self._repair_from(slave_id, frame)
            elif isinstance(frame, ErrorFrame):
                log.warning("%s slave %d reports %s: %s", self._ctx, slave_id, frame.code, frame.message)
                return
            else:
                raise HaProtocolError(f"unexpected {type(frame).__name__} from slave {slave_id}")

    def _send_range(self, conn: SlaveConnection, writer: asyncio.StreamWriter, req: RangeRequest) -> None:
        """A slave found bytes of its log damaged: send it this log's copy of that range.

        Only confirmed bytes (identical on every in-sync replica) and at most MAX_REPAIR_BYTES; one
        write, so the frame never interleaves with the sender's transfers."""
        end = req.offset + req.length
        if req.offset < self.log.min_offset or end > self.log.confirm_offset or req.length > MAX_REPAIR_BYTES:
            raise HaProtocolError(
                f"slave {conn.broker_id} asked for [{req.offset}, {end}): outside "
                f"[{self.log.min_offset}, confirm {self.log.confirm_offset}) or too long"
            )
        data, _ = self.log.read_raw_chunk(req.offset, req.length)
        log.warning(
            "%s slave %d reports damaged bytes [%d, %d): sending this log's copy",
            self._ctx,
            conn.broker_id,
            req.offset,
            end,
        )
        writer.write(encode(RangeData(req.offset, data)))

    # ------------------------------------------------------------------ repair of this log

    def request_repair(self, offset: int, length: int) -> int | None:
        """This log's bytes [offset, offset + length) are damaged: ask a connected slave that holds
        them for its copy. Returns the slave asked (now, or within REPAIR_RETRY_S and not yet
        answered), or None when no connected slave can send the range.

        A slave holds what it acked: its log, cut by fork repair at the handshake, is this log's
        up to its ack (docs/ARCHITECTURE.md §3.2), whether or not it is in the SyncStateSet. The
        copy is checked record by record before it is written (`CommitLog.repair_range`)."""
        end = offset + length
        if length <= 0 or length > MAX_REPAIR_BYTES:
            return None
        now = time.monotonic()
        asked = self._asked.get(offset)
        recent = asked is not None and now - asked.at < REPAIR_RETRY_S
        if asked is not None and recent and not asked.answered and asked.slave_id in self.connections:
            return asked.slave_id
        acks = self.core.acks()
        holders = sorted(b for b in self.connections if acks.get(b, -1) >= end)
        if asked is not None and recent and asked.answered:
            holders = [b for b in holders if b != asked.slave_id]  # it said it has no copy
        if not holders:
            return None
        # a slave that did not answer in time goes last
        slave_id = next((b for b in holders if asked is None or b != asked.slave_id), holders[0])
        writer = self.connections[slave_id].writer
        if writer is None or writer.is_closing():
            return None
        log.error(
            "%s damaged bytes [%d, %d) in the master's log: asking slave %d for its copy",
            self._ctx,
            offset,
            end,
            slave_id,
        )
        self._asked[offset] = _Asked(length, slave_id, now)
        writer.write(encode(RangeRequest(offset, length)))
        return slave_id

    def _frame_limit(self, slave_id: int) -> int:
        """A slave sends only small frames, except the copy of a range asked of it."""
        waiting = any(a.slave_id == slave_id and not a.answered for a in self._asked.values())
        return MAX_RANGE_FRAME if waiting else MAX_AUTH_FRAME

    def _repair_from(self, slave_id: int, frame: RangeData) -> None:
        """A slave's copy of a range asked of it: written over the damaged bytes once it checks out."""
        asked = self._asked.get(frame.offset)
        if asked is None or asked.slave_id != slave_id or asked.answered:
            raise HaProtocolError(f"slave {slave_id} sent bytes at {frame.offset} that were not asked of it")
        end = frame.offset + len(frame.data)
        asked.answered = True  # unless repaired: another slave is asked next, this one after REPAIR_RETRY_S
        if not frame.data:
            log.warning(
                "%s slave %d has no copy of [%d, %d)",
                self._ctx,
                slave_id,
                frame.offset,
                frame.offset + asked.length,
            )
            return
        try:
            self.log.repair_range(frame.offset, frame.data)
        except TidelogError as exc:  # its copy is no better, or the range moved: say so
            log.error(
                "%s could not repair [%d, %d) with slave %d's copy: %s",
                self._ctx,
                frame.offset,
                end,
                slave_id,
                exc,
            )
            return
        del self._asked[frame.offset]
        self.repaired.append((frame.offset, end))
        log.warning(
            "%s repaired [%d, %d) of the master's log from slave %d's copy",
            self._ctx,
            frame.offset,
            end,
            slave_id,
        )

    def _ledger_fenced(self, slave_id: int, ledger_id: int) -> None:
        # Synchronous on purpose: the fence must take effect before the slave's next ack is
        # counted, and frames of one connection are handled in order.
        log.info("%s slave %d fenced ledger %d", self._ctx, slave_id, ledger_id)
        if self._on_ledger_fenced is not None:
            self._on_ledger_fenced(ledger_id)

    def _send_chunk(self, conn: SlaveConnection, writer: asyncio.StreamWriter, offset: int) -> int:
        """Write the records from `offset` (up to `batch_bytes`, within one epoch) to the slave;
        returns the offset after them."""
        entry = self.log.epochs.find(offset)
        epoch, epoch_start, epoch_end = (entry.epoch, entry.start, entry.end) if entry else (0, 0, OPEN_END)
        limit = self.batch_bytes if epoch_end == OPEN_END else min(self.batch_bytes, epoch_end - offset)
        header = encode_transfer_header
        span = self.log.raw_span(offset, limit) if conn.socket_fd is not None and self.zero_copy else None
        if span is not None:
            self._step(Sent(conn.broker_id, span.next_offset))  # before the write, as below
            self._send_span(
                conn, writer, header(offset, epoch, epoch_start, self.log.confirm_offset, span.length), span
            )
            return span.next_offset
        data, nxt = self.log.read_raw_chunk(offset, limit)
        self._step(Sent(conn.broker_id, nxt))  # before the write: the slave may ack before drain() returns
        # one write, so header and data leave in one send
        writer.writelines((header(offset, epoch, epoch_start, self.log.confirm_offset, len(data)), data))
        self.sent_copied += len(data)
        return nxt

    def _send_span(
        self, conn: SlaveConnection, writer: asyncio.StreamWriter, head: bytes, span: RawSpan
    ) -> None:
        """One transfer whose data lies at `span`: when the transport holds nothing unsent, the
        header is written to the socket and the data goes from the page cache to it with
        os.sendfile, in order after everything the transport sent before. What the socket does not
        take at once goes through the transport, the data read from the file (one copy). No await
        in between, so no other frame of this connection comes between header and data."""
        fd = conn.socket_fd
        sent_head = sent = 0
        if fd is not None and not writer.is_closing() and writer.transport.get_write_buffer_size() == 0:
            # (not closing: the transport still owns the socket, so `fd` is still that socket)
            try:
                sent_head = os.write(fd, head)
                if sent_head == len(head):
                    sent = os.sendfile(fd, span.fd, span.position, span.length)
            except OSError:
                pass  # a full buffer (EAGAIN) or a broken connection: the transport carries on or fails
        if sent_head < len(head):
            writer.write(head[sent_head:])
        self.sent_zero_copy += sent
        if sent < span.length:
            rest = os.pread(span.fd, span.length - sent, span.position + sent)
            if len(rest) != span.length - sent:
                raise HaProtocolError(
                    f"{self._ctx} the log's file is shorter than its records at {span.position + sent}"
                )
            writer.write(rest)
            self.sent_copied += len(rest)

    async def _send_loop(self, conn: SlaveConnection, writer: asyncio.StreamWriter) -> None:
        # `conn.send_offset` is where the next send starts: an append may have sent inline
        # (on_appended) while this loop was parked.
        while not self._closed:
            event = self._new_data
            offset = conn.send_offset
            if offset < self.log.max_offset:
                conn.send_offset = self._send_chunk(conn, writer, offset)
                await writer.drain()
                continue
            # A heartbeat speaks for the current term, even before its first record: tagging it
            # with the epoch of the last byte would look like a deposed master to the slave.
            pairs = self.log.epochs.pairs()
            epoch, epoch_start = pairs[-1] if pairs else (self.epoch, 0)
            self._step(Sent(conn.broker_id, offset))
            writer.write(encode_transfer_header(offset, epoch, epoch_start, self.log.confirm_offset, 0))
            await writer.drain()
            conn.parked = True
            try:
                with contextlib.suppress(TimeoutError):
                    await within(event.wait(), self.heartbeat_interval)
            finally:
                conn.parked = False

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, why: TidelogError | None = None) -> None:
        """Stop being master: drop slaves, fail waiting producers (their outcome is unknown)."""
        self._closed = True
        if self._flush_listener in self.log.flush_listeners:
            self.log.flush_listeners.remove(self._flush_listener)
        err = why or NotMasterError(
            "this broker stopped being master while the write waited for "
            "replicas; the message may or may not survive"
        )
        for waiters in self._waiters.values():
            waiters.fail_all(err)
        for conn in list(self.connections.values()):
            if conn.writer is not None:
                conn.writer.close()
        for task in list(self._tasks):
            task.cancel()
        ev, self._new_data = self._new_data, asyncio.Event()
        ev.set()


def _epoch_start(commitlog: CommitLog, epoch: int) -> int:
    """Where `epoch`'s records begin in this log (its end, if the epoch holds no entry yet)."""
    starts = [start for e, start in commitlog.epochs.pairs() if e == epoch]
    return starts[-1] if starts else commitlog.max_offset


async def _send_error(writer: asyncio.StreamWriter, code: str, message: str) -> None:
    writer.write(encode(ErrorFrame(code, message)))
    with contextlib.suppress(OSError):  # a reset, or a broken TLS stream (ssl.SSLError)
        await writer.drain()
