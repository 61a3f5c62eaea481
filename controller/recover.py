"""Forced quorum recovery: restart one surviving controller as a new one-node cluster at a new
cluster epoch, and grow the new cluster back one wiped node at a time (docs/RUNBOOK-quorum.md).

The precedents are etcd's `--force-new-cluster`, Consul's `peers.json` and Kafka KRaft's metadata
recovery: an operator's decision, taken when the controller majority is gone for good (a lost
datacenter), never automatically.

What `recover` does, on a stopped node:
1. reads the node's Raft journal: the commit index it knows and the last entry it holds;
2. copies the node dir aside (`<data_dir>/<node>.before-epoch-<N+1>`), for forensics or to undo;
3. writes the identity file (`cluster.json`): cluster epoch N+1, members = this node alone, and
   the datacenters the operator declared lost (`--lost-datacenter`) with the command's start time,
   so that the node fails over their silent masters without waiting out its grace (RULES.md L8);
4. starts the node's Raft once, as that one-node cluster: it leads at once and commits every entry
   its log holds (like etcd, it cannot tell the entries past its commit index that the lost
   majority committed from those it did not, and keeps them all), then reads the state and stops.
The node is then started as usual and serves epoch N+1; the old nodes fail its Raft handshake
(the password is per epoch) and brokers and clients that saw epoch N+1 refuse their answers.

What `add-node` does: wipes the joining node's data dir (moved aside, never merged: it may hold
what the lost majority committed after the survivor's last commit), writes its identity file with
the current members and itself, and asks the leader to add it (PySyncObj dynamic membership).

This module is the shell (files, ports, PySyncObj); the rules are `tidelog/clusterepoch.py`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tidelog.clusterepoch import IDENTITY_FILE, ClusterIdentity, may_join, raft_password
from tidelog.controller.config import ControllerConfig, RaftTuning
from tidelog.errors import ConfigError, UnavailableError
from tidelog.private import private_dir, write_private
from tidelog.wire import bind_problem

log = logging.getLogger(__name__)

JOURNAL_FILE = "raft.journal"
SNAPSHOT_FILE = "raft.snapshot"


# --- the identity file ----------------------------------------------------------------------


def load_identity(cfg: ControllerConfig) -> ClusterIdentity | None:
    """The node's identity file, or None when it has none (epoch 0, the config's members)."""
    path = cfg.node_dir / IDENTITY_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    ident = ClusterIdentity.from_json(text, str(path))
    for member in ident.members:
        cfg.node(member)  # every member needs its addresses in the config
    return ident


def save_identity(cfg: ControllerConfig, ident: ClusterIdentity) -> None:
    """Write the identity file atomically and durably (a crash leaves the old or the new one)."""
    # private like the rest of the node's data (docs/SECURITY.md), also from `tide controller recover`
    private_dir(cfg.node_dir)
    write_private(cfg.node_dir / IDENTITY_FILE, ident.to_json() + "\n")


def node_epoch(cfg: ControllerConfig) -> int | None:
    """The cluster epoch the node's data dir holds: None when it holds no Raft data at all."""
    ident = load_identity(cfg)
    if ident is not None:
        return ident.epoch
    has_data = any((cfg.node_dir / f).exists() for f in (JOURNAL_FILE, SNAPSHOT_FILE))
    return 0 if has_data else None


# --- what the node's log says ---------------------------------------------------------------


@dataclass(frozen=True)
class LogPosition:
    term: int
    commit_index: int  # the last entry this node knows was committed
    last_index: int  # the last entry its journal holds (committed or not, as far as it knows)


def read_log_position(node_dir: Path) -> LogPosition:
    """The commit index and last index of a stopped node's journal (PySyncObj's file format)."""
    from pysyncobj.journal import createJournal  # the journal's own reader: its format is PySyncObj's

    path = node_dir / JOURNAL_FILE
    if not path.exists():
        return LogPosition(0, 0, 0)
    journal = createJournal(str(path))
    try:
        last = journal[-1][1] if len(journal) else 0
        term = max(journal.getCurrentTerm() or 0, journal[-1][2] if len(journal) else 0)
        return LogPosition(int(term), int(journal.getRaftCommitIndex()), int(last))
    finally:
        journal._destroy()  # noqa: SLF001 - its only close


def require_stopped(cfg: ControllerConfig) -> None:
    """Refuse to touch a node's files while it runs (its ports are held)."""
    node = cfg.self_node
    for what, address in (("raft", node.raft), ("grpc", node.grpc)):
        problem = bind_problem(address)
        if problem is not None:
            raise UnavailableError(
                f"controller {cfg.node_id} still holds its {what} address {address} ({problem})",
                hint="stop the controller process first (systemctl stop, or tide cluster stop)",
            )


# --- recovery -------------------------------------------------------------------------------


def alone_tuning(tuning: RaftTuning) -> RaftTuning:
    """The Raft timings of a node that is its cluster's only member (the recovery's replay, and a
    recovered node until it grows back): it waits out one election timeout before it leads, so
    the shortest the rules allow. Nobody else votes, so nobody is disturbed; the timeouts decide
    only how soon leadership comes, never what is committed, and the operator is waiting."""
    return replace(
        tuning,
        election_min_timeout_ms=4 * tuning.append_entries_period_ms,
        election_max_timeout_ms=4 * tuning.append_entries_period_ms + 50,
    )


@dataclass
class RecoveryReport:
    node_id: str
    old_epoch: int
    new_epoch: int
    term: int
    known_committed_index: int
    last_log_index: int
    applied_index: int
    backup: str
    broker_sets: list[dict[str, Any]] = field(default_factory=list)
    topics: int = 0
    lost_datacenters: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report an operator reads: what is known committed, and what cannot be known."""
        out = [
            f"controller {self.node_id} now leads cluster epoch {self.new_epoch} alone "
            f"(was epoch {self.old_epoch}); its data dir before recovery is in {self.backup}",
            f"known committed: Raft entries up to index {self.known_committed_index} (term {self.term})",
        ]
        beyond = self.last_log_index - self.known_committed_index
        if beyond > 0:
            out.append(
                f"held but not known committed: {beyond} entries up to index {self.last_log_index}; "
                f"they were applied now (the lost majority may or may not have committed them)"
            )
        out.append(
            f"cannot be known: entries the lost majority may have committed after index "
            f"{self.last_log_index} (elections, SyncStateSet changes, topic and metadata changes "
            f"made while this node lagged); brokers report their real roles in their next heartbeats"
        )
        if self.lost_datacenters:
            out.append(
                f"declared lost: datacenter(s) {', '.join(self.lost_datacenters)}: while this node is "
                f"alone, a silent master registered there is failed over without the heartbeat grace"
            )
        out.extend(f"warning: {w}" for w in self.warnings)
        out.append(f"state at applied index {self.applied_index}: {self.topics} topic(s)")
        for bs in self.broker_sets:
            out.append(
                f"  {bs['name']}: master {bs['master_id']} epoch {bs['master_epoch']}, "
                f"SyncStateSet {bs['sync_state_set']} (epoch {bs['sync_state_set_epoch']})"
            )
            for m in bs["members"]:
                out.append(
                    f"    broker {m['broker_id']} ({m['datacenter'] or '-'}): last reported epoch "
                    f"{m['last_epoch']}, max offset {m['last_max_offset']}"
                )
        return out


def summarize(state: Any) -> tuple[list[dict[str, Any]], int]:
    """Broker sets (masters, epochs, SyncStateSets, the offsets the Raft log holds) and topic count."""
    sets = []
    for name in sorted(state.broker_sets):
        bs = state.broker_sets[name]
        sets.append(
            {
                "name": name,
                "master_id": bs.master_id,
                "master_epoch": bs.master_epoch,
                "sync_state_set": sorted(bs.sync_state_set),
                "sync_state_set_epoch": bs.sss_epoch,
                "members": [
                    {
                        "broker_id": m.broker_id,
                        "datacenter": m.datacenter,
                        "last_epoch": m.last_epoch,
                        "last_max_offset": m.last_max_offset,
                    }
                    for m in (bs.members[b] for b in sorted(bs.members))
                ],
            }
        )
    return sets, len(state.topics)


def recover(
    cfg: ControllerConfig, *, lost_datacenters: tuple[str, ...] = (), timeout: float = 30.0
) -> RecoveryReport:
    """Turn the stopped node `cfg` into a one-node cluster at a new cluster epoch (module doc);
    `lost_datacenters`: the datacenters the operator declares lost (RULES.md L8)."""
    started_ms = int(time.time() * 1000)  # before anything: every lease of the lost site is older
    if not cfg.secret:
        raise ConfigError("recovery needs the cluster secret", key="secret")
    require_stopped(cfg)
    if not (cfg.node_dir / JOURNAL_FILE).exists() and not (cfg.node_dir / SNAPSHOT_FILE).exists():
        raise ConfigError(
            f"{cfg.node_dir} holds no Raft log: nothing to recover from",
            key="--node-id",
            hint="run recover on a surviving controller's own machine, with its data dir",
        )
    old = load_identity(cfg)
    old_epoch = old.epoch if old else 0
    new_epoch = old_epoch + 1
    position = read_log_position(cfg.node_dir)
    backup = cfg.data_dir / f"{cfg.node_id}.before-epoch-{new_epoch}"
    if backup.exists():
        raise ConfigError(f"{backup} exists already", key="--data-dir", hint="move it away first")
    shutil.copytree(cfg.node_dir, backup)
    lost = tuple(dict.fromkeys(lost_datacenters))
    save_identity(
        cfg,
        ClusterIdentity(
            new_epoch,
            (cfg.node_id,),
            recovered_from=cfg.node_id,
            lost_datacenters=lost,
            recovered_at_ms=started_ms if lost else 0,
        ),
    )
    log.warning(
        "controller %s: forced recovery to cluster epoch %d from its own log (commit %d, last %d)",
        cfg.node_id,
        new_epoch,
        position.commit_index,
        position.last_index,
    )
    applied, sets, topics = _replay(cfg, position.last_index, timeout)
    known = {m["datacenter"] for bs in sets for m in bs["members"]}
    warnings = [
        f"no broker is registered in datacenter {dc!r}: check the name (it fails nothing over)"
        for dc in lost
        if dc not in known
    ]
    return RecoveryReport(
        node_id=cfg.node_id,
        old_epoch=old_epoch,
        new_epoch=new_epoch,
        term=position.term,
        known_committed_index=position.commit_index,
        last_log_index=position.last_index,
        applied_index=applied,
        backup=str(backup),
        broker_sets=sets,
        topics=topics,
        lost_datacenters=list(lost),
        warnings=warnings,
    )


def _snapshot_index(node_dir: Path) -> int:
    """The last index a stopped node's snapshot covers (0: no snapshot)."""
    from tidelog.controller.snapshotfile import read_raft

    path = node_dir / SNAPSHOT_FILE
    if not path.exists():
        return 0
    last, _before, _cluster = read_raft(path)
    return int(last[1])


def _drop_membership_changes(node_dir: Path) -> int:
    """Turn the membership changes the journal holds past the snapshot into no-ops; returns how many.

    PySyncObj re-applies them when it applies the log, which would give the one-node cluster its
    lost members back (and no quorum). Indexes and terms stay, so the log is the same length."""
    from pysyncobj.journal import createJournal

    after = _snapshot_index(node_dir)
    journal = createJournal(str(node_dir / JOURNAL_FILE))
    try:
        entries = [journal[i] for i in range(len(journal))]
        changed = [
            (_NO_OP if idx > after and cmd[:1] == _MEMBERSHIP else cmd, idx, term)
            for cmd, idx, term in entries
        ]
        count = sum(1 for a, b in zip(entries, changed, strict=True) if a[0] != b[0])
        if count:
            journal.clear()
            for entry in changed:
                journal.add(*entry)
            journal.flush()
        return count
    finally:
        journal._destroy()  # noqa: SLF001 - its only close


#: PySyncObj's log entry types (pysyncobj.syncobj._COMMAND_TYPE: the first byte of an entry)
_NO_OP = bytes([1])
_MEMBERSHIP = bytes([2])


def _replay(cfg: ControllerConfig, last_index: int, timeout: float) -> tuple[int, list[dict[str, Any]], int]:
    """Start the node once as its one-node cluster, commit its whole log, snapshot it (the snapshot
    records the one-node cluster), read the state, stop."""
    from tidelog.controller.raft import RaftNode  # raft.py imports this module's file helpers

    if (cfg.node_dir / JOURNAL_FILE).exists():
        dropped = _drop_membership_changes(cfg.node_dir)
        if dropped:
            log.warning(
                "controller %s: %d membership changes of the old cluster left out", cfg.node_id, dropped
            )
    snapshot = cfg.node_dir / SNAPSHOT_FILE
    before = snapshot.stat().st_mtime_ns if snapshot.exists() else 0
    raft = RaftNode(cfg, replay_only=True)  # alone in its identity file: alone_tuning
    try:

        async def commit_all() -> None:
            deadline = time.monotonic() + timeout
            while not raft.is_leader():
                if time.monotonic() > deadline:
                    raise UnavailableError(
                        f"controller {cfg.node_id} did not lead its one-node cluster",
                        hint="the node dir before the recovery is in the backup dir: put it back, then run recover again",
                    )
                await asyncio.sleep(0.05)
            # a barrier in the new term commits (and applies) every earlier entry of the log
            await raft.barrier(0, timeout=max(1.0, deadline - time.monotonic()))

        asyncio.run(commit_all())
        raft.snapshot_now()
        deadline = time.monotonic() + timeout
        while not snapshot.exists() or snapshot.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise UnavailableError(f"controller {cfg.node_id} did not write its recovery snapshot")
            time.sleep(0.05)
        status = raft.status()
        with raft.read() as state:
            sets, topics = summarize(state)
        if status.last_applied < last_index:
            raise UnavailableError(
                f"applied only up to index {status.last_applied} of {last_index}",
                hint="the node dir before the recovery is in the backup dir: put it back, then run recover again",
            )
        return status.last_applied, sets, topics
    finally:
        raft.close()


# --- growing the new cluster back -----------------------------------------------------------


def prepare_join(cfg: ControllerConfig, cluster_epoch: int, members: tuple[str, ...]) -> Path | None:
    """Make the stopped node `cfg` a joining member of the cluster at `cluster_epoch`: its old data
    dir is moved aside (returned; None when it had none) and its identity file names the members
    and itself. Never merges: a node of an older epoch holds history the new cluster did not agree
    to (`clusterepoch.may_join`)."""
    require_stopped(cfg)
    if cfg.node_id in members:
        raise ConfigError(
            f"controller {cfg.node_id} is already a member of cluster epoch {cluster_epoch}",
            key="--node-id",
        )
    for member in members:
        cfg.node(member)
    moved: Path | None = None
    current = node_epoch(cfg)
    if current is not None and current > cluster_epoch:
        raise ConfigError(
            f"controller {cfg.node_id} holds cluster epoch {current}, newer than the cluster's "
            f"{cluster_epoch}: it belongs to a newer cluster",
            key="--node-id",
        )
    if cfg.node_dir.exists() and any(cfg.node_dir.iterdir()):
        moved = (
            cfg.data_dir
            / f"{cfg.node_id}.wiped-epoch-{current if current is not None else 0}-{int(time.time())}"
        )
        os.replace(cfg.node_dir, moved)
    if not may_join(node_epoch(cfg), cluster_epoch):  # a rule, checked after the wipe
        raise ConfigError(f"controller {cfg.node_id} still holds data after the wipe", key="--node-id")
    save_identity(cfg, ClusterIdentity(cluster_epoch, tuple(sorted({*members, cfg.node_id}))))
    return moved


def request_add(
    leader_raft: str, new_raft: str, secret: str, cluster_epoch: int, timeout: float = 10.0
) -> None:
    """Ask the leader (at its Raft address) to add `new_raft` to its cluster (PySyncObj's utility
    command, authenticated with the epoch's Raft password)."""
    from pysyncobj.utility import TcpUtility, UtilityException

    utility = TcpUtility(password=raft_password(secret, cluster_epoch), timeout=timeout)
    try:
        result = utility.executeCommand(leader_raft, ["add", new_raft])
    except UtilityException as exc:
        raise UnavailableError(
            f"the controller at {leader_raft} did not answer the membership change: {exc}",
            hint="check that it leads the recovered cluster, then run add-node again",
        ) from None
    if result != "SUCCESS" and not (isinstance(result, str) and result.startswith("SUCCESS")):
        raise UnavailableError(
            f"the controller at {leader_raft} refused to add {new_raft}: {result}",
            hint="one membership change at a time: wait until the previous node caught up, then retry",
        )
