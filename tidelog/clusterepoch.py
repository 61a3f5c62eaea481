"""The cluster epoch: which controller cluster an answer comes from, and the rules that fence an
older one after a forced quorum recovery (docs/RUNBOOK-quorum.md, docs/ARCHITECTURE.md §7.7).

A controller cluster starts at cluster epoch 0. `tide controller recover` restarts one surviving
node as a new one-node cluster at epoch N+1. The epoch is
- persisted in the node's identity file (`cluster.json` in its node dir, with the members),
- mixed into the Raft password, so nodes of different epochs cannot exchange a Raft message
  (a returning node of the old majority can neither vote in nor join the new cluster),
- sent with every controller reply (gRPC initial metadata `tidelog-cluster-epoch`), so that a
  broker or client that has seen epoch N refuses answers of an older epoch;
- sent with every call by a caller that has seen one (request metadata `tidelog-caller-epoch`),
  so that a controller of an older epoch refuses the call itself (`refuse_caller`) instead of
  acting on it: what it would do (elect, change a SyncStateSet, create a topic) belongs to a
  cluster that a forced recovery replaced.

Pure: no I/O, no clock. The shells are `controller/recover.py` (files, the offline recovery),
`controller/raft.py` and `controller/node.py` (the server side) and `client/controllers.py` (the
check on every reply).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from tidelog.errors import ClusterEpochFencedError, ConfigError

#: The gRPC metadata key carrying the answering controller's cluster epoch.
EPOCH_KEY = "tidelog-cluster-epoch"
#: The request metadata key carrying the newest cluster epoch the caller has seen (absent: none).
CALLER_EPOCH_KEY = "tidelog-caller-epoch"
#: The identity file in a controller's node dir; absent: epoch 0 with the config's members.
IDENTITY_FILE = "cluster.json"
IDENTITY_FORMAT = 1


def raft_password(secret: str, cluster_epoch: int) -> str:
    """PySyncObj's password for a cluster epoch: the secret itself at epoch 0 (clusters that were
    never recovered keep their wire), else a key derived from it, one per epoch, so that two
    epochs' nodes fail each other's handshake."""
    if cluster_epoch < 0:
        raise ValueError(f"a cluster epoch is never negative (got {cluster_epoch})")
    if cluster_epoch == 0:
        return secret
    label = f"tidelog raft cluster-epoch {cluster_epoch}".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).hexdigest()


def reply_epoch(metadata: object, key: str = EPOCH_KEY) -> int:
    """The cluster epoch a reply's metadata names (or a call's, with `CALLER_EPOCH_KEY`); 0 when it
    names none (a controller that was never recovered, or one older than cluster epochs, and a
    caller that never saw a recovered cluster: all are epoch 0)."""
    for item in metadata or ():  # type: ignore[attr-defined]
        name, value = item[0], item[1]
        if name == key:
            text = value.decode() if isinstance(value, bytes) else str(value)
            try:
                return max(0, int(text))
            except ValueError:
                return 0
    return 0


def admit(seen: int, answered: int, source: str = "a controller") -> int:
    """The cluster epoch known after an answer of epoch `answered` when `seen` was known before.

    An answer of an older epoch is refused (`ClusterEpochFencedError`): its controller belongs to
    a cluster a forced recovery replaced, and what it says (masters, SyncStateSets) may contradict
    the new cluster's decisions.
    """
    if answered < seen:
        raise ClusterEpochFencedError(
            f"{source} answered from cluster epoch {answered}, but cluster epoch {seen} was already "
            f"seen: its answer is refused",
            cluster_epoch=answered,
            seen_epoch=seen,
        )
    return answered


def refuse_caller(own: int, caller: int) -> ClusterEpochFencedError | None:
    """Why a controller at cluster epoch `own` must not serve a caller that has seen `caller`, or
    None. A caller that saw a newer epoch knows that a forced recovery replaced this controller's
    cluster: whatever this controller did for it (an election, a SyncStateSet change, a topic)
    would be a decision of the replaced cluster, so it answers nothing, with the error the caller
    treats as "ask the next controller"."""
    if caller <= own:
        return None
    return ClusterEpochFencedError(
        f"this controller serves cluster epoch {own}, but the caller has seen cluster epoch {caller}: "
        f"a forced recovery replaced this controller's cluster, and it refuses the call",
        cluster_epoch=own,
        seen_epoch=caller,
    )


def may_join(node_epoch: int | None, cluster_epoch: int) -> bool:
    """Whether a controller whose data dir holds `node_epoch` (None: an empty, wiped data dir)
    may start as a member of a cluster at `cluster_epoch`.

    Only an empty data dir joins a recovered cluster: a node of an older epoch holds a log the
    new cluster never agreed to (what the lost majority may have committed after the survivor's
    last commit), and merging it would bring that history back. One of the same epoch is a
    member restarting; one of a newer epoch belongs to a newer cluster.
    """
    return node_epoch is None or node_epoch == cluster_epoch


@dataclass
class EpochSeen:
    """The highest cluster epoch a client or broker has seen, checked against every answer."""

    value: int = 0

    def check(self, answered: int, source: str = "a controller") -> bool:
        """Admit an answer (raising when fenced); True when it raised the known epoch."""
        new = admit(self.value, answered, source)
        raised = new > self.value
        self.value = new
        return raised


@dataclass(frozen=True)
class ClusterIdentity:
    """What a controller's `cluster.json` holds: its cluster epoch and the members (node ids)
    of its cluster; `recovered_from` names the node whose log the epoch started from.

    `lost_datacenters` are the datacenters the operator declared lost when forcing the recovery
    (`tide controller recover --lost-datacenter`), and `recovered_at_ms` the wall-clock time the
    recovery command started: while the recovered node is alone, it fails over a silent master
    registered in one of them without waiting out the new leader's grace (controller/RULES.md L8).
    Both are dropped once the cluster grows again (the lost site is returning)."""

    epoch: int
    members: tuple[str, ...]
    recovered_from: str = ""
    lost_datacenters: tuple[str, ...] = ()
    recovered_at_ms: int = 0

    def to_json(self) -> str:
        raw: dict[str, object] = {
            "format": IDENTITY_FORMAT,
            "cluster_epoch": self.epoch,
            "members": list(self.members),
            "recovered_from": self.recovered_from,
        }
        if self.lost_datacenters:  # older readers ignore the keys; absent means none declared
            raw["lost_datacenters"] = list(self.lost_datacenters)
            raw["recovered_at_ms"] = self.recovered_at_ms
        return json.dumps(raw, indent=2, sort_keys=True)

    def presumed_lost(self, node_id: str) -> tuple[str, ...]:
        """The datacenters node `node_id` may take as lost: those declared at the recovery, while
        the cluster is still the recovered node alone (RULES.md L8)."""
        return self.lost_datacenters if self.members == (node_id,) else ()

    @staticmethod
    def from_json(text: str, where: str = IDENTITY_FILE) -> ClusterIdentity:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or raw.get("format") != IDENTITY_FORMAT:
                raise ValueError("unknown format")
            epoch = raw["cluster_epoch"]
            members = raw["members"]
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"cluster_epoch {epoch!r}")
            if not isinstance(members, list) or not members or not all(isinstance(m, str) for m in members):
                raise ValueError(f"members {members!r}")
            lost = raw.get("lost_datacenters", [])
            at = raw.get("recovered_at_ms", 0)
            if not isinstance(lost, list) or not all(isinstance(d, str) and d for d in lost):
                raise ValueError(f"lost_datacenters {lost!r}")
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise ValueError(f"recovered_at_ms {at!r}")
            return ClusterIdentity(epoch, tuple(members), str(raw.get("recovered_from", "")), tuple(lost), at)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{where} is not a controller identity file ({exc})",
                key=IDENTITY_FILE,
                hint="restore it from the node's backup, or wipe the node and add it back with "
                "`tide controller add-node`",
            ) from None
