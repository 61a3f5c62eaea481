"""What the controller remembers: the records of its replicated state and their limits.

Plain data only: broker sets and their members, topics (and tombstones), versioned metadata
entries, the routes read from them, and ``StateData``, the container ``ControllerState``
(``state.py``) adds its one transition to. Nothing here changes state; the command handlers
(``membership.py``, ``mastership.py``, ``topics.py``, ``ledgermeta.py``, ``replacement.py``) do.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass

from tidelog.acl import Grant, User

#: Broker set and topic names; also the keys of a topic's queue map.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]{1,127}$")
#: Datacenter and rack labels may be empty.
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]{0,127}$")
CLUSTER_ID_PATTERN = re.compile(r"^[a-z0-9-]{0,64}$")
#: Default cap on one metadata value; the whole state is snapshotted by Raft, so it stays small.
MAX_META_VALUE_BYTES = 1 << 20
MAX_QUEUES_PER_BROKER_SET = 1024
#: Metadata keys under this prefix hold ledger metadata; every CAS of one is checked by the ledger rules.
LEDGER_KEY_PREFIX = "ledger/"
MAX_META_KEY_CHARS = 1024
MAX_IDENTITY_CHARS = 256
MAX_ADDRESS_CHARS = 255
TOPIC_PERMS = ("r", "w", "rw")
PRIORITY_DEFAULT = 2**31 - 1
#: A topic's own retention: 0 (the brokers'), or from one second up to ten years.
MIN_TOPIC_RETENTION_MS = 1000
MAX_TOPIC_RETENTION_MS = 10 * 365 * 86_400_000


@dataclass(frozen=True)
class LiveInfo:
    """What the leader's heartbeat table knows about one alive broker."""

    epoch: int
    max_offset: int
    confirm_offset: int = -1
    priority: int = PRIORITY_DEFAULT  # lower value = preferred


@dataclass
class Member:
    broker_id: int
    address: str
    ha_address: str
    datacenter: str = ""
    rack: str = ""
    identity: str = ""
    last_epoch: int = -1
    last_max_offset: int = -1
    registered_ms: int = 0


@dataclass
class BrokerSet:
    name: str
    members: dict[int, Member]
    next_broker_id: int = 1
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sss_epoch: int = 0
    unclean_epoch: int = 0  # the last master epoch that was elected from outside the SyncStateSet
    # (master epoch, attempt) of the newest numbered AlterSyncStateSet attempt answered (RULES.md A4b)
    alter_attempt: tuple[int, int] = (0, 0)

    @property
    def master(self) -> Member | None:
        return self.members.get(self.master_id) if self.master_id is not None else None


@dataclass(frozen=True)
class Topic:
    """Replaced, never changed in place: a snapshot being written holds references to the topics
    as they were (controller/snapshot.py `capture`). Its `queues` dict is replaced likewise."""

    name: str
    queues: dict[str, int]  # broker set name -> queue count
    perm: str = "rw"
    created_ms: int = 0
    generation: int = 0  # 0: created before generations existed (its data is never dropped by one)
    deleted_ms: int = 0  # tombstones only: when it was deleted
    # how long its messages stay readable; 0: the brokers' retention_ms (docs/ARCHITECTURE.md §6.4)
    retention_ms: int = 0


@dataclass(frozen=True)
class MetaEntry:
    key: str
    value: bytes
    version: int
    modified_ms: int = 0


@dataclass(frozen=True)
class QueueRoute:
    """One broker set's share of a topic, with the master as the controller recorded it."""

    broker_set: str
    queues: int
    master_id: int | None
    master_address: str | None
    master_epoch: int
    replicas: tuple[tuple[int, str], ...]  # (broker id, address), ascending id, master included


@dataclass(frozen=True)
class Route:
    topic: str
    perm: str
    brokers: tuple[QueueRoute, ...]  # ascending broker set name


class MetaChanges:
    """The metadata keys changed lately, in order, each with a serial number: what a reader of
    the metadata (the leader's placement audit, controller/ledgerview.py) needs to look at again,
    rather than every key. Local to a replica's state object, not replicated state: not compared,
    not in snapshots (a state restored from one starts a new log)."""

    def __init__(self, keep: int = 65536) -> None:
        self.serial = 0  # of the last change noted
        self._recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=keep)

    def note(self, key: str) -> None:
        self.serial += 1
        self._recent.append((self.serial, key))

    def since(self, serial: int) -> list[str] | None:
        """The keys changed after change `serial` (a key once per change, latest first); None
        when more changed than are kept: the reader must look at every key."""
        if serial == self.serial:
            return []
        if serial > self.serial or not self._recent or self._recent[0][0] > serial + 1:
            return None
        out = []
        for number, key in reversed(self._recent):
            if number <= serial:
                break
            out.append(key)
        return out


class StateData:
    """Every field the controller replicates, and one setting every replica must share."""

    def __init__(self, max_meta_value_bytes: int = MAX_META_VALUE_BYTES) -> None:
        self.broker_sets: dict[str, BrokerSet] = {}
        self.topics: dict[str, Topic] = {}
        self.next_topic_generation = 1
        # deleted topics by name (the last deleted generation): brokers drop their data
        self.deleted_topics: dict[str, Topic] = {}
        self.metadata: dict[str, MetaEntry] = {}
        # A dropped broker set remembers its id counter so a re-created set never reuses an id
        # that a stale broker may still hold on disk.
        self.next_id_floor: dict[str, int] = {}
        self.cluster_id = ""  # drawn by the leader at the first registration; never changes after
        # users by name and their grants (controller/users.py, tidelog/acl.py); the version grows
        # with every change of either
        self.users: dict[str, User] = {}
        self.grants: set[Grant] = set()
        self.acl_version = 0
        # Configuration, not state: every replica must be started with the same value.
        self.max_meta_value_bytes = max_meta_value_bytes
        self.meta_changes = MetaChanges()  # which metadata keys changed (not replicated state)


# Commands carry LiveInfo through the Raft log: pickled under the path it had (commands.PICKLED_AS).
LiveInfo.__module__ = "tidelog.controller.state"
