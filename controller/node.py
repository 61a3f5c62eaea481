"""One controller process: the Raft node, the gRPC server and the leader-only loop.

The leader loop is the only place the controller acts without a request:
- on gaining leadership it opens one heartbeat timeout of grace (heartbeats are not in Raft; this
  node knows only the copies brokers sent it as a follower, so within the grace a master is
  failed over only on silence a continuously heard member witnessed: RULES.md L4) and commits a
  barrier so that its replica has applied every earlier entry before it serves writes;
- then, every tick, it expires heartbeats and runs a controller-triggered election for each
  broker set whose master stopped heartbeating, and for each set left without a master whose
  electable broker is alive again.

Every reply carries the node's cluster epoch (`tidelog/clusterepoch.py`) in its initial
metadata, sent before any check so that refusals carry it too; brokers and clients refuse the
answers of an older epoch (a controller a forced quorum recovery replaced), and the node refuses
the calls of a caller that names a newer one, before anything acts on them.

Clocks: liveness uses the monotonic clock (each node's memory only); commands carry wall-clock
`now_ms`, which is only recorded, never compared across nodes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import grpc

from tidelog import gcpolicy, logs, loops, private, tlsconfig
from tidelog.acl import AclState
from tidelog.clusterauth import CALL_KEY, ReplayCache, check_call, new_secret, require_real_secret
from tidelog.clusterauth import SECRET_ENV as CLUSTER_SECRET_ENV
from tidelog.clusterepoch import CALLER_EPOCH_KEY, EPOCH_KEY, refuse_caller, reply_epoch
from tidelog.controller import service
from tidelog.controller import state as st
from tidelog.controller.config import ControllerConfig
from tidelog.controller.election import elect as choose_master
from tidelog.controller.ledgerview import LedgerView
from tidelog.controller.liveness import HeartbeatTable, heartbeat_problem
from tidelog.controller.metrics import ControllerMetrics
from tidelog.controller.placement import (
    LedgerPlacement,
    PlacementMonitor,
    Violation,
    audit,
    required_datacenters,
)
from tidelog.controller.raft import RaftNode
from tidelog.errors import ConfigError, ControllerNotLeaderError, UnauthenticatedError, UnavailableError
from tidelog.guard import CLUSTER_TOKEN, Guard, RefusalLog, SafeDecode, with_clear_keys
from tidelog.ha.lease import LeaseFences, grants_lease, handover_wait_ms
from tidelog.ha.rpobound import grant, held_by_every_node
from tidelog.metrics import watch_auth_refusals
from tidelog.proto import controller_pb2 as pb
from tidelog.tasks import cancel_and_wait, within
from tidelog.wire import SERVER_OPTIONS, abort_with, bind_problem, make_error

log = logging.getLogger(__name__)

# A broker's offsets enter the Raft log at most this often (or at once on a new epoch): they are
# a hint for operators and for elections after a leader change, not a per-heartbeat record.
REPORT_INTERVAL_MS = 30_000
# After a controller-triggered election that found nobody, wait this long before trying again.
ELECTION_RETRY_MS = 1_000
# How often at most a controller moves its state's growth out of the collector's reach
# (tidelog/gcpolicy.py): a pass over the young generations, a few milliseconds.
SETTLE_INTERVAL_S = 1.0
# How long a leader tick spends on the audit's ledger view while it catches up, in refreshes of
# a few milliseconds each (a slice of a scan, or DECODE_BUDGET decodes) with the event loop and
# Raft's apply running between them. Without such a bound the catch-up took most of the
# controller's interpreter for seconds and a recovery open took 340 ms (bench/RESULTS.md); at
# 40 ms a tick, a new leader's view of a million ledgers fills in about a minute, as when the
# audit decoded 20,000 a second in one piece.
CATCH_UP_MS = 40


BROKER_SERVICE = "tidelog.controller.v1.ControllerBroker"
#: Admin methods whose handler checks the cluster secret's token itself, for the broker set it
#: acts on (service.py: `node.authenticate`).
HANDLER_SIGNED = frozenset({"ElectMaster", "CleanBrokerData", "DecommissionBroker", "RepairPlacement"})


class EpochInterceptor(grpc.aio.ServerInterceptor):
    """Sends this node's cluster epoch as initial metadata of every reply, before the call is
    checked or served (controller RPCs are all unary), and refuses a caller that has seen a newer
    one (CLUSTER_EPOCH_FENCED, `clusterepoch.refuse_caller`) before anything acts on its call."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.metadata = ((EPOCH_KEY, str(epoch)),)
        self._warned: set[int] = set()  # the callers' epochs already logged: one line each

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        metadata = self.metadata
        method = details.method

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.send_initial_metadata(metadata)
            refused = refuse_caller(self.epoch, reply_epoch(context.invocation_metadata(), CALLER_EPOCH_KEY))
            if refused is not None:
                if refused.details["seen_epoch"] not in self._warned:
                    self._warned.add(refused.details["seen_epoch"])
                    log.warning("refused %s from %s: %s", method, context.peer(), refused)
                await abort_with(context, refused)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )


def wall_ms() -> int:
    return int(time.time() * 1000)


def mono_ms() -> int:
    return int(time.monotonic() * 1000)


class ControllerNode:
    def __init__(self, cfg: ControllerConfig) -> None:
        if sys.flags.optimize:
            # PySyncObj checks what arrives on the Raft port with `assert`s, which -O removes.
            raise ConfigError(
                "a controller does not run under `python -O`: its Raft library checks the "
                "messages of its peers with asserts, which -O removes",
                hint="start it without -O",
            )
        # the Raft journal holds the users' (wrapped) keys and the cluster's history: private
        private.require_private(cfg.data_dir, "controller data directory")
        private.require_private(cfg.node_dir, "controller node directory")
        if cfg.tls is not None:
            private.require_private(cfg.tls.key, "TLS key (tls.key)")
        cfg = with_secret(cfg)
        require_real_secret(cfg.secret or "")
        self.cfg = cfg
        self.secret: str = cfg.secret or ""
        # TLS on the gRPC port, reloaded on SIGHUP (tidelog/tlsconfig.py); None: plain text
        self.tls = tlsconfig.ServerTls(cfg.tls) if cfg.tls is not None else None
        self._replays = ReplayCache()
        # refused calls: logged a few a second per peer, counted by reason (tidelog_auth_refused_total)
        self.refusals = RefusalLog()
        self._acl = AclState()
        self._acl_read = False
        # the users-and-grants version each broker last said it holds (its heartbeats' acl_version)
        self._acl_applied: dict[tuple[str, int], int] = {}
        logs.identify(lambda: {"node_id": cfg.node_id})  # until the Raft node exists
        self.raft = RaftNode(cfg)
        logs.identify(lambda: {"node_id": cfg.node_id, "term": self.raft.term()})
        self.heartbeats = HeartbeatTable(cfg.heartbeat_timeout_ms)
        self.lease_fences = LeaseFences()  # RULES.md L7: masters whose lease an election stopped
        # RULES.md L10: per broker set, (master id, master epoch, the highest offset of its reports
        # every node's log was seen to hold)
        self._rpo_held: dict[str, tuple[int, int, int]] = {}
        self._led_term: int | None = None
        self._ready_term: int | None = None
        self._barrier: asyncio.Task[None] | None = None
        self._last_report: dict[tuple[str, int], tuple[int, int]] = {}  # -> (epoch, mono ms)
        self._election_tried: dict[str, int] = {}
        self.placement = PlacementMonitor()
        self._ledgers = LedgerView()  # the placement audit's view of the ledgers
        # (mono ms, broker set, ledger metadata key, ((old, new), ...)): re-replications this node made
        self.ledger_repairs: collections.deque[tuple[int, str, str, tuple[tuple[int, int], ...]]] = (
            collections.deque(maxlen=100)
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self.mono_ms = mono_ms

    # --- used by the servicers ------------------------------------------------------------

    def authenticate(
        self,
        context: Any,
        method: str,
        request: Any,
        *,
        broker_set: str | None = None,
        broker_id: int | None = None,
    ) -> None:
        """Refuse a membership-changing call that does not prove the cluster secret (for the
        broker set and broker id it acts on, when given). Logged with the peer's address."""
        token = dict(context.invocation_metadata() or ()).get(CALL_KEY)
        try:
            ident = check_call(
                self.secret,
                token,
                method,
                request.SerializeToString(deterministic=True),
                wall_ms(),
                self._replays,
            )
            if broker_set is not None and ident.broker_set != broker_set:
                raise UnauthenticatedError(f"signed for broker set {ident.broker_set!r}, not {broker_set!r}")
            if broker_id is not None and ident.broker_id != broker_id:
                raise UnauthenticatedError(f"signed for broker {ident.broker_id}, not {broker_id}")
        except UnauthenticatedError as exc:
            self.refusals.note(context.peer(), CLUSTER_TOKEN, f"{method}: {exc.message}")
            raise

    def acl_table(self) -> AclState:
        """The users and grants of this replica, rebuilt only when their version moved."""
        with self.raft.read() as state:
            if state.acl_version != self._acl.version or not self._acl_read:
                self._acl = with_clear_keys(state.acl_table(), self.secret)
                self._acl_read = True
        return self._acl

    def note_acl_version(self, broker_set: str, broker_id: int, version: int) -> None:
        """A broker's heartbeat said which users-and-grants version it enforces (the latest word
        counts: a restarted broker starts again from none)."""
        self._acl_applied[(broker_set, broker_id)] = version

    async def wait_acl_applied(self) -> list[str]:
        """After a change to users or grants: wait until every alive broker enforces it, at most two
        heartbeat intervals and a half second, 2.5 s at most (the table rides on the next reply, the broker says
        so in the heartbeat after). Returns the brokers ("set/id") still behind, so that the
        caller is told instead of meeting a refusal the change was meant to lift."""
        with self.raft.read() as state:
            version = state.acl_version
            names = sorted(state.broker_sets)
        # within a client's per-call timeout (3 s), so that a slow broker never turns into a retry
        deadline = mono_ms() + min(2 * self.cfg.heartbeat_interval_ms + 500, 2500)
        while True:
            now = mono_ms()
            behind = [
                f"{name}/{bid}"
                for name in names
                for bid in sorted(self.heartbeats.alive(name, now))
                if self._acl_applied.get((name, bid), -1) < version
            ]
            if not behind or now >= deadline:
                return behind
            await asyncio.sleep(0.05)

    def member_call(self, method: str, metadata: Mapping[str, str], request: Any) -> bool:
        """Whether a call carries the cluster secret's token (tidelog.guard.MemberCheck): such a
        call is the cluster itself. Methods whose handler checks the token (for the broker set it
        acts on) pass it on unchecked here: checking twice would see the second as a replay."""
        if CALL_KEY not in metadata:
            return False
        name = method.rpartition("/")[2]
        if name in HANDLER_SIGNED:
            return True
        ident = check_call(
            self.secret,
            metadata[CALL_KEY],
            name,
            request.SerializeToString(deterministic=True),
            wall_ms(),
            self._replays,
        )
        log.debug("%s signed with the cluster secret by %s", name, ident)
        return True

    def require_leader(self) -> None:
        if not self.raft.is_leader():
            raise ControllerNotLeaderError(leader=self.raft.leader_grpc())

    async def write(self, build: Callable[[int, HeartbeatTable], Any]) -> st.Result:
        """Build a command (on the leader, with its clock and liveness) and replicate it."""
        self.require_leader()
        await self.ensure_ready()
        cmd = build(wall_ms(), self.heartbeats)
        result = await self.raft.propose(cmd)
        if not result.ok:
            raise make_error(result.code, result.message)
        return result

    def alive_ids(self, broker_set: str) -> set[int] | None:
        """Alive broker ids of a set, or None when this node is not the leader (it cannot know)."""
        if not self.raft.is_leader():
            return None
        return set(self.heartbeats.alive(broker_set, mono_ms()))

    def observe(self, broker_set: str, broker_id: int, req: pb.HeartbeatRequest) -> None:
        """Record a heartbeat copy sent to this follower (RULES.md L0), so that if it becomes leader
        it already knows who fell silent. Claims its own replica cannot check yet (it may lag the
        leader) only prove the broker lives."""
        now = mono_ms()
        with self.raft.read() as state:
            bs = state.broker_sets.get(broker_set)
            if bs is None or broker_id not in bs.members:
                return
            problem = heartbeat_problem(bs.master_epoch, req.epoch, req.max_offset, req.confirm_offset)
        if problem is not None:
            self.heartbeats.touch(broker_set, broker_id, now)
        else:
            self._record(broker_set, broker_id, req, now)

    def _record(self, broker_set: str, broker_id: int, req: pb.HeartbeatRequest, now: int) -> None:
        kwargs = {"priority": req.priority} if req.HasField("priority") else {}
        self.heartbeats.beat(
            broker_set, broker_id, req.epoch, req.max_offset, req.confirm_offset, now, **kwargs
        )

    def beat(self, broker_set: str, broker_id: int, req: pb.HeartbeatRequest, report: bool) -> None:
        now = mono_ms()
        self._record(broker_set, broker_id, req, now)
        if not report:
            return
        key = (broker_set, broker_id)
        last = self._last_report.get(key)
        if (
            last is not None
            and last[0] == req.epoch
            and now - last[1] < self._report_interval(broker_set, broker_id)
        ):
            return
        self._last_report[key] = (req.epoch, now)
        cmd = st.ReportOffsets(
            broker_set=broker_set, broker_id=broker_id, epoch=req.epoch, max_offset=req.max_offset
        )
        self._spawn(self._report(cmd))

    def _report_interval(self, broker_set: str, broker_id: int) -> int:
        """How often a broker's offsets enter the Raft log (ms): a master alone in its SyncStateSet
        holds the only copy of what it acknowledges, so its record (what `tide admin elect
        --unclean` counts as the RPO of losing it) follows every heartbeat that moved it."""
        with self.raft.read() as state:
            bs = state.broker_sets.get(broker_set)
            alone = bs is not None and bs.master_id == broker_id and bs.sync_state_set == {broker_id}
        return 0 if alone else REPORT_INTERVAL_MS

    async def _report(self, cmd: st.ReportOffsets) -> None:
        try:
            await self.raft.propose(cmd)
        except Exception as exc:  # a hint only; the next heartbeat reports again
            log.debug("broker set %s: broker %d offsets not recorded: %s", cmd.broker_set, cmd.broker_id, exc)

    # --- leadership -----------------------------------------------------------------------

    async def ensure_ready(self) -> None:
        """Wait until this leader's replica has applied everything committed before its term."""
        term = self.raft.term()
        if self._ready_term == term:
            return
        if self._barrier is None or self._barrier.done():
            self._barrier = asyncio.ensure_future(self._run_barrier(term))
            # Callers see its failure through shield(); mark it retrieved so asyncio does not warn.
            self._barrier.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await within(asyncio.shield(self._barrier), 5.0)
        except TimeoutError:
            raise UnavailableError("the new controller leader is still catching up") from None
        if self._ready_term != self.raft.term():
            self.require_leader()
            raise UnavailableError("controller leadership changed while catching up")

    async def _run_barrier(self, term: int) -> None:
        await self.raft.barrier(term)
        if self.raft.term() == term and self.raft.is_leader():
            if self._led_term != term:
                # before the term answers anything: the leader loop may not have run yet, and its
                # start of term later would clear the lease fences of elections already in flight
                self._take_term(term, mono_ms())
            self._ready_term = term
            log.info("controller %s leads term %d and has caught up", self.cfg.node_id, term)

    def _take_term(self, term: int, now: int) -> None:
        """Start leading `term`: grace for every broker, and no fence or retry of an earlier term.
        Runs once per term, before the term answers a request (`ensure_ready`) or acts on its own."""
        self._led_term = term
        self.heartbeats.on_leadership(now)
        self._election_tried.clear()
        self.lease_fences.clear()
        log.info(
            "controller %s became leader in term %d; brokers get %d ms of grace",
            self.cfg.node_id,
            term,
            self.cfg.heartbeat_timeout_ms,
        )
        ident = self.raft.identity
        lost = ident.presumed_lost(self.cfg.node_id) if ident is not None else ()
        if lost:
            log.warning(
                "controller %s: datacenter(s) %s declared lost at the recovery: their silent "
                "masters are failed over without the grace (RULES.md L8)",
                self.cfg.node_id,
                ", ".join(lost),
            )

    async def leader_tick(self) -> None:
        self.raft.persist_members()
        if not self.raft.is_leader():
            if self._led_term is not None:
                log.info("controller %s no longer leads (term %d)", self.cfg.node_id, self._led_term)
                self._led_term = None
                self._ready_term = None
            return
        term = self.raft.term()
        now = mono_ms()
        if self._led_term != term:
            self._take_term(term, now)
        elif self.heartbeats.on_tick(now):
            # RULES.md L9: paused (or starved) for a while; the silence in the table is our own
            log.warning(
                "controller %s leader loop was not running for %d ms or more; brokers get %d ms of grace",
                self.cfg.node_id,
                self.heartbeats.tick_gap_ms,
                self.cfg.heartbeat_timeout_ms,
            )
        self._presume_lost(now)
        await self.ensure_ready()
        self.heartbeats.expire(now)
        with self.raft.read() as state:
            # Dead masters, and sets left masterless by a failed election whose SyncStateSet
            # member (or, if unclean election is on, any member) is alive again.
            names = sorted(
                set(self.heartbeats.masters_needing_election(state, now))
                | set(
                    self.heartbeats.leaderless_sets_electable(
                        state, now, self.cfg.enable_elect_unclean_master
                    )
                )
            )
        for name in names:
            tried = self._election_tried.get(name)
            if tried is not None and now - tried < ELECTION_RETRY_MS:
                continue
            self._election_tried[name] = now
            await self._elect(name, now)
        audited = self.placement.audited_ms
        due = audited is None or now - audited >= self.cfg.placement_audit_interval_ms
        if due and not self.heartbeats.in_grace(now):
            self.audit_placement(now)
        await self.catch_up_ledgers()

    async def catch_up_ledgers(self, spend_ms: float = CATCH_UP_MS) -> None:
        """Move the placement audit's view of the ledgers on by small refreshes for about
        `spend_ms` (controller/ledgerview.py), the event loop and Raft's apply running between
        them: a new leader's view of a million ledgers fills without stopping either for long."""
        until = self.mono_ms() + spend_ms
        while self._ledgers.busy and self.mono_ms() < until:
            with self.raft.read() as state:
                self._ledgers.refresh(state)
            await asyncio.sleep(0)

    def _presume_lost(self, now: int) -> None:
        """Tell the heartbeat table which datacenters the forced recovery declared lost (RULES.md L8),
        from when no lease granted before the recovery command can still hold; none once the
        recovered cluster has grown again."""
        ident = self.raft.identity
        lost = ident.presumed_lost(self.cfg.node_id) if ident is not None else ()
        if not lost:
            self.heartbeats.presume_lost(frozenset())
            return
        # the lost master's last lease came from a heartbeat sent before the cut, which precedes the
        # recovery command: it has run out `handover_wait_ms` after the command started (wall clock,
        # the same host's), here turned into this node's monotonic clock
        settled = ident.recovered_at_ms + handover_wait_ms(self.cfg.heartbeat_timeout_ms)
        self.heartbeats.presume_lost(frozenset(lost), now + max(0, settled - wall_ms()))

    def audit_placement(self, now: int) -> list[Violation]:
        """Audit placement (RULES.md PL1-PL6) with this node's liveness; log what opened and cleared.
        Not within a new leader's grace (L4): it would report live brokers as down."""
        self.require_liveness(now)
        with self.raft.read() as state:
            names = set(state.broker_sets) | set(self.cfg.placement)
            alive = {name: self.heartbeats.alive(name, now) for name in names}
            self._ledgers.refresh(state)
            violations = audit(state, self.cfg.placement, alive, ledger_groups=self._ledgers.groups())
        opened, cleared = self.placement.step(violations, now)
        for v in opened:
            log.warning("placement: %s %s violates %s: %s", v.kind, v.name, v.code, v.reason)
        for v in cleared:
            log.info("placement: %s %s no longer violates %s", v.kind, v.name, v.code)
        return violations

    def require_liveness(self, now: int) -> None:
        """Refuse (retryably) what needs to know who is alive while a new leader's grace lasts (L4)."""
        if self.heartbeats.in_grace(now):
            raise UnavailableError(
                "the controller leader changed moments ago and does not know yet which brokers are alive",
                hint="try again in a few seconds",
            )

    def required_datacenters(self, bs: st.BrokerSet) -> tuple[str, ...]:
        """The datacenters `bs` must span (RULES.md PL1), from this node's `placement` config."""
        return required_datacenters(self.cfg.placement.get(bs.name), bs)

    def ledger_placements(self, state: st.ControllerState) -> list[LedgerPlacement]:
        """Every ledger's placement, by key, decoding only metadata that changed since the last
        audit (controller/ledgerview.py); the caller holds the state's read lock."""
        self._ledgers.complete(state)
        return self._ledgers.placements()

    async def propose_election(
        self, name: str, build: Callable[[int], st.ElectMaster], *, hand_over_to: int | None = None
    ) -> st.Result:
        """Propose an election of `name` behind a lease fence (RULES.md L7): the set's master gets
        no lease renewed from before `build` (given the wall clock) decides until Raft has settled
        the command. A designated election (`hand_over_to`) that replaces a master this node still
        hears first waits out the last lease that master was granted, and is then decided again."""
        with self.raft.read() as state:
            bs = state.broker_sets.get(name)
            epoch, master = (bs.master_epoch, bs.master_id) if bs is not None else (0, None)
        token = self.lease_fences.hold(name, epoch)
        try:
            cmd = build(wall_ms())
            live = master is not None and self.heartbeats.is_alive(name, master, mono_ms())
            if (
                hand_over_to is not None
                and live
                and master != hand_over_to
                and self._would_elect(name, cmd, hand_over_to)
            ):
                wait_ms = handover_wait_ms(self.cfg.heartbeat_timeout_ms)
                log.info(
                    "broker set %s: handing over from master %s (epoch %d) to broker %d once its lease ends (%d ms)",
                    name,
                    master,
                    epoch,
                    hand_over_to,
                    wait_ms,
                    extra={"broker_set": name, "broker_id": master, "epoch": epoch},
                )
                await asyncio.sleep(wait_ms / 1000)
                if not self.lease_fences.withholds(name, epoch):
                    # a new term cleared the fence meanwhile: leases may have been granted since
                    raise UnavailableError(
                        "controller leadership changed during the hand-over",
                        hint="ask for the election again",
                    )
                cmd = build(wall_ms())  # who is alive now, after the wait
        except BaseException:
            self.lease_fences.release(token)
            raise
        return await self.raft.propose(cmd, settled=lambda: self.lease_fences.release(token))

    def _would_elect(self, name: str, cmd: st.ElectMaster, broker_id: int) -> bool:
        """Whether `cmd` would make `broker_id` master now (the election policy on this node's
        state and liveness): a hand-over that will be refused anyway (the broker is not an alive
        in-sync member) is answered at once, with nothing to wait out."""
        with self.raft.read() as state:
            bs = state.broker_sets.get(name)
            if bs is None or broker_id not in bs.members:
                return False
            alive = {i: info for i, info in cmd.alive.items() if i in bs.members}
            winner = choose_master(
                bs.sync_state_set, bs.members.keys(), bs.master_id, broker_id, alive, cmd.enable_unclean
            )
        return winner == broker_id

    def ack_bound(
        self, name: str, master_id: int, master_epoch: int, recorded: int, recorded_at: int
    ) -> int | None:
        """The offset the master of `name` may acknowledge up to while alone in its SyncStateSet
        (RULES.md L10), or None without `rpo_bound_bytes`. `recorded` is its last reported max
        offset in this node's state, which held it by Raft index `recorded_at`."""
        if not self.cfg.rpo_bound_bytes:
            return None
        mid, epoch, previous = self._rpo_held.get(name, (master_id, master_epoch, -1))
        if (mid, epoch) != (master_id, master_epoch):
            previous = -1
        held = held_by_every_node(recorded, recorded_at, self.raft.every_node_index(), previous)
        self._rpo_held[name] = (master_id, master_epoch, held)
        return grant(held, self.cfg.rpo_bound_bytes)

    def lease_withheld(self, name: str, master_epoch: int) -> bool:
        """Whether a heartbeat reply to the master of `name` at `master_epoch` renews no lease: this
        leader's majority is not fresh (a cut-off leader, ha/lease.py::grants_lease) or an election
        of the set is in flight (RULES.md L7)."""
        fresh = grants_lease(self.raft.majority_contact_age_ms(), self.cfg.heartbeat_timeout_ms)
        return not fresh or self.lease_fences.withholds(name, master_epoch)

    async def _elect(self, name: str, now: int) -> None:
        with self.raft.read() as state:
            bs = state.broker_sets.get(name)
            old = (bs.master_id, bs.master_epoch) if bs else (None, 0)
        result = await self.propose_election(
            name,
            lambda wall: st.ElectMaster(
                broker_set=name,
                broker_id=None,
                designated=False,
                alive=self.heartbeats.alive(name, now),
                enable_unclean=self.cfg.enable_elect_unclean_master,
                now_ms=wall,
            ),
        )
        with self.raft.read() as state:
            bs = state.broker_sets.get(name)
            new = (bs.master_id, bs.master_epoch, sorted(bs.sync_state_set)) if bs else (None, 0, [])
        if result.ok:
            why = "stopped heartbeating" if old[0] is not None else "was missing"
            log.warning(
                "broker set %s: master %s %s; elected broker %s at epoch %d, SyncStateSet %s",
                name,
                old[0],
                why,
                new[0],
                new[1],
                new[2],
                extra={"broker_set": name, "broker_id": new[0], "epoch": new[1]},
            )
        else:
            log.warning(
                "broker set %s: master %s (epoch %d) stopped heartbeating and no broker could be "
                "elected: %s %s (epoch now %d)",
                name,
                old[0],
                old[1],
                result.code,
                result.message,
                new[1],
                extra={"broker_set": name, "epoch": new[1]},
            )

    async def _leader_loop(self, stop: asyncio.Event) -> None:
        period = min(0.25, self.cfg.heartbeat_interval_ms / 2000)
        # the state's growth (topics, ledgers) moved out of the collector's reach as it comes
        settle = gcpolicy.Settle(SETTLE_INTERVAL_S)
        while not stop.is_set():
            try:
                await self.leader_tick()
            except (ControllerNotLeaderError, UnavailableError) as exc:
                log.info("leader loop: %s", exc)
            except Exception:
                log.exception("leader loop failed; retrying")
            if settle.due(self.raft.state_changes, time.monotonic()):
                gcpolicy.settle()
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), period)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- process --------------------------------------------------------------------------

    async def serve(self, stop: asyncio.Event) -> None:
        metrics = ControllerMetrics(self) if self.cfg.self_node.metrics_address else None
        # the epoch first: a call refused by a later interceptor still names its cluster epoch;
        # then the guard: it hands the calls it admits, parsed, to the timer and the handlers
        interceptors: list[grpc.aio.ServerInterceptor] = [EpochInterceptor(self.raft.cluster_epoch)]
        if self.cfg.auth is not None:
            # every call of the client-facing services, one place (ControllerBroker: members only,
            # each of its calls proves the cluster secret itself)
            members = frozenset({BROKER_SERVICE})
            interceptors.append(
                Guard(self.cfg.auth, self.acl_table, self.member_call, members, self.refusals)
            )
        else:  # a request that does not parse: one line, not a traceback per call
            interceptors.append(SafeDecode(frozenset({BROKER_SERVICE}), self.refusals))
        if metrics is not None:
            interceptors.append(metrics.interceptor())
            ident = (self.cfg.node_id,)
            watch_auth_refusals(metrics.registry, self.refusals.refusals, ("node_id",), lambda: ident)
        server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
        service.add_to_server(server, self)
        address = self.cfg.self_node.grpc
        problem = bind_problem(address)  # before gRPC tries: its C core would log its own lines
        if problem is not None:
            self.raft.close()
            raise UnavailableError(
                f"cannot listen on the gRPC address {address}: {problem}",
                hint="another process holds the port; stop it or change nodes[].grpc",
            )
        try:
            bound = tlsconfig.add_grpc_port(server, address, self.tls)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            self.raft.close()
            raise UnavailableError(
                f"cannot listen on the gRPC address {address}: {exc}",
                hint="another process holds the port; stop it or change nodes[].grpc",
            ) from None
        if not bound:
            self.raft.close()
            raise UnavailableError(f"cannot listen on the gRPC address {address}", hint="is the port in use?")
        await server.start()
        if metrics is not None:
            try:
                await metrics.start(self.cfg.self_node.metrics_address)
            except ConfigError:
                await server.stop(0)
                self.raft.close()
                raise
        log.info(
            "controller %s serving gRPC%s on %s (raft %s, members %s, cluster epoch %d)",
            self.cfg.node_id,
            " with TLS" if self.tls is not None else "",
            address,
            self.cfg.self_node.raft,
            list(self.raft.members()),
            self.raft.cluster_epoch,
        )
        gcpolicy.after_start(f"controller {self.cfg.node_id}")
        loop_task = asyncio.ensure_future(self._leader_loop(stop))
        try:
            await stop.wait()
        finally:
            log.info("controller %s stopping", self.cfg.node_id)
            await cancel_and_wait(loop_task)
            await server.stop(1.0)
            if metrics is not None:
                await metrics.close()
            for t in list(self._tasks):
                t.cancel()
            self.raft.close()


def with_secret(cfg: ControllerConfig) -> ControllerConfig:
    """The config with a cluster secret: a configured one, or for a single node one generated once
    and kept in its data dir (mode 0600). The Raft port never runs unauthenticated (an
    unauthenticated PySyncObj port unpickles whatever it is sent), and brokers prove the same
    secret; a generated one must be given to them. Several nodes must be configured with one."""
    if cfg.secret:
        return cfg
    if len(cfg.nodes) > 1:
        raise ConfigError(
            f"a {len(cfg.nodes)}-node controller needs a cluster secret (key 'secret' or "
            f"${CLUSTER_SECRET_ENV}), the same on every node and broker",
            key="secret",
        )
    path = cfg.node_dir / "cluster.secret"
    private.private_dir(cfg.node_dir)
    private.require_private(path, "cluster secret file")
    if not path.exists():
        fd = private.open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w") as f:
            f.write(new_secret())
            f.flush()
            os.fsync(f.fileno())
    secret = path.read_text().strip()
    log.warning(
        "no cluster secret configured: using the one generated in %s; brokers must be given the same "
        "(key 'secret' or $%s)",
        path,
        CLUSTER_SECRET_ENV,
    )
    return replace(cfg, secret=secret)


def run(cfg: ControllerConfig) -> None:
    """Run a controller node until SIGTERM/SIGINT; SIGHUP reloads its TLS certificate."""
    private.restrict_umask()  # PySyncObj creates the journal and snapshots: private too

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        node = ControllerNode(cfg)
        loop.add_signal_handler(signal.SIGHUP, tlsconfig.reload_on_signal, node.tls)
        await node.serve(stop)

    loops.run(main())
