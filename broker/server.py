"""The broker process: open the store, register with the controller, serve, follow role changes.

`run(cfg)` is what `tide broker --config FILE` runs. Start-up order matters: the identity file
is checked before the commit log opens (a wiped directory must not come back under its old id),
the listeners are bound before registering (the controller hands out these addresses), and the
broker registers before it heartbeats. The heartbeat loop reports (last epoch, max offset,
confirm offset) every interval and applies the role in each reply; when the set has no master
it asks for an election (a broker-triggered election, which the controller validates).
SIGTERM/SIGINT stop the broker cleanly: servers first, then replication, then the commit log.
SIGHUP reloads the TLS certificate (tidelog/tlsconfig.py) without stopping anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import grpc

from tidelog import gcpolicy, logs, loops, private, tlsconfig
from tidelog.acl import AclState, Grant, User
from tidelog.broker import fdlimit, identity, lookups
from tidelog.broker.config import BrokerConfig
from tidelog.broker.dataport import DataPort
from tidelog.broker.ledger_service import LedgerService
from tidelog.broker.metrics import IDENTITY, BrokerMetrics
from tidelog.broker.replica import MASTER, Replica, Role
from tidelog.broker.retention import RetentionLoop
from tidelog.broker.rocketmq import RocketMQEndpoint
from tidelog.broker.scrub import DAMAGED_PRIORITY, Scrubber
from tidelog.broker.service import BrokerService
from tidelog.client.controllers import SEEN_EPOCH_FILE, ControllerClient
from tidelog.clusterauth import CALL_KEY, ReplayCache, check_call
from tidelog.commitlog import CommitLog
from tidelog.errors import (
    ClusterMismatchError,
    ConfigError,
    ControllerBrokerIdInvalidError,
    MetadataNotFoundError,
    NoSuchLedgerExistsError,
    TidelogError,
)
from tidelog.guard import Guard, SafeDecode, with_clear_keys
from tidelog.ha.syncstate import Proposal
from tidelog.ledger.metadata import LedgerMetadata
from tidelog.ledger.params import ledger_key
from tidelog.metrics import watch_auth_refusals
from tidelog.proto import broker_pb2_grpc, ledger_pb2_grpc
from tidelog.tasks import cancel_and_wait, within
from tidelog.wire import SERVER_OPTIONS, bind_problem

log = logging.getLogger(__name__)

# A broker whose store failed retries opening it once this much space is free again.
MIN_FREE_BYTES = 1 << 20
#: the least time between heartbeats a waiting write asks for (`heartbeat_loop`)
EARLY_BEAT_GAP_S = 0.05


class BrokerServer:
    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        logs.identify(lambda: {"broker_set": cfg.broker_set})  # until the replica exists
        # the log, the identity and the key are the cluster's: no other local account reads them
        private.require_private(cfg.data_dir, "data directory")
        if cfg.tls is not None:
            private.require_private(cfg.tls.key, "TLS key (tls.key)")
        self.ident = identity.load_or_create(cfg.data_dir, cfg.broker_set)
        # the consume queues' descriptor bound, under an open-file limit raised for it
        self.cq_max_open_files = fdlimit.fit_cq_bound(cfg.cq_max_open_files)
        self.log = CommitLog.open(
            cfg.data_dir,
            segment_bytes=cfg.segment_bytes,
            flush=cfg.flush,
            flush_interval_ms=cfg.flush_interval_ms,
            max_message_bytes=cfg.max_message_bytes,
            cq_max_open_files=self.cq_max_open_files,
        )
        # one certificate for the gRPC, data and HA ports, reloaded on SIGHUP
        self.tls = tlsconfig.ServerTls(cfg.tls) if cfg.tls is not None else None
        self.controller = ControllerClient(
            cfg.controllers,
            rpc_timeout=2.0,
            total_timeout=5.0,
            secret=cfg.secret,
            tls=tlsconfig.member_client(cfg.tls),
            member=True,  # every call proves the cluster secret: a member is not a user
            # controllers of an older cluster epoch than this broker saw are refused (RUNBOOK-quorum)
            epoch_file=cfg.data_dir / SEEN_EPOCH_FILE,
        )
        self._replays = ReplayCache()
        # the cluster's routes as the controllers last said, answered to clients (broker/lookups.py)
        self.lookups = lookups.ClusterViewCache()
        self.replica = Replica(
            cfg,
            self.log,
            broker_id=self.ident.broker_id if self.ident.broker_id is not None else -1,
            propose=self._alter,
        )
        self.replica.ledgers.metadata_source = self._ledger_metadata
        # with auth on: users' calls are signed and permitted (tidelog/guard.py), on the gRPC and data ports
        # refused calls and connections: a few lines a second per peer, counted by reason
        self.refusals = self.replica.refusals  # the HA port's too
        self.guard = (
            Guard(cfg.auth, lambda: self.replica.acl, self.member_call, refusal_log=self.refusals)
            if cfg.auth is not None
            else None
        )
        self.metrics = BrokerMetrics(self.replica, cfg.data_dir) if cfg.metrics_address else None
        if self.metrics is not None:
            watch_auth_refusals(
                self.metrics.registry, self.refusals.refusals, IDENTITY, self.metrics.identity
            )
        self._grpc: grpc.aio.Server | None = None
        self._ha: asyncio.AbstractServer | None = None
        self.data_port: DataPort | None = None
        self.rocketmq: RocketMQEndpoint | None = None
        self._stopping = asyncio.Event()
        self._beat_wanted = asyncio.Event()  # a heartbeat now rather than an interval later
        self._store_failed = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self.retention = RetentionLoop(self.replica)
        # re-reads the log against its CRCs; a damaged replica asks not to be elected (broker/scrub.py)
        self.scrubber = Scrubber(self.replica, self.cfg.scrub_bytes_per_s)
        if self.metrics is not None:
            self.metrics.watch_retention(self.retention)
        logs.identify(self.log_identity)

    def log_identity(self) -> dict[str, object]:
        """Who writes a log line, read when it is written: a promotion shows in the next line."""
        r = self.replica
        return {
            "broker_set": self.cfg.broker_set,
            "broker_id": r.broker_id if r.broker_id >= 0 else None,
            "role": r.role,
            "epoch": r.master_epoch,
        }

    async def _alter(self, master_epoch: int, proposal: Proposal, attempt: int) -> Role | None:
        reply = await self.controller.alter_sync_state_set(
            self.cfg.broker_set,
            self.replica.broker_id,
            master_epoch,
            proposal.new_sync_state_set,
            proposal.sss_epoch,
            attempt=attempt,
        )
        return Role.from_pb(reply.role)

    async def _ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        try:
            entry = await self.controller.meta_get(ledger_key(ledger_id))
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(
                f"no ledger {ledger_id} in the controller's metadata", ledger_id=ledger_id
            ) from None
        return LedgerMetadata.decode(entry.value, version=entry.version)

    def member_call(self, method: str, metadata: Mapping[str, str], request: Any) -> bool:
        """Whether a call carries the cluster secret's token (tidelog.guard.MemberCheck): another
        broker's (retention, the RocketMQ endpoint) or an operator's holding the secret."""
        token = metadata.get(CALL_KEY)
        if token is None:
            return False
        body = request.SerializeToString(deterministic=True) if request is not None else b""
        name = method.rpartition("/")[2]
        check_call(self.cfg.secret or "", token, name, body, int(time.time() * 1000), self._replays)
        return True

    async def start(self) -> None:
        host, _, port = self.cfg.ha_listen.rpartition(":")
        try:
            self._ha = await tlsconfig.start_server(
                self.replica.handle_ha_connection, host, int(port), self.tls
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on ha_listen {self.cfg.ha_listen}: {exc.strerror}", key="ha_listen"
            ) from exc
        # Past this many calls in progress, new ones are refused at once with RESOURCE_EXHAUSTED
        # (retryable for clients) instead of queueing until they are cancelled.
        # first: it hands the calls it admits, parsed, to the timer and the handlers after it
        interceptors: list[grpc.aio.ServerInterceptor] = [
            self.guard  # every call of Broker and Ledger, one place
            if self.guard is not None
            else SafeDecode(refusal_log=self.refusals)  # a bad body: one line, not a traceback per call
        ]
        if self.metrics is not None:
            interceptors.append(self.metrics.interceptor())
        self._grpc = grpc.aio.server(
            maximum_concurrent_rpcs=self.cfg.max_concurrent_requests,
            options=SERVER_OPTIONS,
            interceptors=interceptors,
        )
        broker_pb2_grpc.add_BrokerServicer_to_server(BrokerService(self.replica, self.lookups), self._grpc)
        lookups.add_to_server(
            self._grpc, self.lookups, time.monotonic, lambda: self.controller.epoch_seen.value
        )
        ledger_pb2_grpc.add_LedgerServicer_to_server(LedgerService(self.replica.ledgers), self._grpc)
        problem = bind_problem(self.cfg.listen)
        if problem is not None:  # said before gRPC tries, whose C core would log its own lines
            raise ConfigError(f"cannot listen on {self.cfg.listen}: {problem}", key="listen")
        try:
            bound = tlsconfig.add_grpc_port(self._grpc, self.cfg.listen, self.tls)
        except RuntimeError as exc:
            bound = 0
            log.debug("bind failed: %s", exc)
        if not bound:
            raise ConfigError(f"cannot listen on {self.cfg.listen} (port in use?)", key="listen")
        await self._grpc.start()
        await self._start_data_port()
        if self.cfg.rocketmq_listen:
            self.rocketmq = RocketMQEndpoint(self.cfg, self.tls, self.replica, lambda: self.replica.acl)
            self.replica.rocketmq_address = await self.rocketmq.start()
        if self.metrics is not None:
            await self.metrics.start(self.cfg.metrics_address)
        log.info(
            "broker %s listening%s: grpc %s, ha %s; store %s [%d, %d)",
            self.cfg.broker_set,
            " with TLS" if self.tls is not None else "",
            self.cfg.listen,
            self.cfg.ha_listen,
            self.cfg.data_dir,
            self.log.min_offset,
            self.log.max_offset,
        )

    async def _start_data_port(self) -> None:
        """Produce and pull frames on the data port (broker/dataport.py), told to clients by Status."""
        listen = self.cfg.data_listen
        if not listen:
            return
        grpc_host = self.cfg.listen.rpartition(":")[0]
        host, _, port = (f"{grpc_host}:0" if listen == "auto" else listen).rpartition(":")
        self.data_port = DataPort(self.replica, self.tls, self.guard, spill_dir=self.cfg.data_dir)
        if self.metrics is not None:
            metrics = self.metrics
            self.data_port.observe_call = lambda method, seconds, code: metrics.rpc.observe(
                metrics.identity(), method, seconds, code
            )
        try:
            bound = await self.data_port.start(host, int(port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on data_listen {listen}: {exc.strerror}", key="data_listen"
            ) from exc
        advertised_host = self.cfg.advertised.rpartition(":")[0]
        self.replica.data_address = (
            self.cfg.data_advertise_address or f"{advertised_host}:{bound.rpartition(':')[2]}"
        )

    async def register(self) -> None:
        while not self._stopping.is_set():
            try:
                reply = await self.controller.register_broker(
                    self.cfg.broker_set,
                    self.cfg.advertised,
                    self.cfg.ha_advertised,
                    identity=self.ident.token,
                    broker_id=self.ident.broker_id,
                    datacenter=self.cfg.datacenter,
                    rack=self.cfg.rack,
                    cluster_id=self.ident.cluster_id,
                )
            except ControllerBrokerIdInvalidError as exc:
                raise ConfigError(
                    f"the controller refuses broker id {self.ident.broker_id} for this data "
                    f"directory: {exc.message}"
                ) from exc
            except ClusterMismatchError as exc:
                raise ConfigError(f"{self.cfg.data_dir}: {exc.message}", hint=exc.hint) from exc
            except TidelogError as exc:
                log.warning("registration with the controller failed (%s); retrying", exc)
                with contextlib.suppress(TimeoutError):
                    await within(self._stopping.wait(), 1.0)
                continue
            if (self.ident.broker_id, self.ident.cluster_id) != (reply.broker_id, reply.cluster_id):
                self.ident = identity.Identity(
                    self.cfg.broker_set, self.ident.token, reply.broker_id, reply.cluster_id
                )
                identity.save(self.cfg.data_dir, self.ident)
            self.replica.broker_id = reply.broker_id
            if self.metrics is not None:
                self.metrics.registered = True
            log.info("registered as broker %d of %s", reply.broker_id, self.cfg.broker_set)
            role = Role.from_pb(reply.role)
            if self._crashed_master_of(role, reply.broker_id):
                return  # no role yet: the first answered heartbeat asks for the new epoch (beat)
            await self.replica.apply_role(role)
            return

    def _crashed_master_of(self, role: Role, broker_id: int) -> bool:
        """True when the controller names this broker master of the epoch it led before a crash.

        After a crash the log may have lost its tail past the flushed offset while a slave holds
        it. Going on in the same epoch, both sides would agree on their epochs, fork repair would
        keep the slave's records where this broker now writes others, and the confirmed prefixes
        would differ (the simulator found it, seed 243). So the broker takes no role yet: its
        first answered heartbeat asks the controller for an election of the best alive member,
        itself included, which is a new epoch whoever wins (controller/RULES.md E8). A clean
        shutdown lost nothing and resumes its epoch at once."""
        crashed = (
            not self.log.recovered_clean
            and role.has_master
            and role.master_id == broker_id
            and role.master_epoch == self.log.last_epoch
        )
        if crashed and self._reelect_epoch is None:
            self._reelect_epoch = role.master_epoch
            log.warning(
                "%s restarted after a crash as master of epoch %d: asking for a new epoch instead "
                "of resuming it (a slave may hold writes this log lost)",
                self.replica.ctx,
                role.master_epoch,
                extra={"epoch": role.master_epoch, "max_offset": self.log.max_offset},
            )
        return crashed

    async def _reelect(self, role: Role) -> Role | None:
        """The role to take now after a crash as master (`_crashed_master_of`), or None to wait."""
        crashed = self._reelect_epoch
        if crashed is None:
            return role
        if not (
            role.has_master and role.master_id == self.replica.broker_id and role.master_epoch == crashed
        ):
            self._reelect_epoch = None  # the controller moved on by itself
            return role
        try:
            elected = await self.controller.elect_master(
                self.cfg.broker_set, self.replica.broker_id, restarted_epoch=crashed
            )
        except TidelogError as exc:
            log.warning("%s a new epoch after the crash: not yet (%s)", self.replica.ctx, exc)
            return None
        self._reelect_epoch = None
        return Role.from_pb(elected.role)

    async def heartbeat_loop(self) -> None:
        interval = self.cfg.heartbeat_interval_ms / 1000
        self.replica.beat_soon = self._beat_wanted.set
        while not self._stopping.is_set():
            began = time.monotonic()
            try:
                await self.beat()
                interval = (self._interval_ms or self.cfg.heartbeat_interval_ms) / 1000
            except TidelogError as exc:
                log.warning("%s heartbeat failed: %s", self.replica.ctx, exc)
            except Exception:
                log.exception("%s heartbeat failed", self.replica.ctx)
            if self._beat_again:
                self._beat_again = False
                continue
            with contextlib.suppress(TimeoutError):
                await within(self._stop_or_beat_wanted(), interval)
            if self._beat_wanted.is_set():
                # a write waits for a grant (Replica.beat_soon): beat now, but not more often than
                # every EARLY_BEAT_GAP_S, since each beat of a master alone is a Raft write
                self._beat_wanted.clear()
                with contextlib.suppress(TimeoutError):
                    await within(self._stopping.wait(), began + EARLY_BEAT_GAP_S - time.monotonic())

    async def _stop_or_beat_wanted(self) -> None:
        waits = [
            asyncio.ensure_future(self._stopping.wait()),
            asyncio.ensure_future(self._beat_wanted.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    _interval_ms = 0
    _beat_again = False  # made master by an election's answer: beat at once for a lease (`beat`)
    _reelect_epoch: int | None = None  # the epoch led before a crash, while a new one is asked for
    _topics_version = ""  # the version of the topic lists last adopted (the controller's HeartbeatReply)

    async def beat(self) -> None:
        r = self.replica
        epochs = self.log.epochs
        sent = r.clock_ms()
        reply = await self.controller.heartbeat(
            self.cfg.broker_set,
            r.broker_id,
            epoch=epochs.last_epoch if epochs.pairs() else -1,
            max_offset=self.log.max_offset,
            confirm_offset=self.log.confirm_offset,
            priority=DAMAGED_PRIORITY if self.scrubber.damaged else self.cfg.priority,
            total_timeout=2.0,
            acl_version=r.acl.version,
            topics_version=self._topics_version,
            cluster_version=self.lookups.version,
        )
        self.lookups.learn(reply, time.monotonic(), self.controller.leader_hint)
        self._interval_ms = reply.heartbeat_interval_ms
        if reply.HasField("acl"):
            r.acl = with_clear_keys(acl_state_of(reply.acl), self.cfg.secret or "")
            log.info("%s users and grants now at version %d", r.ctx, r.acl.version)
        # The controller saw this heartbeat no earlier than `sent`, so it cannot elect another
        # master before sent + its timeout; the lease ends well before that (ha/lease.py). Only an
        # answer naming this broker master renews it (one naming another says it was replaced), and
        # none from a leader cut off from its majority or electing in this set (`lease_withheld`).
        names_me = reply.role.has_master and reply.role.master_id == r.broker_id
        # controller/RULES.md L10: how far this master may acknowledge while alone in its set
        r.ack_bound.enforced = reply.rpo_bound_bytes > 0
        if names_me and reply.HasField("ack_bound"):
            r.grant_ack_bound(reply.role.master_epoch, reply.ack_bound)
        if names_me and not reply.lease_withheld:
            r.lease.renew(
                sent,
                reply.heartbeat_timeout_ms or 5000,
                epoch=reply.role.master_epoch,
                unclean_elections=not reply.clean_elections_only,
            )
        if not reply.topics_unchanged:
            r.topic_table.update(self.cfg.broker_set, reply.topics, reply.deleted_topics)
            self._topics_version = reply.topics_version
        assigned = Role.from_pb(reply.role)
        role = await self._reelect(assigned)
        if role is None:
            return  # still asking for a new epoch after a crash as master: no role meanwhile
        # A reply that renews no lease does not make this broker master either (ha/roles.py).
        await r.apply_role(role, vouched=role is not assigned or not reply.lease_withheld)
        r.enforce_topics()
        if not role.has_master:
            with contextlib.suppress(TidelogError):
                elected = await self.controller.elect_master(self.cfg.broker_set, r.broker_id)
                role = Role.from_pb(elected.role)
                await r.apply_role(role)
        if role is not assigned and role.has_master and role.master_id == r.broker_id:
            # Made master by an election's answer, which renews no lease: ask for one now rather
            # than a heartbeat interval later (writes the replication rule does not cover wait).
            self._beat_again = True
        if r.role == MASTER and r.ha_master is not None:
            r.ha_master.check_shrink()

    async def run(self) -> bool:
        """Serve until stopped; True when the store failed and the process should start over."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self._stopping.set)
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, tlsconfig.reload_on_signal, self.tls)
        # A failed write or sync (a full disk, an I/O error) may come from the flusher thread.
        self.log.failure_listeners.append(lambda err: loop.call_soon_threadsafe(self._store_failed.set))
        await self.start()
        gcpolicy.after_start(str(self.replica.ctx))
        try:
            if not await self._until_stopped(self.register()):
                return False  # stopped while still registering (an unreachable controller)
            beats = asyncio.ensure_future(self.heartbeat_loop())
            retention = asyncio.ensure_future(self.retention.run(self._stopping))
            scrub = asyncio.ensure_future(self.scrubber.run(self._stopping))
            offsets_cp = asyncio.ensure_future(self._checkpoint_offsets())
            stopping = asyncio.ensure_future(self._stopping.wait())
            failed = asyncio.ensure_future(self._store_failed.wait())
            await asyncio.wait({stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
            await cancel_and_wait(beats, retention, scrub, offsets_cp, stopping, failed)
        finally:
            if self._store_failed.is_set():
                # Step down at once: no more heartbeats (the controller elects an in-sync
                # replica), no gRPC or HA port (clients and slaves move on), nothing acknowledged.
                log.error(
                    "%s the store failed (%s): stepping down until it can write again",
                    self.replica.ctx,
                    self.log.failure,
                )
            await self.stop()
        return self._store_failed.is_set() and not self._stopping.is_set()

    async def _until_stopped(self, work: Awaitable[None]) -> bool:
        """Run `work` unless a stop comes first, which cancels it: False then. A registration
        attempt against an unreachable controller takes seconds, and SIGTERM must not wait it out."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            await cancel_and_wait(stopping)
            task.result()  # its error (a refused identity) stops the broker as before
            return True
        await cancel_and_wait(task, stopping)
        return False

    async def _checkpoint_offsets(self) -> None:
        interval_ms = self.cfg.offsets_checkpoint_interval_ms
        if interval_ms > 0:
            await self.replica.offsets.checkpoint_loop(self._stopping, interval_ms / 1000)

    async def wait_for_room(self) -> None:
        """Wait until the store opens and recovers again (space freed, device back), or a stop."""
        tries = 0
        while not self._stopping.is_set():
            tries += 1
            try:
                st = os.statvfs(self.cfg.data_dir)
                if st.f_bavail * st.f_frsize >= MIN_FREE_BYTES:
                    CommitLog.open(
                        self.cfg.data_dir,
                        segment_bytes=self.cfg.segment_bytes,
                        flush=self.cfg.flush,
                        flush_interval_ms=self.cfg.flush_interval_ms,
                        max_message_bytes=self.cfg.max_message_bytes,
                        cq_max_open_files=self.cq_max_open_files,
                    ).close()
                    log.warning("the store in %s recovered: starting over", self.cfg.data_dir)
                    return
            except (OSError, TidelogError) as exc:
                if tries % 10 == 1:
                    log.warning("the store in %s cannot open yet (%s); retrying", self.cfg.data_dir, exc)
            with contextlib.suppress(TimeoutError):
                await within(self._stopping.wait(), 1.0)

    @property
    def stopping(self) -> bool:
        """A signal asked the process to stop (as opposed to a store failure asking it to start over)."""
        return self._stopping.is_set()

    async def stop(self) -> None:
        log.info("%s stopping", self.replica.ctx)
        grpc_stopped = asyncio.ensure_future(self._grpc.stop(grace=1.0)) if self._grpc is not None else None
        # Writes waiting for replica acks answer now (NOT_MASTER: outcome unknown), within the
        # grace, rather than being cancelled when it runs out, which gRPC logs as a traceback.
        await self.replica.close()
        if self.data_port is not None:
            await self.data_port.close()
        if self.rocketmq is not None:
            await self.rocketmq.close()
        if grpc_stopped is not None:
            await grpc_stopped
        if self._ha is not None:
            self._ha.close()
        if self.metrics is not None:
            await self.metrics.close()
        await self.controller.close()
        if not self._store_failed.is_set():
            # the next start folds only the commits after this (broker/offsets.py)
            self.replica.offsets.save_checkpoint()
        self.log.close()


def acl_state_of(table: Any) -> AclState:
    """The users and grants of a heartbeat reply's AclTable."""
    return AclState(
        int(table.version),
        {u.name: User(u.name, u.access_key, u.signing_key) for u in table.users},
        frozenset(Grant(g.user, g.kind, g.pattern, g.permission) for g in table.grants),
    )


def run(cfg: BrokerConfig) -> None:
    private.restrict_umask()  # what a library creates for us (log rotation) is private too

    async def main() -> bool:
        server = BrokerServer(cfg)
        if not await server.run():
            return False
        await server.wait_for_room()
        return not server.stopping

    if loops.run(main()):
        # Start over in this same process (same pid, same arguments): a fresh open recovers the
        # log as after a crash, and the broker rejoins as whatever the controller says.
        logging.shutdown()
        os.execv(sys.executable, [sys.executable, "-m", "tidelog.cli", *sys.argv[1:]])
