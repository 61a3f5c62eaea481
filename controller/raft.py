"""The controller's Raft node: PySyncObj replicating one `ControllerState` across 1, 3 or 5 nodes.

Theory of operation
- Every write is ONE replicated call, `_Machine.apply(cmd)`, whose body is
  `ControllerState.apply(cmd)`. The command carries every input (now_ms, the leader's liveness
  snapshot), so each replica computes the same result from the same log: validation happens at
  apply time, in log order, which makes writes linearisable without a decide-then-commit race.
- PySyncObj runs its own tick thread; it applies commits and calls our callbacks there. `propose`
  bridges a callback into an asyncio future with `loop.call_soon_threadsafe`.
- A tick appends a proposal to the log and the *next* tick commits it; between the two, the
  thread sleeps in `poll(autoTickPeriod)` (50 ms) until a socket event. With followers, their
  answer is that event; a node alone got none, so every write of a one-node controller waited
  a whole period (a ledger's recovery open, two CASes, spent 130 of its 150 ms there).
  `_CommitWake` ends that sleep at once while a node alone has proposals in flight.
- Reads happen on the asyncio thread while the tick thread may be applying; a lock around apply
  and around `read()` keeps readers from seeing a half-applied command.
- Snapshots: the state is stored as plain data (controller/snapshot.py), not as pickled classes,
  so a snapshot survives refactors of the state classes, and written by a thread of its own
  through PySyncObj's serializer hooks (controller/snapshotfile.py): the Raft thread only takes
  a capture of the state, and goes on applying while the file is written. Forking to serialise
  is off: forking a process that runs gRPC threads is unsafe.
- The Raft port is authenticated (and encrypted) with the cluster secret via PySyncObj's
  `password`, derived per cluster epoch (`tidelog/clusterepoch.py`): after a forced quorum
  recovery the node's identity file names the new epoch and members, the old majority's nodes
  fail the handshake, and membership changes go through PySyncObj's dynamic membership
  (`tide controller add-node`), mirrored into the identity file so a restart keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, SyncObjException, replicated
from pysyncobj.monotonic import monotonic as raft_monotonic
from pysyncobj.poller import POLL_EVENT_TYPE

from tidelog import gcpolicy, private
from tidelog.clusterepoch import ClusterIdentity, raft_password
from tidelog.controller import raftdisk, snapshot, snapshotfile
from tidelog.controller.config import ControllerConfig
from tidelog.controller.recover import SNAPSHOT_FILE, alone_tuning, load_identity, save_identity
from tidelog.controller.state import ControllerState, InvariantViolation, Result
from tidelog.controller.topics import TOPIC_COMMANDS
from tidelog.errors import ConfigError, ControllerNotLeaderError, TidelogError, UnavailableError
from tidelog.ha.lease import majority_contact_age
from tidelog.invariants import EXIT_INVARIANT_VIOLATED
from tidelog.private import private_dir
from tidelog.tasks import within

log = logging.getLogger(__name__)

_RAFT_STATES = {0: "follower", 1: "candidate", 2: "leader"}


class _Machine(SyncObjConsumer):
    """The replicated part: the controller state and the one method that changes it."""

    def __init__(self, max_meta_value_bytes: int) -> None:
        super().__init__()
        self.lock = threading.RLock()
        # The limit is configuration that every replica must share (it decides apply results).
        self.max_meta_value_bytes = max_meta_value_bytes
        self.state = ControllerState(max_meta_value_bytes=max_meta_value_bytes)
        self.applied_commands = 0
        # How often the topics may have changed here (a topic command applied, a snapshot loaded):
        # local to this process, so that derived views (the heartbeat's topic lists) are rebuilt
        # only after such a change, not per heartbeat.
        self.topics_changes = 0

    @replicated
    def apply(self, cmd: Any) -> Result:
        with self.lock:
            try:
                result = self.state.apply(cmd)
            except InvariantViolation as exc:
                # Deterministic, so every replica hits it: stop loudly rather than serve a state
                # that broke its own rules (PySyncObj would otherwise retry the entry forever).
                log.critical("controller state invariant violated applying %r: %s; stopping", cmd, exc)
                logging.shutdown()
                os._exit(EXIT_INVARIANT_VIOLATED)
            self.applied_commands += 1
            if type(cmd) in TOPIC_COMMANDS:
                self.topics_changes += 1
        if not result.ok:
            log.debug("applied %s -> %s %s", type(cmd).__name__, result.code, result.message)
        return result

    @replicated
    def barrier(self, token: int) -> int:
        """A no-op a new leader commits to learn that its state has caught up with the log."""
        return token

    def capture(self) -> snapshot.Capture:
        """The state as it is now, for a snapshot written beside the Raft thread."""
        with self.lock:
            return snapshot.capture(self.state)

    def restore(self, state: ControllerState) -> None:
        """Install a state read from a snapshot (at a start, or one a leader sent)."""
        with self.lock:
            self.state = state
            self.topics_changes += 1


def _load_or_stop(writer: snapshotfile.SnapshotWriter) -> Callable[[str], snapshotfile.RaftPart]:
    """`writer.load`, the process stopped when it fails: PySyncObj would log the failure and carry
    on with an empty state over a compacted journal, a replica missing history. Stopping keeps the
    data dir intact for a human to look at."""

    def load(path: str) -> snapshotfile.RaftPart:
        try:
            with gcpolicy.paused():  # a bulk build: a million ledgers' entries, all kept
                return writer.load(path)
        except Exception as exc:  # noqa: BLE001 - any failure means a state we cannot trust
            log.critical("cannot restore the controller snapshot %s: %s; stopping", path, exc)
            logging.shutdown()
            os._exit(EXIT_INVARIANT_VIOLATED)

    return load


@dataclass(frozen=True)
class RaftStatus:
    node_id: str
    raft_state: str
    leader_id: str | None
    leader_raft: str | None
    term: int
    commit_index: int
    last_applied: int
    ready: bool

    @property
    def is_leader(self) -> bool:
        return self.raft_state == "leader"


def _fail_reason_error(reason: int, leader: str | None) -> TidelogError:
    if reason in (
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.LEADER_CHANGED,
        FAIL_REASON.DISCARDED,
        FAIL_REASON.MISSING_LEADER,
    ):
        # The command was not committed in our term; the caller may retry at the leader.
        return ControllerNotLeaderError(leader=leader)
    if reason == FAIL_REASON.QUEUE_FULL:
        return UnavailableError("the controller's command queue is full")
    return UnavailableError(f"the command was not applied (raft fail reason {reason})")


def _node_address(node: Any) -> str | None:
    return getattr(node, "address", None) if node is not None else None


def _leadership(obj: SyncObj) -> tuple[bool, str | None]:
    """Whether this node leads, and the Raft address of the node it believes leads (None: none known).

    PySyncObj has no cheap public accessor for either: ``getStatus()`` holds both but builds a
    dict of every peer's connection and log indexes on each call, and the leader check runs on
    every request. Its ``_isLeader`` and ``_getLeader`` are plain attribute reads, so they are
    used here, and only here.
    """
    return bool(obj._isLeader()), _node_address(obj._getLeader())  # noqa: SLF001


def _check_snapshot(path: Path) -> None:
    """Refuse to start on an unreadable snapshot.

    PySyncObj logs a failed snapshot load and carries on with an empty state over a journal
    that compaction already cut: a replica silently missing history.
    """
    try:
        snapshotfile.check(path)
    except ValueError as exc:
        raise ValueError(
            f"the controller snapshot {path} is unreadable ({exc}); refusing to start "
            f"with missing history: restore the data dir or remove this node's data dir "
            f"and let it copy the state from the other nodes"
        ) from None


class _CommitWake:
    """Wakes PySyncObj's tick thread from its poll while a lone leader has proposals in flight.

    Runs as an on-tick callback (the tick thread, at the end of every tick, just before the
    poll): if this node leads with no other nodes and a proposal has not been answered yet, a
    byte on our own pipe (subscribed to PySyncObj's poller from this thread) makes the poll
    return at once, and the next tick commits and applies what the last one appended. Nothing is
    written once every proposal has its answer, so an idle node still sleeps whole periods.
    """

    def __init__(self, obj: SyncObj) -> None:
        self._obj = obj
        self._lock = threading.Lock()
        self._in_flight = 0
        self._pipe: tuple[int, int] | None = None

    def proposed(self) -> None:
        with self._lock:
            self._in_flight += 1

    def answered(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def on_tick(self) -> None:
        with self._lock:
            waiting = self._in_flight > 0
        # with followers, their answers wake the poll; a node that is not leading commits nothing
        if not waiting or self._obj.otherNodes or not _leadership(self._obj)[0]:
            return
        if self._pipe is None:
            self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._obj._poller.subscribe(self._pipe[0], self._drain, POLL_EVENT_TYPE.READ)  # noqa: SLF001
        self.poke()

    def poke(self) -> None:
        """End the tick thread's current poll (once the pipe is subscribed, from any thread)."""
        pipe = self._pipe
        if pipe is not None:
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is already pending
                os.write(pipe[1], b"w")

    def _drain(self, descr: int, event: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(descr, 4096):
                pass

    def close(self) -> None:
        """After the tick thread stopped: the pipe is no longer polled."""
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None


class RaftNode:
    """One controller node's PySyncObj instance, seen from asyncio."""

    def __init__(self, cfg: ControllerConfig, *, replay_only: bool = False) -> None:
        """`replay_only`: the forced recovery's one-off start (controller/recover.py): membership
        comes from the identity file alone, never from the snapshot's cluster."""
        self.cfg = cfg
        if not cfg.secret:
            raise ConfigError("the Raft port needs the cluster secret", key="secret")
        private_dir(cfg.node_dir)
        # PySyncObj creates the journal, its meta file and the snapshots itself, with open():
        # only the umask makes them private (0600), for this process's life (a controller process
        # writes nothing that others should read)
        private.restrict_umask()
        journal = cfg.node_dir / "raft.journal"
        snapshot_path = cfg.node_dir / SNAPSHOT_FILE
        # A recovered cluster's epoch and members come from the node's identity file, not the
        # config (whose node list names every node that may ever be a member, with addresses).
        self.identity = load_identity(cfg)
        self.cluster_epoch = self.identity.epoch if self.identity else 0
        peers = (
            [cfg.node(m).raft for m in self.identity.members if m != cfg.node_id]
            if self.identity
            else [n.raft for n in cfg.peers]
        )
        # a recovered node alone in its cluster leads after one short timeout (recover.alone_tuning)
        tuning = alone_tuning(cfg.raft) if self.identity is not None and not peers else cfg.raft
        self._machine = _Machine(cfg.max_meta_value_bytes)
        self._snapshots = snapshotfile.SnapshotWriter(
            snapshot_path, self._machine.capture, self._machine.restore, cfg.max_meta_value_bytes
        )
        conf = SyncObjConf(
            # Never unauthenticated: without a password PySyncObj unpickles whatever a peer sends.
            password=raft_password(cfg.secret, self.cluster_epoch),
            # PySyncObj binds 0.0.0.0 unless told otherwise; listen only where the config says.
            bindAddress=cfg.self_node.raft,
            journalFile=str(journal),
            fullDumpFile=str(snapshot_path),
            useFork=False,
            serializer=self._snapshots.serialize,
            deserializer=_load_or_stop(self._snapshots),
            serializeChecker=self._snapshots.check,
            raftMinTimeout=tuning.election_min_timeout_ms / 1000,
            raftMaxTimeout=tuning.election_max_timeout_ms / 1000,
            appendEntriesPeriod=tuning.append_entries_period_ms / 1000,
            leaderFallbackTimeout=tuning.leader_fallback_timeout_ms / 1000,
            connectionTimeout=max(3.5, 2 * tuning.election_max_timeout_ms / 1000),
            connectionRetryTime=tuning.connection_retry_ms / 1000,
            logCompactionMinEntries=tuning.log_compaction_min_entries,
            maxBindRetries=5,
            # only recovered clusters grow by `tide controller add-node`
            dynamicMembershipChange=self.cluster_epoch > 0 and not replay_only,
            # Controller writes are rare and latency matters more than batching (elections, CAS).
            appendEntriesUseBatch=False,
        )
        _check_snapshot(snapshot_path)
        raftdisk.install()  # the journal, the vote and the snapshot synced (controller/raftdisk.py)
        self._obj = SyncObj(cfg.self_node.raft, peers, conf=conf, consumers=[self._machine])
        self._wake = _CommitWake(self._obj)
        self._obj.addOnTickCallback(self._wake.on_tick)
        for name in ("raft.journal", "raft.journal.meta", "raft.snapshot"):
            path = cfg.node_dir / name
            if path.exists():  # written by an older version under a looser umask
                os.chmod(path, private.FILE_MODE)
        try:
            # A node that cannot own its Raft port must not serve as if it were part of the cluster.
            self._obj.waitBinded()
        except SyncObjException:
            self.close()
            raise UnavailableError(
                f"cannot listen on the Raft address {cfg.self_node.raft}",
                hint="another process holds the port; stop it or change nodes[].raft",
            ) from None
        log.info(
            "raft node %s on %s, peers %s, cluster epoch %d, data in %s",
            cfg.node_id,
            cfg.self_node.raft,
            peers,
            self.cluster_epoch,
            cfg.node_dir,
        )

    # --- writes ---------------------------------------------------------------------------

    def _leader_raft(self) -> str | None:
        return _leadership(self._obj)[1]

    def leader_grpc(self) -> str | None:
        """The gRPC address of the node this node believes leads, if any."""
        raft = self._leader_raft()
        node = self.cfg.node_by_raft(raft) if raft else None
        return node.grpc if node else None

    def _submit(
        self, method: Any, arg: Any, settled: Callable[[], None] | None = None
    ) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(res: Any, err: int) -> None:
            if settled is not None:
                settled()  # whatever the caller did meanwhile: the outcome is known now
            if fut.done():  # the caller gave up (timeout) before the commit
                return
            if err == FAIL_REASON.SUCCESS:
                fut.set_result(res)
            else:
                fut.set_exception(_fail_reason_error(err, self.leader_grpc()))

        def callback(res: Any, err: int) -> None:  # runs on PySyncObj's tick thread
            self._wake.answered()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(settle, res, err)

        self._wake.proposed()
        try:
            method(arg, callback=callback)
        except BaseException:
            self._wake.answered()
            if settled is not None:
                settled()  # nothing was proposed
            raise
        return fut

    async def propose(
        self, cmd: Any, timeout: float = 5.0, settled: Callable[[], None] | None = None
    ) -> Result:
        """Replicate one command; returns the `Result` every replica computed for it.

        Raises ControllerNotLeaderError when this node does not lead (nothing is proposed), or
        UnavailableError when the outcome is unknown within `timeout` (it may still commit).
        `settled` runs on the event loop once PySyncObj knows the outcome (committed, or failed
        with a leader change), even after the caller gave up waiting, and at once when nothing
        was proposed.
        """
        if not self.is_leader():
            if settled is not None:
                settled()
            raise ControllerNotLeaderError(leader=self.leader_grpc())
        fut = self._submit(self._machine.apply, cmd, settled)
        try:
            return await within(fut, timeout)
        except TimeoutError:
            raise UnavailableError(
                f"{type(cmd).__name__} was not committed within {timeout:.1f}s; its outcome is unknown",
                hint="read the state back before retrying a non-idempotent change",
            ) from None

    async def barrier(self, token: int, timeout: float = 5.0) -> None:
        fut = self._submit(self._machine.barrier, token)
        await within(fut, timeout)

    # --- reads ----------------------------------------------------------------------------

    def majority_contact_age_ms(self) -> float:
        """How long ago a majority of the group last answered this node as leader (0 for a group of
        one; infinite when not leading). Read from PySyncObj's per-follower answer times, the ones
        its own leader fallback uses (`leaderFallbackTimeout`)."""
        if not self.is_leader():
            return float("inf")
        answers = dict(getattr(self._obj, "_SyncObj__lastResponseTime", {}))
        # the group as PySyncObj holds it: a recovered node leads alone whatever the config's
        # peers say, and a node added later counts once PySyncObj has it
        others = len(self._obj.otherNodes)
        # PySyncObj stamps answers with its own monotonic clock, in seconds: CLOCK_MONOTONIC_RAW
        # where there is one, which runs apart from time.monotonic's (NTP slews only the latter;
        # 0.24 s apart on a host up for hours), so "now" must be read from the same clock
        now = raft_monotonic()
        return majority_contact_age(now * 1000, [t * 1000 for t in answers.values()], others + 1)

    def commit_index(self) -> int:
        """The last Raft index this node knows committed (never below what its state has applied)."""
        return int(self._obj.raftCommitIndex)

    def every_node_index(self) -> int:
        """The last Raft index every node of the group holds in its log, as this leader knows from
        their answers (-1 when not leading; a follower not heard from yet counts as holding none).
        A forced recovery keeps every entry a node's log holds (controller/recover.py), so what is
        at or below this index survives whichever node is recovered."""
        if not self.is_leader():
            return -1
        matched = dict(getattr(self._obj, "_SyncObj__raftMatchIndex", {}))
        own = self.commit_index()
        return min([own, *(int(matched.get(n, 0)) for n in self._obj.otherNodes)])

    @property
    def state_changes(self) -> int:
        """A counter that moves whenever the state may have changed: a command applied, a
        snapshot loaded."""
        return self._machine.applied_commands + self._machine.topics_changes

    @property
    def topics_changes(self) -> int:
        """A counter that moves whenever the topics may have changed (see `_Machine`)."""
        return self._machine.topics_changes

    @contextlib.contextmanager
    def read(self) -> Iterator[ControllerState]:
        """The local replica's state, consistent for the duration of the `with` block."""
        with self._machine.lock:
            yield self._machine.state

    def status(self) -> RaftStatus:
        raw = self._obj.getStatus()  # public, and cheap enough for a status call (not per request)
        raft = _node_address(raw["leader"])
        leader = self.cfg.node_by_raft(raft) if raft else None
        state = _RAFT_STATES.get(raw["state"], "follower")
        return RaftStatus(
            node_id=self.cfg.node_id,
            raft_state=state,
            leader_id=leader.id if leader else None,
            leader_raft=raft,
            term=self._obj.raftCurrentTerm,
            commit_index=self._obj.raftCommitIndex,
            last_applied=self._obj.raftLastApplied,
            ready=self._obj.isReady(),
        )

    def is_leader(self) -> bool:
        return _leadership(self._obj)[0]

    def snapshot_now(self) -> None:
        """Write a snapshot at the next tick (the recovery's: it records the one-node cluster)."""
        self._obj.forceLogCompaction()

    def members(self) -> tuple[str, ...]:
        """The node ids of this node's Raft cluster as PySyncObj holds it (dynamic membership
        included); a Raft address the config does not name is listed as the address."""
        addresses = {self._obj.selfNode.address} | {n.address for n in self._obj.otherNodes}
        ids = []
        for address in addresses:
            node = self.cfg.node_by_raft(address)
            ids.append(node.id if node else address)
        return tuple(sorted(ids))

    def persist_members(self) -> None:
        """Mirror a membership change (`tide controller add-node`) into the identity file, so that
        a restart starts with the members PySyncObj agreed on. Only recovered clusters have one."""
        if self.identity is None:
            return
        members = self.members()
        if members != tuple(sorted(self.identity.members)):
            self.identity = ClusterIdentity(self.cluster_epoch, members, self.identity.recovered_from)
            save_identity(self.cfg, self.identity)
            log.info("cluster epoch %d: members now %s", self.cluster_epoch, list(members))

    def term(self) -> int:
        return int(self._obj.raftCurrentTerm)

    def close(self) -> None:
        try:
            self._obj.destroy()
            self._wake.poke()  # the thread notices the destroy at its next tick: now, not a period on
            self._obj.destroy_synchronous()
        except Exception:  # already stopping; nothing left to protect
            log.debug("raft destroy failed", exc_info=True)
            self._snapshots.wait(10)  # a snapshot being written: ended before its files go
        else:
            self._wake.close()
            # The Raft thread has stopped: a snapshot written meanwhile is put in place now, or
            # it would be lost with the process. Its journal is not cut; a start aligns the
            # journal to it, as after a stop between a snapshot and the journal's cut.
            if self._snapshots.wait(10):
                self._snapshots.check()
