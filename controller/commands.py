"""The commands the controller's Raft log carries, and the ``Result`` that applying one answers.

Each command is a frozen, picklable dataclass holding every input its transition needs (including
``now_ms`` and, where liveness matters, the leader's liveness snapshot ``alive``), so every replica
computes the same ``Result`` from the same log (controller/RULES.md §0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidelog.errors import by_code

from .model import LiveInfo


@dataclass(frozen=True)
class RegisterBroker:
    """Add a broker (``broker_id`` None: the controller assigns an id) or refresh its addresses."""

    broker_set: str
    address: str
    ha_address: str
    datacenter: str = ""
    rack: str = ""
    identity: str = ""
    broker_id: int | None = None
    now_ms: int = 0
    # the cluster id the broker's identity file names ("" for a new data dir), and the id the leader
    # drew for the cluster in case it has none yet (the first registration fixes it for good)
    cluster_id: str = ""
    new_cluster_id: str = ""


@dataclass(frozen=True)
class ElectMaster:
    """Elect a master. ``broker_id`` None: controller-triggered; ``designated``: operator's choice;
    otherwise broker-triggered with ``broker_id`` = the asking broker."""

    broker_set: str
    broker_id: int | None = None
    designated: bool = False
    alive: Mapping[int, LiveInfo] = field(default_factory=dict)
    enable_unclean: bool = False
    now_ms: int = 0
    # the asking broker is the recorded master, back from a crash (RULES.md E8). A default, so
    # ElectMaster commands journaled before the field existed unpickle with it
    restarted: bool = False
    # with restarted: the master epoch the broker held when it crashed, the one it gives up
    # (RULES.md E8); 0 in commands journaled before the field existed (not checked for those)
    restarted_epoch: int = 0


@dataclass(frozen=True)
class AlterSyncStateSet:
    broker_set: str
    master_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    sss_epoch: int
    alive: frozenset[int] = frozenset()
    now_ms: int = 0
    attempt: int = 0  # the master's number for this attempt (RULES.md A4b); 0: not numbered


@dataclass(frozen=True)
class CleanBrokerData:
    """Forget brokers (``broker_ids`` empty: the whole broker set)."""

    broker_set: str
    broker_ids: frozenset[int] = frozenset()
    clean_living: bool = False
    # a decommission (RULES.md PL7) checked its rules against the set at these (master epoch,
    # SyncStateSet epoch); refused if either moved since (another decommission, a shrink, an election)
    expect_epochs: tuple[int, int] | None = None
    alive: frozenset[int] = frozenset()
    now_ms: int = 0


@dataclass(frozen=True)
class CreateTopic:
    name: str
    queues: Mapping[str, int]
    perm: str = "rw"
    now_ms: int = 0
    # a topic of a deleted name is created only this long after the deletion (TOPIC_DELETION_PENDING)
    recreate_after_ms: int = 0
    # 0: the brokers' retention_ms. A default, so CreateTopic commands journaled before the field
    # existed unpickle with it (a dataclass default is a class attribute)
    retention_ms: int = 0


@dataclass(frozen=True)
class CreateTopics:
    """Several `CreateTopic`s in one Raft entry, each checked and applied on its own, in order
    (one refused changes none of the others): bulk creation costs one commit, not one per topic."""

    topics: tuple[CreateTopic, ...]


@dataclass(frozen=True)
class DeleteTopic:
    name: str
    now_ms: int = 0


@dataclass(frozen=True)
class AlterTopicQueues:
    """Grow a topic's queues: ``queues`` maps broker sets to their new counts. Counts only go
    up; a broker set the topic does not have yet is added."""

    name: str
    queues: Mapping[str, int]
    now_ms: int = 0


@dataclass(frozen=True)
class AlterTopicRetention:
    """Set how long a topic's messages stay readable (0: the brokers' own ``retention_ms``)."""

    name: str
    retention_ms: int
    now_ms: int = 0


@dataclass(frozen=True)
class MetaCreate:
    key: str
    value: bytes
    now_ms: int = 0


@dataclass(frozen=True)
class MetaCompareAndSet:
    key: str
    value: bytes
    expected_version: int
    now_ms: int = 0
    # under ledger/: hash_password() of the password the request carried (None: it carried none)
    ledger_password_hash: bytes | None = None


@dataclass(frozen=True)
class MetaDelete:
    key: str
    expected_version: int | None = None
    now_ms: int = 0
    ledger_password_hash: bytes | None = None


@dataclass(frozen=True)
class ReplaceLedgerReplicas:
    """Re-replication of ledgers (RULES.md PL8): in each listed ledger of ``broker_set``, broker
    ``old`` becomes ``new`` in every ensemble. Authorised by the cluster secret (a signed operator
    call), not by the ledgers' passwords: the replicas are the broker set's, and only which broker
    ids hold the entries changes (M7), never the entries or the ledger's state."""

    broker_set: str
    repairs: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()  # (metadata key, ((old, new), ...))
    now_ms: int = 0


@dataclass(frozen=True)
class ReportOffsets:
    """Record a broker's newest (epoch, max offset); only ever moves upward."""

    broker_set: str
    broker_id: int
    epoch: int
    max_offset: int


@dataclass(frozen=True)
class CreateUser:
    """Add a user; ``signing_key`` is derived from its secret (tidelog/access.py), never the secret."""

    name: str
    access_key: str
    signing_key: str
    now_ms: int = 0


@dataclass(frozen=True)
class DeleteUser:
    name: str
    now_ms: int = 0


@dataclass(frozen=True)
class GrantAcl:
    user: str
    kind: str
    pattern: str
    permission: str
    now_ms: int = 0


@dataclass(frozen=True)
class RevokeAcl:
    user: str
    kind: str
    pattern: str
    permission: str
    now_ms: int = 0


@dataclass(frozen=True)
class Result:
    """What ``apply`` answers. ``changed`` says whether the state moved (a non-OK result changes
    nothing, except the controller-triggered "no master" election, see RULES.md)."""

    code: str = "OK"
    message: str = ""
    value: object = None
    changed: bool = False

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    def error(self) -> Exception | None:
        """The ``tidelog.errors`` exception this result stands for (None when OK)."""
        return None if self.ok else by_code(self.code)(self.message)


#: The class path the Raft log pickles these under. The journal on disk and the entries sent to
#: other controller nodes hold pickled commands, named by module; they were defined in
#: ``tidelog.controller.state`` (which still exports them), so a journal written before or after
#: this module existed replays on either, and nodes of both layouts read each other's entries.
PICKLED_AS = "tidelog.controller.state"

for _command in (
    RegisterBroker,
    ElectMaster,
    AlterSyncStateSet,
    CleanBrokerData,
    CreateTopic,
    CreateTopics,
    DeleteTopic,
    AlterTopicQueues,
    AlterTopicRetention,
    MetaCreate,
    MetaCompareAndSet,
    MetaDelete,
    ReplaceLedgerReplicas,
    ReportOffsets,
    CreateUser,
    DeleteUser,
    GrantAcl,
    RevokeAcl,
):
    _command.__module__ = PICKLED_AS
