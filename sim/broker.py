"""A broker in the simulator: the real HA cores and role table behind a small shell.

Real code, called exactly as `broker/replica.py`, `broker/server.py`, `ha/master.py` and
`ha/slave.py` call it: `ha/roles.py::RoleCore` for every controller reply, `ha/mastercore.py::
MasterCore` (acks, the confirm offset, releases, SyncStateSet proposals), `ha/slavecore.py::SlaveCore`
(handshake, fork repair through `commitlog/epochs.py::last_consistent_point`, transfers, acks),
`ha/ackpolicy.py::required_acks`, and `ha/lease.py::Lease` (`may_start` before the append,
`may_acknowledge` after the acks, renewed by each answered heartbeat).

Modelled: the log (`sim.disk.Disk`), the frames (a tuple per frame on a `sim.net.Conn`), the
auth handshake (skipped: every peer is honest here), fsync (a delay), and the proposal's shell as
`ha/master.py::HaMaster._run_proposal` runs it: each attempt takes its first answer within the
call's timeout; with none it asks again three heartbeats later while the proposal is still the
pending one, never giving it up; the refusals that only say "not at this epoch" (fenced master or
set epoch, not the master, and "equals the current set" on a repeat) leave it pending until a
newer state arrives; any other refusal is an `AlterFailed`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.errors import InSyncReplicasNotEnoughError
from tidelog.ha import ackpolicy, roles
from tidelog.ha import mastercore as mc
from tidelog.ha import slavecore as sc
from tidelog.ha.lease import Lease
from tidelog.ha.syncstate import Proposal

from .disk import Disk, DiskFailed, Record
from .net import Conn, Node, Sim

if TYPE_CHECKING:
    from .world import World

HB_INTERVAL = 1000  # broker heartbeat_interval_ms; also the HA heartbeat and ack tick
SLAVE_TIMEOUT = 3000  # slave_timeout_ms: a write waiting for acks longer answers FLUSH_SLAVE_TIMEOUT
NOT_CATCHUP = 15000  # ha_max_time_slave_not_catchup_ms
RPC_TIMEOUT = 2000  # a heartbeat answer later than this is dropped (total_timeout=2.0)
RECONNECT = 1000  # a slave reconnects after a pause
SCRUB = 5000  # how often stored records are verified
KEEP_PENDING = frozenset(
    {
        "CONTROLLER_FENCED_MASTER_EPOCH",
        "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
        "CONTROLLER_INVALID_MASTER",
    }
)
# A shell switch, not a rule of the cores: give up a proposal that got no answer after three
# heartbeats (what ha/master.py did before). Only a mutant turns it on.
SHELL = {"give_up_unanswered": False}


class Waiter:
    __slots__ = ("client", "core", "done", "needed", "rec", "req")

    def __init__(self, needed: int, rec: Record, client: Any, req: int, core: mc.MasterCore) -> None:
        self.needed, self.rec, self.client, self.req, self.core = needed, rec, client, req, core
        self.done = False


class ProposalRun:
    """One proposal being asked for, attempt after attempt."""

    __slots__ = ("answered", "attempt", "done", "epoch_before", "proposal", "retried", "sent_at")

    def __init__(self, proposal: Proposal, epoch_before: int) -> None:
        self.proposal = proposal
        self.epoch_before = epoch_before
        self.attempt = 0
        self.sent_at = 0
        self.answered = False
        self.retried = False
        self.done = False


class Broker(Node):
    def __init__(self, sim: Sim, world: World, bid: int, dc: str, ack_cfg: ackpolicy.AckConfig) -> None:
        super().__init__(sim, f"b{bid}", dc)
        self.world = world
        self.bid = bid
        self.ack_cfg = ack_cfg
        self.disk = Disk(bid, world.checker)
        self.disk_faults = 0
        # broker/server.py::BrokerServer._crashed_master_of: whether the log came back from a crash
        self.recovered_clean = True
        self.start()

    # ------------------------------------------------------------------ process life

    def start(self) -> None:
        self.rc = roles.RoleCore()
        self.lease = Lease()
        self.core: mc.MasterCore | None = None
        self.slave: sc.SlaveCore | None = None
        self.sconn: Conn | None = None
        # the slave handles one frame at a time, as ha/slave.py's loop does: a frame waiting for
        # an fsync holds back the next (its actions were decided on the log as it was)
        self.sbusy = False
        self.sbacklog: list[tuple[Conn, Callable[[], sc.Event], Any]] = []
        self.mconns: dict[int, Conn] = {}
        self.waiters: list[Waiter] = []
        self.runs: list[ProposalRun] = []  # proposals being asked for (ha/master.py::_run_proposal)
        self.alter_seq = 0  # the last attempt's number (ha/master.py::HaMaster._attempt, RULES.md A4b)
        self.flush_waiters: list[tuple[int, Callable[[], None]]] = []
        self.flushing = False
        self.stopped = False
        self.fresh = True  # no controller answer since the process started (the real one registers)
        self.reelect_epoch: int | None = None  # the epoch led before a crash, while a new one is asked for
        # when the election call in flight was made: BrokerServer.beat awaits one at a time
        self.electing: int | None = None
        self.after(1 + self.sim.rng.randrange(HB_INTERVAL), self.tick)
        self.after(SCRUB, self.scrub)

    def crash(self) -> None:
        self.sim.tr(
            "b%d crashes (max %d flushed %d confirm %d)",
            self.bid,
            self.disk.max,
            self.disk.flushed,
            self.disk.confirm,
        )
        self.up = False
        self.inc += 1
        self._close_all(20)
        self.disk.crash(self.sim.rng)
        self.recovered_clean = False
        self.sim.tr(
            "b%d recovered: max %d confirm %d epochs %s",
            self.bid,
            self.disk.max,
            self.disk.confirm,
            tuple(self.disk.epochs),
        )

    def restart(self) -> None:
        self.up = True
        self.start()

    def fail_stop(self, why: str) -> None:
        """docs/ARCHITECTURE.md §3.9: step down at once, no heartbeats, start over when the store opens."""
        if self.stopped:
            return
        self.sim.tr("b%d fail-stop: %s", self.bid, why)
        self._stop_master()
        self._stop_slave()
        self.rc.closed()
        self.stopped = True
        self.inc += 1  # its timers and in-flight work end with it; the process starts over
        self.after(1000, self._try_reopen)

    def _try_reopen(self) -> None:
        if self.disk.failing:
            self.after(1000, self._try_reopen)
            return
        self.sim.tr("b%d store opens again", self.bid)
        self.start()

    def _close_all(self, detect_ms: int) -> None:
        for conn in list(self.mconns.values()):
            self.sim.break_conn(conn, detect_ms)
        if self.sconn is not None:
            self.sim.break_conn(self.sconn, detect_ms)

    # ------------------------------------------------------------------ the periodic work

    def tick(self) -> None:
        self.after(HB_INTERVAL, self.tick)
        self.beat()
        if self.core is not None:
            self._master_tick()
        elif self.slave is not None:
            if self.sconn is None:
                self.connect()
            elif self.sconn.answered:  # ha/slave.py starts its ack loop after the handshake's answer
                self._slave_event(self.sconn, lambda: sc.AckTick(self._local_log()), ())

    def _master_tick(self) -> None:
        self.step(mc.ShrinkCheck())
        if self.core is None:
            return
        for conn in list(self.mconns.values()):
            self._send_to(conn, heartbeat=True)
        if self.runs:
            self._retry_proposals()

    def scrub(self) -> None:
        """Verify stored records (a read or a scan meets a bad CRC sooner or later)."""
        self.after(SCRUB, self.scrub)
        if self.disk.corrupt and not self.stopped:
            self._repair()

    def _repair(self) -> bool:
        """Rewrite damaged records from a peer's intact copy; True when none is left.

        A slave fetches the range from its master (ha/slave.py::HaSlave.request_repair); a master
        from a connected slave whose acks cover the range (ha/master.py::HaMaster.request_repair),
        modelled as from a connected in-sync slave."""
        if self.core is not None:
            peers = [self.world.brokers[s] for s in self.mconns if s in self.core.tracker.local]
        elif self.slave is not None and self.sconn is not None and self.sconn.alive:
            peers = [self.world.brokers[self.slave.master_id]]
        else:
            peers = []
        for start in sorted(self.disk.corrupt):
            for peer in peers:
                if self.disk.repair(start, peer.disk):
                    self.sim.tr("b%d repaired the record at %d from b%d", self.bid, start, peer.bid)
                    break
        return not self.disk.corrupt

    def beat(self) -> None:
        disk = self.disk
        sent = self.local()
        epoch = disk.last_epoch if disk.epochs else -1
        for c in self.world.ctrls:
            self.sim.send(self, c, c.on_heartbeat, self, self.bid, epoch, disk.max, disk.confirm, sent)

    # ------------------------------------------------------------------ controller replies

    def on_hb_reply(self, role: roles.Role, sent: int, lease_withheld: bool = False) -> None:
        if self.stopped or self.local() - sent > RPC_TIMEOUT:
            return
        # broker/server.py::BrokerServer.beat: only an answer naming this broker master renews
        # its lease, and none that withholds it
        if role.has_master and role.master_id == self.bid and not lease_withheld:
            self.lease.renew(sent, 5000, epoch=role.master_epoch, unclean_elections=False)
        if self.fresh:
            self.fresh = False
            if (
                not self.recovered_clean
                and role.has_master
                and role.master_id == self.bid
                and role.master_epoch == self.disk.last_epoch
            ):
                # back from a crash as master of the epoch it led: ask for a new one (RULES.md E8)
                self.reelect_epoch = role.master_epoch
                self.sim.tr(
                    "b%d back from a crash as master of epoch %d: asks for a new epoch",
                    self.bid,
                    role.master_epoch,
                )
        if self.reelect_epoch is not None:
            if role.has_master and role.master_id == self.bid and role.master_epoch == self.reelect_epoch:
                self._ask_election(restarted_epoch=self.reelect_epoch)
                return  # no role meanwhile
            self.reelect_epoch = None  # the controller moved on by itself
        self.apply_role(role, vouched=not lease_withheld)
        if not role.has_master and not self.stopped:
            self._ask_election()

    def _ask_election(self, restarted_epoch: int = 0) -> None:
        """An election call (`ElectMaster`), unless one is in flight: the real broker awaits each
        within its heartbeat round, so a round of answers cannot start more than one (in the model
        every leader answers a heartbeat, and a duplicated answer arrives twice)."""
        now = self.local()
        if self.electing is not None and now - self.electing <= RPC_TIMEOUT:
            return
        self.electing = now
        for c in self.world.ctrls:
            self.sim.send(self, c, c.on_elect, self, self.bid, restarted_epoch)

    def on_elect_reply(self, role: roles.Role) -> None:
        if self.stopped:
            return
        if self.electing is None or self.local() - self.electing > RPC_TIMEOUT:
            return  # a second answer to one call, or one after the call's timeout: never seen
        self.electing = None
        if self.reelect_epoch is not None:
            if role.has_master and role.master_id == self.bid and role.master_epoch == self.reelect_epoch:
                return  # not the new epoch yet: the next heartbeat asks again
            self.reelect_epoch = None
        self.apply_role(role)
        if role.has_master and role.master_id == self.bid and not self.stopped:
            self.beat()  # an election's answer renews no lease: ask for one now (BrokerServer.beat)

    def on_alter_reply(
        self, run: ProposalRun, attempt: int, code: str, message: str, role: roles.Role | None
    ) -> None:
        """The answer to one attempt (as ha/master.py::HaMaster._run_proposal takes it): only the
        first, and only within the call's timeout; a duplicate or a late one is not seen."""
        if run.done or attempt != run.attempt or run.answered or run not in self.runs:
            return
        if self.local() - run.sent_at > RPC_TIMEOUT:
            return
        run.answered = True
        self._end_run(run)
        proposal = run.proposal
        if code == "OK":
            if role is not None:
                self.apply_role(role)
            return
        if code in KEEP_PENDING:
            return  # overtaken: the heartbeat that brings the newer state ends it
        if run.retried and code == "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED":
            return  # a repeat of a change an unanswered attempt already made
        self.sim.tr(
            "b%d proposal %s refused: %s %s", self.bid, sorted(proposal.new_sync_state_set), code, message
        )
        self.step(mc.AlterFailed(proposal, run.epoch_before))

    def _end_run(self, run: ProposalRun) -> None:
        run.done = True
        if run in self.runs:
            self.runs.remove(run)

    def apply_role(self, role: roles.Role, *, vouched: bool = True) -> None:
        ev = roles.Assigned(role, self.disk.last_epoch, self.bid, vouched)
        for action in self.rc.step(ev, self.local()):
            if self.stopped:
                return
            self._carry_out(action)
        if self.slave is not None and role.master_epoch >= self.slave.master_epoch:
            self.slave.unclean_epoch = max(self.slave.unclean_epoch, role.unclean_epoch)

    def _carry_out(self, action: roles.Action) -> None:
        match action:
            case roles.StopMaster():
                self._stop_master()
            case roles.StopSlave():
                self._stop_slave()
            case roles.Promote(role, new_epoch):
                self._promote(role, new_epoch)
            case roles.UpdateSyncStateSet(sss, sss_epoch):
                if self.core is not None:
                    self.step(mc.ControllerState(frozenset(sss), sss_epoch))
            case roles.Follow(role):
                self._follow(role)

    # ------------------------------------------------------------------ master

    def _promote(self, role: roles.Role, new_epoch: bool) -> None:
        disk = self.disk
        epoch = role.master_epoch
        try:
            if new_epoch:
                disk.record_epoch(epoch, disk.max)
                disk.set_confirm(disk.max)
        except DiskFailed as exc:
            self.fail_stop(str(exc))
            return
        self.sim.tr(
            "b%d promoted to master of epoch %d at %d (SSS %s)",
            self.bid,
            epoch,
            disk.max,
            sorted(role.sync_state_set),
        )
        self.core = mc.MasterCore.start(
            broker_id=self.bid,
            epoch=epoch,
            sync_state_set=frozenset(role.sync_state_set),
            sss_epoch=role.sss_epoch,
            master_max=disk.max,
            confirm=disk.confirm,
            epoch_start=disk.epoch_start(epoch),
            max_not_catchup_ms=NOT_CATCHUP,
            now_ms=self.local(),
            durable=disk.flushed,  # flush: sync, as ha/master.py passes it
        )
        self.world.checker.on_promote(self, epoch)

    def _stop_master(self) -> None:
        if self.core is None:
            return
        self.sim.tr("b%d stops being master of epoch %d", self.bid, self.core.epoch)
        self.core = None
        for run in self.runs:
            run.done = True
        self.runs = []
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            self._reply(w.client, w.req, "UNKNOWN", -1)
        for conn in list(self.mconns.values()):
            self.sim.break_conn(conn, 20)
        self.mconns.clear()

    def step(self, event: mc.Event) -> None:
        core = self.core
        if core is None:
            return
        for action in core.step(event, self.local()):
            match action:
                case mc.SetConfirm(offset):
                    self.disk.set_confirm(offset)
                case mc.Release(needed, offset):
                    self._release(needed, offset)
                case mc.Propose(proposal):
                    self.sim.tr(
                        "b%d proposes SSS %s at set epoch %d",
                        self.bid,
                        sorted(proposal.new_sync_state_set),
                        proposal.sss_epoch,
                    )
                    run = ProposalRun(proposal, self.core.tracker.sss_epoch if self.core else 0)
                    self.runs.append(run)
                    self._send_proposal(run)
                case mc.Reject(slave, reason):
                    conn = self.mconns.pop(slave, None)
                    if conn is not None:
                        self.sim.break_conn(conn, 20)
                    self.sim.tr("b%d rejects slave %d: %s", self.bid, slave, reason)
                    self.step(mc.SlaveLeft(slave))

    def _send_proposal(self, run: ProposalRun) -> None:
        core = self.core
        if core is None:
            return
        run.sent_at = self.local()
        self.alter_seq = max(self.alter_seq + 1, run.sent_at)  # numbered on from the clock, as the shell
        for c in self.world.ctrls:
            self.sim.send(self, c, c.on_alter, self, run, run.attempt, self.bid, core.epoch, self.alter_seq)

    def _retry_proposals(self) -> None:
        """No answer within the call's timeout: after three heartbeats, ask again while the
        proposal is still the pending one at the set epoch it started from; never give it up
        (unless a mutant turns the old behaviour back on)."""
        core = self.core
        now = self.local()
        for run in list(self.runs):
            if core is None or run.answered or now - run.sent_at < RPC_TIMEOUT + 3 * HB_INTERVAL:
                continue
            tracker = core.tracker
            if tracker.pending != run.proposal or tracker.sss_epoch != run.epoch_before:
                self._end_run(run)
            elif SHELL["give_up_unanswered"]:
                self._end_run(run)
                self.step(mc.AlterFailed(run.proposal, run.epoch_before))
            else:
                run.attempt += 1
                run.retried = True
                self._send_proposal(run)

    def on_ha_handshake(self, conn: Conn, slave_id: int) -> None:
        if self.core is None or self.stopped:
            self.sim.break_conn(conn, 20)
            return
        slave = self.world.brokers[slave_id]
        disk = self.disk
        conn.shook = True
        self.sim.conn_send(
            conn, self, slave, slave.on_ha_reply, conn, self.core.epoch, 0, disk.max, tuple(disk.epochs)
        )

    def on_ha_ack(self, conn: Conn, slave_id: int, offset: int) -> None:
        if self.core is None or not conn.alive:
            return
        if not conn.shook:
            self.sim.break_conn(conn, 20)  # an ack before the handshake: a protocol error
            return
        if self.mconns.get(slave_id) is conn:
            self.step(mc.Acked(slave_id, offset))
            return
        if offset > self.disk.max:
            self.sim.break_conn(conn, 20)  # OFFSET_MISMATCH
            return
        old = self.mconns.get(slave_id)
        if old is not None:
            self.sim.break_conn(old, 20)
        self.mconns[slave_id] = conn
        conn.send_offset = offset
        self.step(mc.SlaveJoined(slave_id, offset))
        if self.mconns.get(slave_id) is conn:
            self._send_to(conn)

    def ha_closed(self, conn: Conn) -> None:
        if conn.master is self:
            for sid, c in list(self.mconns.items()):
                if c is conn:
                    del self.mconns[sid]
                    self.step(mc.SlaveLeft(sid))
        elif conn is self.sconn:
            self.sconn = None
            self.after(RECONNECT, self._reconnect)

    def _send_to(self, conn: Conn, heartbeat: bool = False) -> None:
        core, disk = self.core, self.disk
        if core is None:
            return
        slave = conn.slave
        sent = False
        while conn.alive and conn.send_offset < disk.max:
            off = conn.send_offset
            epoch, start, end = disk.epoch_at(off)
            hi = min(disk.max, end)
            recs = disk.range(off, hi)
            if disk.corrupt and any(r[0] in disk.corrupt for r in recs) and not self._repair():
                return  # nothing to send from until the range is repaired: this slave lags
            self.sim.conn_send(
                conn, self, slave, slave.on_transfer, conn, off, epoch, start, disk.confirm, hi - off, recs
            )
            conn.send_offset = hi
            sent = True
            self.step(mc.Sent(slave.bid, hi))
        if heartbeat and not sent and conn.alive:
            epoch, start, _ = disk.epoch_at(conn.send_offset)
            self.sim.conn_send(
                conn,
                self,
                slave,
                slave.on_transfer,
                conn,
                conn.send_offset,
                epoch,
                start,
                disk.confirm,
                0,
                (),
            )

    # ------------------------------------------------------------------ the write path

    def on_produce(self, client: Any, req: int, mid: int, size: int) -> None:
        core = self.core
        if core is None or self.stopped:
            self._reply(client, req, "NOT_MASTER", self.rc.master_id)
            return
        members = len(core.tracker.effective)
        try:
            needed = ackpolicy.release_need(ackpolicy.required_acks(self.ack_cfg, members), members)
        except InSyncReplicasNotEnoughError:
            self._reply(client, req, "IN_SYNC_REPLICAS_NOT_ENOUGH", self.bid)
            return
        if not self.lease.may_start(
            self.local(), core.epoch, replication="sync", needs_every_member=needed == ackpolicy.EVERY_MEMBER
        ):
            self._reply(client, req, "NOT_MASTER", -1)
            return
        disk = self.disk
        rec = (disk.max, disk.max + size, core.epoch, mid)
        try:
            disk.append(rec)
        except DiskFailed as exc:
            self._reply(client, req, "STORE_ERROR", -1)
            self.fail_stop(str(exc))
            return
        self.step(mc.Appended(disk.max))
        for conn in list(self.mconns.values()):
            self._send_to(conn)
        self.flush(rec[1], lambda: self._wait_acks(Waiter(needed, rec, client, req, core)))

    def _wait_acks(self, w: Waiter) -> None:
        core = self.core
        if core is not w.core or core is None:
            self._reply(w.client, w.req, "UNKNOWN", -1)
            return
        end = w.rec[1]
        if core.acked_by(w.needed) >= end:  # ha/master.py::HaMaster.wait_acks
            self._finish(w)
            return
        self.waiters.append(w)
        if w.needed not in core.needs:
            self.step(mc.Waiting(w.needed))
        if not w.done:
            self.after(SLAVE_TIMEOUT, self._timeout, w)

    def _timeout(self, w: Waiter) -> None:
        if not w.done:
            w.done = True
            if w in self.waiters:
                self.waiters.remove(w)
            self._reply(w.client, w.req, "FLUSH_SLAVE_TIMEOUT", -1)

    def _release(self, needed: int, offset: int) -> None:
        ready = [w for w in self.waiters if w.needed == needed and w.rec[1] <= offset and not w.done]
        for w in ready:
            self.waiters.remove(w)
            self._finish(w)

    def _finish(self, w: Waiter) -> None:
        w.done = True
        core = self.core
        if core is not w.core or core is None:
            self._reply(w.client, w.req, "UNKNOWN", -1)
            return
        # the acks may have come in after this broker lost the right to speak for the set
        if not self.lease.may_acknowledge(
            self.local(), core.epoch, w.rec[1], core.held_by_all(), replication="sync"
        ):
            self._reply(w.client, w.req, "NOT_MASTER", -1)
            return
        self.world.checker.on_ack(self, core.epoch, w.rec)
        self._reply(w.client, w.req, "OK", self.bid)

    def _reply(self, client: Any, req: int, code: str, hint: int) -> None:
        self.sim.send(self, client, client.on_reply, req, code, hint)

    def flush(self, offset: int, then: Callable[[], None]) -> None:
        """fsync (flush: sync): `then` runs once the log is on disk up to `offset`."""
        self.flush_waiters.append((offset, then))
        if not self.flushing:
            self.flushing = True
            self.after(1 + self.sim.rng.randrange(10), self._flushed, self.disk.max)

    def _flushed(self, target: int) -> None:
        self.flushing = False
        try:
            self.disk.flush_to(target)
        except DiskFailed as exc:
            self.fail_stop(str(exc))
            return
        if self.core is not None:
            self.step(mc.Flushed(self.disk.flushed))  # ha/master.py::HaMaster._on_flushed
        done = [(o, f) for o, f in self.flush_waiters if o <= self.disk.flushed]
        self.flush_waiters = [(o, f) for o, f in self.flush_waiters if o > self.disk.flushed]
        if self.flush_waiters:
            self.flushing = True
            self.after(1 + self.sim.rng.randrange(10), self._flushed, self.disk.max)
        for _, then in done:
            then()

    # ------------------------------------------------------------------ slave

    def _local_log(self) -> sc.LocalLog:
        d = self.disk
        return sc.LocalLog(tuple(d.epochs), 0, d.max, d.confirm, d.flushed)

    def _follow(self, role: roles.Role) -> None:
        self.sim.tr("b%d follows b%d of epoch %d", self.bid, role.master_id, role.master_epoch)
        self.slave = sc.SlaveCore(role.master_id, role.master_epoch, True, unclean_epoch=role.unclean_epoch)
        self.connect()

    def _stop_slave(self) -> None:
        self.slave = None
        self.sbusy = False
        self.sbacklog.clear()
        if self.sconn is not None:
            self.sim.break_conn(self.sconn, 20)
            self.sconn = None

    def _reconnect(self) -> None:
        if self.sconn is None and self.slave is not None and not self.stopped:
            self.connect()

    def connect(self) -> None:
        if self.slave is None:
            return
        master = self.world.brokers[self.slave.master_id]
        conn = Conn(master, self)
        self.sconn = conn
        self.sim.conn_send(conn, self, master, master.on_ha_handshake, conn, self.bid)

    def on_ha_reply(
        self, conn: Conn, epoch: int, mmin: int, mmax: int, mepochs: tuple[tuple[int, int], ...]
    ) -> None:
        if conn is not self.sconn or self.slave is None:
            return

        def answered() -> sc.Event:
            conn.answered = True  # the ticks' acks queue behind this answer's actions
            return sc.MasterAnswered(epoch, mmin, mmax, mepochs, self._local_log())

        self._slave_event(conn, answered, ())

    def on_transfer(
        self, conn: Conn, off: int, epoch: int, start: int, confirm: int, length: int, recs: Any
    ) -> None:
        if conn is not self.sconn or self.slave is None:
            return
        self._slave_event(
            conn, lambda: sc.TransferArrived(off, epoch, start, confirm, length, self._local_log()), recs
        )

    def _slave_event(self, conn: Conn, make: Callable[[], sc.Event], recs: Any) -> None:
        if self.sbusy:
            self.sbacklog.append((conn, make, recs))
            return
        if conn is not self.sconn or self.slave is None:
            return
        self.run_slave(conn, self.slave.step(make(), self.local()), 0, recs)

    def _slave_idle(self) -> None:
        self.sbusy = False
        while self.sbacklog and not self.sbusy:
            conn, make, recs = self.sbacklog.pop(0)
            self._slave_event(conn, make, recs)

    def run_slave(self, conn: Conn, actions: list[sc.Action], i: int, recs: Any) -> None:
        """Carry out the slave core's actions in order; an fsync suspends them until it is done."""
        try:
            while i < len(actions) and conn is self.sconn:
                action = actions[i]
                i += 1
                if isinstance(action, sc.AwaitFlush):
                    self.sbusy = True
                    self.flush(action.offset, functools.partial(self.run_slave, conn, actions, i, recs))
                    return
                self._slave_action(conn, action, recs)
        except DiskFailed as exc:
            self.fail_stop(str(exc))
            return
        self._slave_idle()

    def _slave_action(self, conn: Conn, action: sc.Action, recs: Any) -> None:
        match action:
            case sc.Refuse(kind, reason):
                self.sim.tr("b%d refuses b%d: %s (%s)", self.bid, conn.master.bid, kind, reason)
                self.sim.break_conn(conn, 20)
                self.sconn = None
                self.after(RECONNECT, self._reconnect)
            case sc.Truncate(to):
                self.sim.tr(
                    "b%d truncates to %d (max %d confirm %d)", self.bid, to, self.disk.max, self.disk.confirm
                )
                self.disk.truncate(to)
            case sc.RecordEpoch(epoch, start):
                self.disk.record_epoch(epoch, start)
            case sc.Append():
                for r in recs:
                    self.disk.append(r)
            case sc.Ack(offset):
                self.world.checker.on_slave_ack(self.disk, offset)
                self.sim.conn_send(conn, self, conn.master, conn.master.on_ha_ack, conn, self.bid, offset)
            case sc.SetConfirm(offset):
                self.disk.set_confirm(offset)
            case sc.StartAt(offset):
                raise AssertionError(f"StartAt({offset}): retention is not modelled")
