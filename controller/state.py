"""The controller's replicated state and its one deterministic transition, ``apply``.

``ControllerState`` is what the controller *remembers* (broker sets with their members, master,
epochs and SyncStateSet; topics; versioned metadata) plus the one entry point that changes it.
The Raft shell (``raft.py``) replicates command objects and calls ``ControllerState.apply(cmd)``
on every replica; the service (``service.py``) builds the commands and turns a ``Result`` into a
reply. The parts live in modules named for what they hold, and are re-exported here:

    model.py        the records (broker sets, members, topics, metadata entries, routes)
    commands.py     the commands the log carries, and ``Result``
    validation.py   ``Reject`` and the input checks every handler shares
    membership.py   RegisterBroker, CleanBrokerData, ReportOffsets
    mastership.py   ElectMaster, AlterSyncStateSet
    topics.py       CreateTopic, AlterTopicQueues, AlterTopicRetention, DeleteTopic, and routes
    ledgermeta.py   MetaCreate, MetaCompareAndSet, MetaDelete and the ledger rules
    replacement.py  ReplaceLedgerReplicas (RULES.md PL8)
    users.py        CreateUser, DeleteUser, GrantAcl, RevokeAcl (docs/ARCHITECTURE.md §12.2)
    phases.py       the broker-set transition table and the invariants
    snapshot.py     the snapshot codec

These modules import each other relatively: mypy, which cannot follow the package-dir mapping
that makes ``controller/`` the package ``tidelog.controller``, then type-checks them against each
other instead of seeing ``Any``.

Theory of operation
-------------------
Two rules keep the replicas identical:

1. **Everything that affects a transition lives in the command.** A command is a frozen,
   picklable dataclass carrying all of its inputs, including ``now_ms`` and the leader's liveness
   snapshot (``alive``). ``apply`` never reads a clock, a random source, the network or a file,
   and iterates in sorted order wherever order could show in a result. Liveness is the leader's
   memory (``liveness.HeartbeatTable``); it enters the log only as data inside a command.

2. **Validate completely, then mutate.** Each handler first checks every rule, in the order the
   reference gives (RULES.md), and raises ``Reject`` on the first failure; only after the last
   check does it change anything. So a refused command changes nothing, and ``apply`` never
   raises for a bad request: it returns a non-OK ``Result`` whose ``code`` is a
   ``tidelog.errors`` code.

After every command ``apply`` checks the invariants (``phases.py``: a master is a member and in
its SyncStateSet, epochs and id counters never decrease, a new master or SyncStateSet comes with
a new epoch, the broker set moved along the transition table). A violation raises
``InvariantViolation``: the replica must stop rather than keep diverging state. These checks are
not ``assert`` statements, so ``python -O`` keeps them.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Mapping
from typing import Any

from tidelog.acl import AclState
from tidelog.invariants import InvariantViolation, require

from . import ledgermeta, mastership, membership, replacement, snapshot, topics, users
from .commands import (
    AlterSyncStateSet,
    AlterTopicQueues,
    AlterTopicRetention,
    CleanBrokerData,
    CreateTopic,
    CreateTopics,
    CreateUser,
    DeleteTopic,
    DeleteUser,
    ElectMaster,
    GrantAcl,
    MetaCompareAndSet,
    MetaCreate,
    MetaDelete,
    RegisterBroker,
    ReplaceLedgerReplicas,
    ReportOffsets,
    Result,
    RevokeAcl,
)
from .model import (
    LEDGER_KEY_PREFIX,
    MAX_ADDRESS_CHARS,
    MAX_IDENTITY_CHARS,
    MAX_META_KEY_CHARS,
    MAX_META_VALUE_BYTES,
    MAX_QUEUES_PER_BROKER_SET,
    NAME_PATTERN,
    TOPIC_PERMS,
    BrokerSet,
    LiveInfo,
    Member,
    MetaEntry,
    QueueRoute,
    Route,
    StateData,
    Topic,
)
from .phases import SetBefore, check_set_after, check_state
from .snapshot import SNAPSHOT_FORMAT
from .validation import Outcome, Reject

__all__ = [
    "LEDGER_KEY_PREFIX",
    "MAX_ADDRESS_CHARS",
    "MAX_IDENTITY_CHARS",
    "MAX_META_KEY_CHARS",
    "MAX_META_VALUE_BYTES",
    "MAX_QUEUES_PER_BROKER_SET",
    "NAME_PATTERN",
    "SNAPSHOT_FORMAT",
    "TOPIC_PERMS",
    "AlterSyncStateSet",
    "AlterTopicQueues",
    "AlterTopicRetention",
    "BrokerSet",
    "CleanBrokerData",
    "ControllerState",
    "CreateTopic",
    "CreateTopics",
    "CreateUser",
    "DeleteTopic",
    "DeleteUser",
    "GrantAcl",
    "ElectMaster",
    "HANDLERS",
    "InvariantViolation",
    "LiveInfo",
    "Member",
    "MetaCompareAndSet",
    "MetaCreate",
    "MetaDelete",
    "MetaEntry",
    "QueueRoute",
    "RegisterBroker",
    "ReplaceLedgerReplicas",
    "ReportOffsets",
    "Result",
    "RevokeAcl",
    "Route",
    "Topic",
]

#: Each command type's handler (tests substitute a rogue one to see the invariants catch it). A
#: handler takes exactly its own command type; the table erases that to ``Any`` because the key
#: (the type) is what guarantees the match.
HANDLERS: dict[type, Callable[[StateData, Any], Outcome]] = {
    RegisterBroker: membership.register,
    ElectMaster: mastership.elect,
    AlterSyncStateSet: mastership.alter,
    CleanBrokerData: membership.clean,
    ReportOffsets: membership.report,
    CreateTopic: topics.create_topic,
    CreateTopics: topics.create_topics,
    AlterTopicQueues: topics.alter_topic_queues,
    AlterTopicRetention: topics.alter_topic_retention,
    DeleteTopic: topics.delete_topic,
    MetaCreate: ledgermeta.meta_create,
    MetaCompareAndSet: ledgermeta.meta_cas,
    MetaDelete: ledgermeta.meta_delete,
    ReplaceLedgerReplicas: replacement.replace_ledger_replicas,
    CreateUser: users.create_user,
    DeleteUser: users.delete_user,
    GrantAcl: users.grant_acl,
    RevokeAcl: users.revoke_acl,
}


class ControllerState(StateData):
    """The replicated controller state. Mutate it only through ``apply``."""

    # -- the one entry point --

    def apply(self, cmd: object) -> Result:
        """Apply one replicated command; deterministic, and never raises for a bad request."""
        handler = HANDLERS.get(type(cmd))
        if handler is None:
            return Result("INVALID_ARGUMENT", f"unknown command {type(cmd).__name__}")
        set_name = getattr(cmd, "broker_set", None)
        before = SetBefore.of(self.broker_sets.get(set_name)) if isinstance(set_name, str) else None
        cluster_id = self.cluster_id
        try:
            result, event = handler(self, cmd)
        except Reject as rej:
            result, event = Result(rej.code, rej.message, rej.value), None
        require(
            not cluster_id or self.cluster_id == cluster_id,
            f"the cluster id changed from {cluster_id} to {self.cluster_id}",
        )
        if isinstance(set_name, str) and before is not None:
            check_set_after(
                set_name, self.broker_sets.get(set_name), before, event if result.changed else None
            )
        return result

    # -- read helpers (copies: callers cannot corrupt replicated state by mutating them) --

    def broker_set(self, name: str) -> BrokerSet | None:
        bs = self.broker_sets.get(name)
        return membership.copy_set(bs) if bs is not None else None

    def deleted_topic(self, name: str) -> Topic | None:
        t = self.deleted_topics.get(name)
        return copy.deepcopy(t) if t is not None else None

    def topic(self, name: str) -> Topic | None:
        t = self.topics.get(name)
        return copy.deepcopy(t) if t is not None else None

    def route(self, topic: str) -> Route | None:
        """Topic -> its broker sets with the recorded master and replicas; None if no such topic.
        A broker set that is not (or no longer) registered appears with no master and no replicas."""
        return topics.route(self, topic)

    def acl_table(self) -> AclState:
        """The users and grants as the servers decide with them (immutable: a copy)."""
        return AclState(self.acl_version, dict(self.users), frozenset(self.grants))

    def get_meta(self, key: str) -> MetaEntry | None:
        return self.metadata.get(key)

    def list_page(self, prefix: str, start_after: str, limit: int) -> tuple[list[MetaEntry], str]:
        """The entries under `prefix` whose keys sort after `start_after`, in key order, at most
        `limit` of them (0: all), and the key the next page starts after ("": none left). One
        page costs a pass over the keys and a sort of the prefix's only: a group's member keys
        beside a million ledgers' in microseconds, not a second."""
        keys = [k for k in self.metadata if k.startswith(prefix) and k > start_after]
        if limit <= 0 or len(keys) <= limit:
            return [self.metadata[k] for k in sorted(keys)], ""
        page = heapq.nsmallest(limit, keys)
        return [self.metadata[k] for k in page], page[-1]

    def list_prefix(self, prefix: str) -> list[MetaEntry]:
        return self.list_page(prefix, "", 0)[0]

    # -- invariants and snapshots --

    def check_invariants(self) -> None:
        """Check every invariant of the whole state (used after restoring a snapshot)."""
        check_state(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot; bytes are base64, sets are sorted lists, order is canonical."""
        return snapshot.encode(self)

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], max_meta_value_bytes: int = MAX_META_VALUE_BYTES
    ) -> ControllerState:
        s = cls(max_meta_value_bytes=max_meta_value_bytes)
        snapshot.restore(s, d)
        s.check_invariants()
        return s

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ControllerState):
            return NotImplemented
        return self._fields() == other._fields()

    def _fields(self) -> tuple[object, ...]:
        return (
            self.broker_sets,
            self.topics,
            self.metadata,
            self.next_id_floor,
            self.next_topic_generation,
            self.deleted_topics,
            self.cluster_id,
            self.users,
            self.grants,
            self.acl_version,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable like the dicts it holds

    def __repr__(self) -> str:
        return (
            f"ControllerState({len(self.broker_sets)} broker sets, {len(self.topics)} topics, "
            f"{len(self.metadata)} metadata keys)"
        )
