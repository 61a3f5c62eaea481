"""One broker replica: its role (master / slave / none) and the requests it serves.

Theory of operation
-------------------
The controller is the only authority on roles. Every reply that carries a role assignment
(registration, heartbeat, election, SyncStateSet change) goes through `apply_role`, which is
serialised by a lock: `ha.roles.RoleCore` decides the transition from its table (stale answers
ignored, promotion, SyncStateSet update, follow, stop) and this module carries the actions out —
starting and stopping `HaMaster` / `HaSlave`, appending the new epoch to the epoch file.

**One write path.** Every write to the log — produce, group-offset commits, topic markers, ledger
creates, adds and seals — goes through the same public surface: `require_writable()` (this broker
is master, and its lease from the controller holds or the replication rule will stand in for it:
`ha.lease`), `append(msgs)` (append and wake the HA senders), and `persist(master, end, needed)`
(fsync under flush: sync, `needed` SyncStateSet acks, and `ha.lease.Lease.may_acknowledge` again). `write()` is the three in a row. Readers wait for the confirm offset with
`long_poll`, woken by `notify_confirmed`. Reads never pass the confirm offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tidelog.acl import AclState
from tidelog.broker.config import BrokerConfig
from tidelog.broker.ledgers import LedgerReplica
from tidelog.broker.offsets import (
    BATCH_BODY_BYTES,
    OFFSETS_TOPIC,
    GroupOffsets,
    batch_messages,
    tombstone_message,
)
from tidelog.broker.shared import SharedSubscriptions
from tidelog.broker.topics import TopicTable
from tidelog.clusterauth import require_real_secret
from tidelog.commitlog import CommitLog, Message, Placement, QueueOffsets, StoredMessage
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.record import HEADER_SIZE
from tidelog.errors import (
    ConfigError,
    CorruptRecordError,
    FlushDiskTimeoutError,
    GroupLimitReachedError,
    HaProtocolError,
    InSyncReplicasNotEnoughError,
    InvalidArgumentError,
    NotMasterError,
    RpoBoundReachedError,
    TidelogError,
)
from tidelog.guard import HA_DISPLACED, HA_UNPROVEN, RefusalLog
from tidelog.ha import roles
from tidelog.ha.ackpolicy import AckConfig, release_need, required_acks
from tidelog.ha.lease import Lease
from tidelog.ha.master import HaMaster, HaSlots
from tidelog.ha.protocol import (
    MAX_AUTH_FRAME,
    AuthHello,
    ErrorFrame,
    encode,
    read_frame,
)
from tidelog.ha.roles import MASTER, NONE, SLAVE, Role
from tidelog.ha.rpobound import AckBound
from tidelog.ha.slave import HaSlave
from tidelog.ha.syncstate import Proposal
from tidelog.invariants import stop_if_violated
from tidelog.tasks import within
from tidelog.tlsconfig import member_client

log = logging.getLogger(__name__)

T = TypeVar("T")


def _peer(writer: asyncio.StreamWriter) -> str:
    """A connection's peer as `host:port` (the refusal log keys on the host)."""
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


def _now_ms() -> int:
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    """The lease's clock: monotonic, so a wall-clock step neither extends nor ends a lease."""
    return time.monotonic_ns() // 1_000_000


#: One message of a produce request: (body, key, tags, properties, queue or None).
Outgoing = tuple[bytes, str | None, str | None, dict[str, str] | None, int | None]


class Replica:
    def __init__(
        self,
        cfg: BrokerConfig,
        commitlog: CommitLog,
        *,
        broker_id: int = -1,
        propose: Callable[[int, Proposal, int], Awaitable[Role | None]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.log = commitlog
        self.broker_id = broker_id
        self.roles = roles.RoleCore()
        self.ha_master: HaMaster | None = None
        self.ha_slave: HaSlave | None = None
        # users and grants as the controller sent them (auth on): the ports decide with these
        self.acl = AclState()
        self.topic_table = TopicTable(commitlog)  # topics served, and their generations in the log
        self.offsets = GroupOffsets(commitlog)
        self.ledgers = LedgerReplica(self)
        self.shared = SharedSubscriptions(self)  # shared-mode receives and acks (master only)
        self.ack_cfg = AckConfig(
            replication=cfg.replication,
            in_sync_replicas=cfg.in_sync_replicas,
            min_in_sync_replicas=cfg.min_in_sync_replicas,
            auto_in_sync_replicas=cfg.auto_in_sync_replicas,
            all_ack_in_sync_state_set=cfg.all_ack_in_sync_state_set,
        )
        self._propose = propose
        self._role_lock = asyncio.Lock()
        self._confirmed = asyncio.Event()
        self._rr = itertools.count()
        # This broker's right to acknowledge writes (ha/lease.py), renewed by answered heartbeats;
        # times come from `clock_ms`, the one clock the lease reads.
        self.lease = Lease()
        self.clock_ms: Callable[[], int] = monotonic_ms
        # how far a master alone in its SyncStateSet may acknowledge (ha/rpobound.py), granted by
        # heartbeat replies; `beat_soon` (the server's) asks for the next one at once
        self.ack_bound = AckBound()
        self.beat_soon: Callable[[], None] | None = None
        # the HA port's connections: unproven ones bounded and displaceable, proven ones apart
        self.ha_slots = HaSlots(
            cfg.ha_max_connections, cfg.ha_max_connections, cfg.ha_handshake_timeout_ms / 1000
        )
        # refused calls and connections of every port (the server's gRPC and data ports share it):
        # a few lines a second per peer host, counted by reason. A stranger flooding the HA port
        # with connections must not cost the log a line or two each (docs/SECURITY.md, probe 13)
        self.refusals = RefusalLog()
        self.data_address = ""  # where clients reach the data port (broker/dataport.py), if it runs
        self.rocketmq_address = (
            ""  # where RocketMQ clients reach this broker (broker/rocketmq.py), if it does
        )
        self.observe_ack_wait: Callable[[float], None] | None = None  # seconds a write waited for acks
        # ("produced" | "pulled", topic, messages, bytes) of each answered request, any transport
        self.observe_traffic: Callable[[str, str, int, int], None] | None = None
        if not cfg.secret:
            raise ConfigError(
                "a broker needs the cluster secret (key 'secret' or $TIDE_CLUSTER_SECRET): "
                "replication and controller membership prove it",
                key="secret",
            )
        require_real_secret(cfg.secret)
        self.secret: str = cfg.secret

    @property
    def ctx(self) -> str:
        return f"[{self.cfg.broker_set}/{self.broker_id} {self.role} epoch {self.master_epoch}]"

    # What the role core knows, read by the servers and the status.
    @property
    def role(self) -> str:
        return self.roles.role

    @property
    def master_epoch(self) -> int:
        return self.roles.master_epoch

    @property
    def master_id(self) -> int:
        return self.roles.master_id

    @property
    def master_address(self) -> str:
        return self.roles.master_address

    @property
    def last_sss_epoch(self) -> int:
        return self.roles.last_sss_epoch

    # ------------------------------------------------------------------ roles

    async def apply_role(self, role: Role, *, vouched: bool = True) -> None:
        """Carry out what the controller's assignment asks (`vouched`: ha/roles.py::Assigned)."""
        async with self._role_lock:
            for action in self.roles.step(
                roles.Assigned(role, self.log.epochs.last_epoch, self.broker_id, vouched), _now_ms()
            ):
                await self._carry_out(action)

    async def _carry_out(self, action: roles.Action) -> None:
        match action:
            case roles.StopMaster():
                if self.ha_master is not None:
                    log.warning("%s stop taking writes", self.ctx)
                await self._stop_master()
            case roles.StopSlave():
                await self._stop_slave()
            case roles.Promote(role, new_epoch):
                self._become_master(role, new_epoch)
            case roles.RefusePromotion(epoch, last):
                log.error(
                    "%s refusing promotion to epoch %d: the epoch file already holds epoch %d",
                    self.ctx,
                    epoch,
                    last,
                )
            case roles.UpdateSyncStateSet(sss, sss_epoch):
                if self.ha_master is not None:
                    self.ha_master.on_controller_state(sss, sss_epoch)
            case roles.Follow(role):
                self._become_slave(role)

    def _become_master(self, role: Role, new_epoch: bool) -> None:
        epoch = role.master_epoch
        if new_epoch:
            self.log.epochs.append(epoch, self.log.max_offset)
            # Everything this replica holds is now the committed history of the broker set.
            self.log.confirm_offset = self.log.max_offset
        # Same epoch: this broker restarted while still master. Its tail past the recovered confirm
        # offset may never have reached a slave; it is confirmed only as the slaves ack it.
        self.ha_master = HaMaster(
            self.log,
            broker_set=self.cfg.broker_set,
            broker_id=self.broker_id,
            epoch=epoch,
            sync_state_set=role.sync_state_set,
            sss_epoch=role.sss_epoch,
            slave_timeout_ms=self.cfg.slave_timeout_ms,
            max_not_catchup_ms=self.cfg.ha_max_time_slave_not_catchup_ms,
            batch_bytes=self.cfg.ha_transfer_batch_bytes,
            zero_copy=self.cfg.ha_zero_copy,
            heartbeat_interval_ms=self.cfg.ha_heartbeat_interval_ms,
            idle_timeout_ms=self.cfg.ha_idle_timeout_ms,
            propose=self._propose_sss,
            on_confirm=self._on_confirm,
            on_ledger_fenced=self.ledgers.on_fenced_by_slave,
            secret=self.secret,
        )
        self.notify_confirmed()
        log.warning(
            "%s promoted to master of epoch %d at offset %d (SyncStateSet %s)",
            self.ctx,
            epoch,
            self.log.max_offset,
            sorted(role.sync_state_set),
            extra={"max_offset": self.log.max_offset, "confirm_offset": self.log.confirm_offset},
        )

    def _become_slave(self, role: Role) -> None:
        self.ha_slave = HaSlave(
            self.log,
            broker_set=self.cfg.broker_set,
            broker_id=self.broker_id,
            master_id=role.master_id,
            master_address=role.master_ha_address,
            master_epoch=role.master_epoch,
            flush_sync=self.cfg.flush == "sync",
            ack_interval_ms=self.cfg.ha_heartbeat_interval_ms,
            idle_timeout_ms=self.cfg.ha_idle_timeout_ms,
            on_progress=self.notify_confirmed,
            fenced_ledgers=self.ledgers.index.fenced_ledgers,
            secret=self.secret,
            unclean_epoch=role.unclean_epoch,
            tls=member_client(self.cfg.tls),
        ).start()
        log.warning(
            "%s following master %d at %s (epoch %d)",
            self.ctx,
            role.master_id,
            role.master_ha_address,
            role.master_epoch,
            extra={"master_id": role.master_id, "max_offset": self.log.max_offset},
        )

    async def _stop_master(self) -> None:
        if self.ha_master is not None:
            await self.ha_master.close()
            self.ha_master = None

    async def _stop_slave(self) -> None:
        if self.ha_slave is not None:
            await self.ha_slave.stop()
            self.ha_slave = None

    async def _propose_sss(self, proposal: Proposal, attempt: int) -> None:
        if self._propose is None or self.ha_master is None:
            return
        role = await self._propose(self.ha_master.epoch, proposal, attempt)
        if role is not None:
            await self.apply_role(role)

    def _on_confirm(self, _offset: int) -> None:
        self.notify_confirmed()

    def notify_confirmed(self) -> None:
        """The confirm offset (or what a long poll waits for) may have moved: wake the long polls."""
        ev, self._confirmed = self._confirmed, asyncio.Event()
        ev.set()

    async def long_poll(self, poll: Callable[[], tuple[T, bool]], wait_ms: int) -> T:
        """Call `poll` until it says it is done or `wait_ms` passes, waking on `notify_confirmed`.

        The one long-poll loop of the broker (pulls, LAC reads): `poll` returns (answer, done)."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            event = self._confirmed  # taken before the poll: a wake-up during it is not missed
            answer, done = poll()
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                return answer
            with contextlib.suppress(TimeoutError):
                await within(event.wait(), remaining)

    async def close(self) -> None:
        async with self._role_lock:
            await self._stop_master()
            await self._stop_slave()
            self.roles.closed()

    # ------------------------------------------------------------------ HA server side

    async def handle_ha_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection on the HA port: the mutual proof of the cluster secret, then replication.

        Nothing of the log leaves before the peer has proven the secret for the broker id it
        claims; every frame read before that is at most MAX_AUTH_FRAME bytes; unproven
        connections are at most `ha_max_connections`, a new one displacing the oldest idle one,
        and each must prove the secret within `ha_handshake_timeout_ms` (ha/master.py `HaSlots`):
        bounded memory, and strangers cannot lock the real slaves out.
        """
        peer = _peer(writer)
        evicted = self.ha_slots.evicted
        slot = self.ha_slots.admit(writer.transport)
        if self.ha_slots.evicted != evicted:
            self.refusals.note(
                peer,
                HA_DISPLACED,
                f"HA connection: {self.ha_slots.max_unproven} connections have not proven the "
                f"cluster secret; closed the oldest for this one",
            )
        idle = self.cfg.ha_idle_timeout_ms / 1000
        try:
            hello = await within(read_frame(reader, MAX_AUTH_FRAME), idle)
            if not isinstance(hello, AuthHello):
                raise HaProtocolError(f"expected the slave's hello, got {type(hello).__name__}")
            slot.hello()
            master = self.ha_master
            if self.role != MASTER or master is None:
                writer.write(encode(ErrorFrame("NOT_MASTER", f"broker {self.broker_id} is {self.role}")))
                await writer.drain()
                return
            await master.accept(reader, writer, hello, slot)
        # OSError: a reset, or with TLS an ssl.SSLError (a peer without the right certificate)
        except (HaProtocolError, asyncio.IncompleteReadError, OSError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            if slot.is_proven:
                log.info("%s HA connection from %s closed: %s", self.ctx, peer, why)
            else:  # a stranger's, as likely as a slave's: rate-limited
                self.refusals.note(peer, HA_UNPROVEN, f"HA connection closed before the proof: {why}")
        except asyncio.CancelledError:
            # the server is closing: end quietly (on Python 3.11 a connection task that ends
            # cancelled makes asyncio log a traceback)
            pass
        except Exception as exc:
            stop_if_violated(exc)
            log.exception("%s HA connection failed", self.ctx)
        finally:
            slot.release()
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    # ------------------------------------------------------------------ requests

    @property
    def topics(self) -> dict[str, int]:
        """topic -> queues in this broker set, as the controller last said."""
        return self.topic_table.queues

    def _queues_of(self, topic: str) -> int:
        master = self.role == MASTER and self.ha_master is not None
        return self.topic_table.serve(topic, self._append_marker if master else None)

    def _queue(self, topic: str, queue: int, queues: int | None = None) -> int:
        """`queue` if `topic` has it here (the one queue-range check), else InvalidArgument."""
        queues = self._queues_of(topic) if queues is None else queues
        if not 0 <= queue < queues:
            raise InvalidArgumentError(f"queue {queue} does not exist (the topic has {queues} here)")
        return queue

    def _append_marker(self, msg: Message) -> Placement:
        _, placed = self.append([msg])
        return placed[-1]

    def enforce_topics(self) -> None:
        """After a heartbeat: as master, write the topic markers the controller's view asks for;
        on every replica, apply the markers received (a deleted topic's files go at once)."""
        if self.role == MASTER and self.ha_master is not None:
            self.topic_table.enforce(self._append_marker, self.ha_master.epoch)
        else:
            self.topic_table.marks.refresh()

    # ------------------------------------------------------------------ the write path

    def require_master(self) -> HaMaster:
        """This broker's HaMaster, or NotMasterError naming the master to go to."""
        if self.role != MASTER or self.ha_master is None:
            raise NotMasterError(
                f"broker {self.broker_id} of {self.cfg.broker_set} is {self.role}",
                master_address=self.master_address,
            )
        return self.ha_master

    def require_writable(self) -> HaMaster:
        """Check, before anything is appended, that this broker may take a write now: it is master,
        and either the controller confirmed its role recently (the lease) or the write will need
        every member the controller might know, so the replication rule will cover it
        (docs/ARCHITECTURE.md §3.5)."""
        master = self.require_master()
        try:
            every = required_acks(self.ack_cfg, master.write_set_size) >= master.write_set_size
        except InSyncReplicasNotEnoughError:
            every = False  # the write path refuses it with its own error
        if not self.lease.may_start(
            self.clock_ms(), master.epoch, replication=self.ack_cfg.replication, needs_every_member=every
        ):
            raise self._not_confirmed(after_write=False)
        return master

    def append(self, msgs: list[Message]) -> tuple[HaMaster, list[Placement]]:
        """Append `msgs` as master and wake the HA senders; nothing is acknowledged yet (`persist`)."""
        master = self.require_master()
        placed = self.log.append(msgs)
        master.on_appended()
        return master, placed

    async def write(self, msgs: list[Message]) -> list[Placement]:
        """The whole write: check, append, and wait until the ack policy's replicas hold it."""
        master = self.require_writable()
        needed = release_need(required_acks(self.ack_cfg, master.write_set_size), master.write_set_size)
        _, placed = self.append(msgs)
        await self.persist(master, placed[-1].phys_offset + placed[-1].size, needed)
        return placed

    async def persist(self, master: HaMaster, end: int, needed: int, *, fsync: bool = False) -> None:
        """Wait until what this master appended up to `end` is flushed (flush: sync, or `fsync`)
        and held by `needed` members of the SyncStateSet, and this broker may still speak for the set."""
        if fsync or self.cfg.flush == "sync":
            try:
                await self.log.flushed(end, now=fsync, timeout=self.cfg.flush_timeout_ms / 1000)
            except TimeoutError:
                raise FlushDiskTimeoutError(
                    f"fsync did not cover offset {end} within {self.cfg.flush_timeout_ms} ms"
                ) from None
        started = time.monotonic()
        await master.wait_acks(end, needed)
        if self.observe_ack_wait is not None:
            self.observe_ack_wait(time.monotonic() - started)
        await self._within_rpo_bound(master, end)
        # The acks may have arrived after this broker lost the right to speak for the set: without
        # a recent word from the controller it may already be replaced, unless every member the
        # controller might elect holds the write (docs/ARCHITECTURE.md §3.5). Checked after the
        # acks, not only before the append: a write that waited out an election must not be
        # acknowledged on a lease that lapsed meanwhile.
        if not self.lease.may_acknowledge(
            self.clock_ms(),
            master.epoch,
            end,
            master.core.held_by_all(),
            replication=self.ack_cfg.replication,
        ):
            raise self._not_confirmed(after_write=True)

    def grant_ack_bound(self, epoch: int, limit: int) -> None:
        """A heartbeat reply's grant (controller/RULES.md L10) for this broker as master of `epoch`."""
        if self.ack_bound.granted(epoch, limit):
            self.notify_confirmed()  # wakes the writes waiting in `_within_rpo_bound`

    async def _within_rpo_bound(self, master: HaMaster, end: int) -> None:
        """Wait until this master may acknowledge a write ending at `end` under the controllers'
        RPO bound (ha/rpobound.py): at once unless it is alone in its SyncStateSet past its grant;
        then asking for heartbeats until a grant covers `end` (or a slave rejoins the set), or
        RPO_BOUND_REACHED after the replicas' timeout. Waits in `long_poll`."""

        if self.ack_bound.allows(master.epoch, end, alone=master.write_set_size == 1):
            return  # every write but a bounded master's: no closure, no poll

        def allowed() -> tuple[bool, bool]:
            ok = self.ack_bound.allows(master.epoch, end, alone=master.write_set_size == 1)
            if not ok and self.beat_soon is not None:
                self.beat_soon()
            return ok, ok

        if not await self.long_poll(allowed, int(master.slave_timeout * 1000)):
            raise RpoBoundReachedError(
                f"broker {self.broker_id} of {self.cfg.broker_set}, alone in its SyncStateSet, may "
                f"acknowledge up to offset {self.ack_bound.limit} (rpo_bound_bytes past what every "
                f"controller holds of its reports); the write ends at {end}"
            )

    def _not_confirmed(self, *, after_write: bool) -> NotMasterError:
        outcome = " (the message was stored here and may or may not survive)" if after_write else ""
        return NotMasterError(
            f"broker {self.broker_id} cannot confirm with the controller that it is still master, "
            f"and not every in-sync replica holds the write{outcome}",
            master_address="",
        )

    # ------------------------------------------------------------------ requests

    async def produce(self, topic: str, items: Sequence[Outgoing]) -> list[tuple[Placement, int]]:
        """Append and replicate; returns (placement, queue) per message once acknowledged."""
        if not items:
            raise InvalidArgumentError("a produce request needs at least one message")
        queues = self._queues_of(topic)
        msgs = [
            Message(topic, self._choose_queue(topic, queue, key, queues), body, key, tags, props)
            for body, key, tags, props, queue in items
        ]
        placed = await self.write(msgs)
        return [(p, m.queue_id) for p, m in zip(placed, msgs, strict=True)]

    async def produce_encoded(
        self, topic: str, queue: int, batch: bytearray, count: int
    ) -> tuple[int, list[int]]:
        """Append a producer's record batch to one queue and replicate it (the write path of
        `write`, for bytes already in the log's format); returns (first queue offset, physical
        offset of each record) once acknowledged."""
        self._queue(topic, queue)
        master = self.require_writable()
        needed = release_need(required_acks(self.ack_cfg, master.write_set_size), master.write_set_size)
        first, phys = self.log.append_encoded(topic, queue, batch, count)
        master.on_appended()
        await self.persist(master, self.log.max_offset, needed)
        return first, phys

    def _choose_queue(self, topic: str, queue: int | None, key: str | None, queues: int) -> int:
        if queue is not None:
            return self._queue(topic, queue, queues)
        if key:
            return crc32c(key.encode()) % queues
        return next(self._rr) % queues

    async def pull(
        self, topic: str, queue: int, offset: int, max_messages: int, max_bytes: int, wait_ms: int
    ) -> tuple[list[StoredMessage], QueueOffsets]:
        self._queue(topic, queue)
        if offset < 0 or max_messages < 1 or max_bytes < 1 or wait_ms < 0:
            raise InvalidArgumentError("offset and wait must not be negative; limits must be positive")

        def poll() -> tuple[list[StoredMessage], bool]:
            try:
                msgs = self.log.read(topic, queue, offset, max_messages, max_bytes)
            except CorruptRecordError as exc:
                raise self.on_corrupt(exc) from None
            return msgs, bool(msgs)

        msgs = await self.long_poll(poll, wait_ms)
        return msgs, self.log.queue_offsets(topic, queue)

    async def pull_encoded(
        self, topic: str, queue: int, offset: int, max_messages: int, max_bytes: int, wait_ms: int
    ) -> tuple[bytes, int, QueueOffsets]:
        """`pull`, answered with the stored bytes of the records: (records, count, offsets)."""
        self._queue(topic, queue)
        if offset < 0 or max_messages < 1 or max_bytes < 1 or wait_ms < 0:
            raise InvalidArgumentError("offset and wait must not be negative; limits must be positive")

        def poll() -> tuple[tuple[bytes, int], bool]:
            try:
                got = self.log.read_encoded(topic, queue, offset, max_messages, max_bytes)
            except CorruptRecordError as exc:
                raise self.on_corrupt(exc) from None
            return got, got[1] > 0

        data, count = await self.long_poll(poll, wait_ms)
        return data, count, self.log.queue_offsets(topic, queue)

    # ------------------------------------------------------------------ lookups

    def get_message(self, topic: str, queue: int, offset: int) -> bytes:
        """The stored bytes of the confirmed message at `offset` of (topic, queue); any replica
        answers, as pulls do."""
        self._queue(topic, queue)
        return self._reading(lambda: self.log.message_in_queue(topic, queue, offset))

    def get_message_at(self, phys_offset: int) -> bytes:
        """The stored bytes of the confirmed user message at `phys_offset` (a message id of this
        broker set)."""
        return self._reading(lambda: self.log.message_at(phys_offset))

    async def find_messages(
        self, topic: str, key: str, begin_ts: int, end_ts: int, max_messages: int, max_bytes: int
    ) -> tuple[list[bytes], bool]:
        """The confirmed messages of `topic` with `key`, newest first, and whether more match.
        Runs off the event loop: the key index may first have to catch up with the log."""
        self._queues_of(topic)  # a topic served here (or TOPIC_NOT_FOUND), as for a pull
        try:
            return await asyncio.to_thread(
                lambda: self.log.find_by_key(
                    topic,
                    key,
                    begin_ts=begin_ts,
                    end_ts=end_ts,
                    max_results=max_messages,
                    max_bytes=max_bytes,
                ),
            )
        except CorruptRecordError as exc:  # on the event loop: a repair request writes to a socket
            raise self.on_corrupt(exc) from None

    def _reading(self, read: Callable[[], T]) -> T:
        try:
            return read()
        except CorruptRecordError as exc:
            raise self.on_corrupt(exc) from None

    def on_corrupt(self, exc: CorruptRecordError) -> CorruptRecordError:
        """A read (or the scrub) met damaged bytes: ask a replica that holds them for its copy
        (`request_repair`), and return the error the reader gets. It is CORRUPT_RECORD, which
        sends readers to another replica, and it names the damaged range and whether a copy was
        asked for: the bytes themselves are never served (every read checks the CRCs). A master
        that no connected replica can repair logs so loudly and goes on serving the rest of its
        log (docs/ARCHITECTURE.md §3.9)."""
        length = exc.size or 0
        log.error("%s %s", self.ctx, exc.message)
        if length <= 0:
            return exc
        end = exc.offset + length
        asked = self.request_repair(exc.offset, length)
        if asked is not None:
            doing = f"being repaired from {asked}'s copy"
        else:
            doing = "no connected replica holds a copy to repair them from"
            if self.role == MASTER:
                log.error(
                    "%s bytes [%d, %d) of the master's log are damaged and no connected replica "
                    "holds them: reads of them answer CORRUPT_RECORD until one that does connects "
                    "(it is asked for its copy then); the rest of the log is served",
                    self.ctx,
                    exc.offset,
                    end,
                )
        return CorruptRecordError(
            exc.path,
            exc.offset,
            f"{exc.reason}; bytes [{exc.offset}, {end}) of broker {self.broker_id}'s log are damaged, "
            f"{doing}: read them from another replica",
            size=exc.size,
        )

    def request_repair(self, offset: int, length: int) -> str | None:
        """Ask a replica that holds this log's bytes [offset, offset + length) for its copy, which
        is written over them once it checks out: a slave asks its master, a master a connected
        slave whose acks cover the range (`HaMaster.request_repair`). Returns who was asked
        ("master 1", "slave 2"), None when nobody can be. Quiet when asked again: the scrub calls
        it each second for every range still damaged."""
        if self.role == SLAVE and self.ha_slave is not None and self.ha_slave.connected:
            self.ha_slave.request_repair(offset, length)  # once per connection
            return f"master {self.ha_slave.master_id}"
        if self.role == MASTER and self.ha_master is not None:
            slave_id = self.ha_master.request_repair(offset, length)
            return None if slave_id is None else f"slave {slave_id}"
        return None

    def queue_offsets(self, topic: str, queue: int) -> QueueOffsets:
        self._queue(topic, queue)
        return self.log.queue_offsets(topic, queue)

    async def commit_offset(self, group: str, topic: str, queue: int, offset: int) -> None:
        await self.commit_offsets([(group, topic, queue, offset)])

    async def commit_offsets(self, commits: Sequence[tuple[str, str, int, int]]) -> None:
        """Commit each (group, topic, queue, offset) of `commits` in one replicated write: every
        one is checked first, and one refused refuses them all (nothing is written). Many commits
        go in few records (`batch_messages`), one write all the same."""
        # Per call, not per commit: which groups are new here, and each queue's offsets (a
        # batch of 500 commits spent most of its CPU asking both again for every commit).
        unknown, held = self.offsets.new_groups(c[0] for c in commits)
        new_groups: set[str] = set()
        ends: dict[tuple[str, int], QueueOffsets] = {}
        for group, topic, queue, offset in commits:
            if not group or len(group) > 255:
                raise InvalidArgumentError("group must be 1-255 characters")
            offsets = ends.get((topic, queue))
            if offsets is None:
                offsets = ends[topic, queue] = self.queue_offsets(topic, queue)
            if offset < 0:
                raise InvalidArgumentError("offset must not be negative")
            self.require_master()  # a slave's end may lag: only the master judges a commit
            if group in unknown and group not in new_groups:
                new_groups.add(group)
                self._check_group_room(held, len(new_groups))
            if offset > offsets.max:
                # a position past the end would make the group skip every message written until then
                raise InvalidArgumentError(
                    f"offset {offset} is beyond the end of {topic}/{queue} ({offsets.max})",
                    hint="commit the next offset to consume: at most the queue's max offset",
                )
        # a batch record within the broker's max_message_bytes, however small it is configured
        room = self.log.max_message_bytes - HEADER_SIZE - len(OFFSETS_TOPIC.encode())
        await self.write(batch_messages(commits, min(BATCH_BODY_BYTES, room)))

    def _check_group_room(self, held: int, new: int) -> None:
        """GroupLimitReachedError when `new` groups not yet here would take the broker, which
        holds commits of `held` groups, past `max_groups`. Counted over confirmed commits: new
        groups committing in separate calls at once may pass it by a few (a bound on memory, not
        an exact count)."""
        limit = self.cfg.max_groups
        if new and held + new > limit:
            more = f" ({new} new in this call)" if new > 1 else ""
            raise GroupLimitReachedError(
                f"this broker holds the commits of {held} consumer groups; max_groups is {limit}{more}"
            )

    def fetch_offset(self, group: str, topic: str, queue: int) -> int | None:
        if not group:
            raise InvalidArgumentError("group must not be empty")
        marks = self.topic_table.marks
        marks.refresh()
        # a commit from before the topic's latest marker is a commit of a deleted topic of that name
        since = marks.marked_at(topic)
        committed = self.offsets.fetch(group, topic, queue, since=since)
        if committed is not None:
            return committed
        # A group reading in the shared mode commits nothing: where it stands is its floor, below
        # which every message is finished (so describe shows its lag, and a later clustering
        # member starts there).
        shared = self.shared.states.get((group, topic, queue), since=since)
        return None if shared is None else shared.floor

    def group_offsets(self, group: str, topic: str | None = None) -> list[tuple[str, int, int]]:
        """The group's confirmed commits here, (topic, queue, offset) sorted; only `topic`'s if given.
        Commits of a deleted topic of the same name (before its latest marker) are not listed."""
        if not group:
            raise InvalidArgumentError("group must not be empty")
        marks = self.topic_table.marks
        marks.refresh()
        return sorted(
            (t, q, offset)
            for (g, t, q), (offset, at) in self.offsets.committed().items()
            if g == group and (topic is None or t == topic) and at >= marks.marked_at(t)
        )

    async def delete_group_offsets(self, group: str, topic: str | None = None) -> list[tuple[str, int, int]]:
        """Delete the group's commits here (all, or `topic`'s): one tombstone per commit, written
        and replicated like a commit; returns the commits deleted (none: nothing is written)."""
        self.require_master()  # a slave's fold may lag: only the master judges what is committed
        found = self.group_offsets(group, topic)
        if found:
            await self.write([tombstone_message(group, t, q) for t, q, _ in found])
            log.info("%s deleted %d committed offsets of group %s", self.ctx, len(found), group)
        return found

    def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> tuple[int, QueueOffsets]:
        """The first confirmed offset of the queue stored at or after `timestamp_ms`, and the
        queue's offsets."""
        self._queue(topic, queue)
        if timestamp_ms < 0:
            raise InvalidArgumentError("the timestamp must not be negative (epoch milliseconds)")
        try:
            return self.log.offset_for_time(topic, queue, timestamp_ms), self.log.queue_offsets(topic, queue)
        except CorruptRecordError as exc:
            raise self.on_corrupt(exc) from None

    def status(self) -> dict[str, Any]:
        master = self.ha_master
        replicas = []
        if master is not None:
            sss = master.tracker.local  # the controller-confirmed set, consistent with its epoch
            known = set(master.connections) | (set(sss) - {self.broker_id})
            acks = master.acks()
            for bid in sorted(known):
                replicas.append(
                    {
                        "broker_id": bid,
                        "ack_offset": acks.get(bid, -1),
                        "connected": bid in master.connections,
                        "in_sync": bid in sss,
                    }
                )
        return {
            "broker_set": self.cfg.broker_set,
            "broker_id": self.broker_id,
            "role": self.role,
            "master_epoch": self.master_epoch,
            "last_epoch": self.log.epochs.last_epoch,
            "min_offset": self.log.min_offset,
            "max_offset": self.log.max_offset,
            "confirm_offset": self.log.confirm_offset,
            "flushed_offset": self.log.flushed_offset,
            "sync_state_set": sorted(master.tracker.local) if master else [],
            "sync_state_set_epoch": master.tracker.sss_epoch if master else self.last_sss_epoch,
            "pending_sync_state_set": sorted(master.tracker.pending.new_sync_state_set)
            if master and master.tracker.pending
            else [],
            "master_address": self.master_address,
            "replicas": replicas,
            "data_address": self.data_address,
            "rocketmq_address": self.rocketmq_address,
        }


__all__ = ["MASTER", "NONE", "SLAVE", "Outgoing", "Replica", "Role", "TidelogError"]
