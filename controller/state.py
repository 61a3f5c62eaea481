"""The controller's replicated state and its one deterministic transition, ``apply``.

This module owns everything that decides what the controller *remembers*: broker sets (members,
master, epochs, SyncStateSet), topics and versioned metadata. The Raft shell (``raft.py``)
replicates command objects and calls ``ControllerState.apply(cmd)`` on every replica; the
service (``service.py``) builds the commands and turns a ``Result`` into a reply.

Theory of operation
-------------------
Two rules keep the replicas identical:

1. **Everything that affects a transition lives in the command.** A command is a frozen,
   picklable dataclass carrying all of its inputs, including ``now_ms`` and the leader's liveness
   snapshot (``alive``). ``apply`` never reads a clock, a random source, the network or a file,
   and iterates in sorted order wherever order could show in a result. Liveness is the leader's
   memory (``liveness.HeartbeatTable``); it enters the log only as data inside a command.

2. **Validate completely, then mutate.** Each handler first checks every rule, in the order the
   reference gives (RULES.md), and raises ``_Reject`` on the first failure; only after the last
   check does it change anything. So a refused command changes nothing, and ``apply`` never
   raises for a bad request: it returns a non-OK ``Result`` whose ``code`` is a
   ``tidelog.errors`` code.

After every command ``apply`` checks the invariants (a master is a member and in its
SyncStateSet, epochs and id counters never decrease, a new master or SyncStateSet comes with a
new epoch, the broker set moved along the transition table below). A violation raises
``InvariantViolation``: the replica must stop rather than keep diverging state. These checks are not ``assert`` statements, so ``python -O`` keeps them.

Broker-set lifecycle (``_TRANSITIONS``): a set is ABSENT, LEADERLESS (registered, no master)
or MASTERED. The table lists the phases each successful event may lead to from each phase.

    event          ABSENT        LEADERLESS                MASTERED
    register       LEADERLESS    LEADERLESS                MASTERED
    elect          -             MASTERED                  MASTERED
    elect_none     -             -                         LEADERLESS
    alter          -             -                         MASTERED
    clean_members  -             LEADERLESS | ABSENT       MASTERED | LEADERLESS | ABSENT
    clean_set      -             ABSENT                    ABSENT
    report         -             LEADERLESS                MASTERED

A refused command, and a successful command that changed nothing, leave the phase as it was.

Topics have a generation: a number from a counter that only grows, given to each topic when it
is created, so a topic deleted and created again under the same name is a different topic to
the brokers, which drop the data of older generations (broker/TOPICS.md). A deleted topic
leaves a tombstone (its name, generation, broker sets and deletion time): brokers learn from
it that the data must go, and a topic of that name can be created again only
``recreate_after_ms`` after the deletion (the service passes the broker heartbeat timeout), so
that every master still taking writes has seen the tombstone before the new topic exists.

Versioned metadata is opaque bytes, except under ``ledger/``: such a value must decode as ledger
metadata when it is created; a CAS of it must obey the ledger rules (``ledger.metadata.check_update``),
so no client can move a ledger backwards or change where a closed ledger ends; and a CAS or delete
must carry the hash of the ledger's password (``ledger_password_hash``, computed by the service
from the password the request carried), compared here with the hash the metadata stores, so only a
holder of the password can close, recover or delete a ledger. The comparison happens at apply
time against the value being replaced: no race with another write between a check and the
change, and the command holds only the hash, which the metadata value already shows.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from tidelog.commitlog.consumequeue import user_topic_problem
from tidelog.controller.election import elect
from tidelog.errors import TidelogError, by_code
from tidelog.invariants import InvariantViolation
from tidelog.ledger.metadata import LedgerMetadata, check_change_proof, check_update

__all__ = [
    "MAX_META_VALUE_BYTES", "MAX_QUEUES_PER_BROKER_SET", "NAME_PATTERN", "AlterSyncStateSet",
    "BrokerSet", "CleanBrokerData", "ControllerState", "CreateTopic", "DeleteTopic", "ElectMaster",
    "InvariantViolation", "LiveInfo", "Member", "MetaCompareAndSet", "MetaCreate", "MetaDelete",
    "MetaEntry", "QueueRoute", "RegisterBroker", "ReplaceLedgerReplicas", "ReportOffsets", "Result", "Route", "Topic",
]

#: Broker set and topic names; also the keys of a topic's queue map.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]{1,127}$")
#: Datacenter and rack labels may be empty.
_LABEL_PATTERN = re.compile(r"^[A-Za-z0-9_.%-]{0,127}$")
_CLUSTER_ID_PATTERN = re.compile(r"^[a-z0-9-]{0,64}$")
#: Default cap on one metadata value; the whole state is snapshotted by Raft, so it stays small.
MAX_META_VALUE_BYTES = 1 << 20
MAX_QUEUES_PER_BROKER_SET = 1024
#: Metadata keys under this prefix hold ledger metadata; every CAS of one is checked by the ledger rules.
LEDGER_KEY_PREFIX = "ledger/"
MAX_META_KEY_CHARS = 1024
MAX_IDENTITY_CHARS = 256
MAX_ADDRESS_CHARS = 255
TOPIC_PERMS = ("r", "w", "rw")
_PRIORITY_DEFAULT = 2**31 - 1
SNAPSHOT_FORMAT = 2  # 2: the cluster id (format 1 snapshots are read, with none)


# InvariantViolation lives in tidelog.invariants (one class for every component), re-exported here.


# --- state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveInfo:
    """What the leader's heartbeat table knows about one alive broker."""

    epoch: int
    max_offset: int
    confirm_offset: int = -1
    priority: int = _PRIORITY_DEFAULT  # lower value = preferred


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

    @property
    def master(self) -> Member | None:
        return self.members.get(self.master_id) if self.master_id is not None else None


@dataclass
class Topic:
    name: str
    queues: dict[str, int]  # broker set name -> queue count
    perm: str = "rw"
    created_ms: int = 0
    generation: int = 0  # 0: created before generations existed (its data is never dropped by one)
    deleted_ms: int = 0  # tombstones only: when it was deleted


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


# --- commands -----------------------------------------------------------------------------


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


@dataclass(frozen=True)
class AlterSyncStateSet:
    broker_set: str
    master_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    sss_epoch: int
    alive: frozenset[int] = frozenset()
    now_ms: int = 0


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


@dataclass(frozen=True)
class DeleteTopic:
    name: str
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


# --- internals ----------------------------------------------------------------------------


class _Reject(Exception):
    def __init__(self, code: str, message: str, value: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.value = value


class Phase(Enum):
    ABSENT = "absent"
    LEADERLESS = "leaderless"
    MASTERED = "mastered"


_A, _L, _M = Phase.ABSENT, Phase.LEADERLESS, Phase.MASTERED
_TRANSITIONS: dict[str, dict[Phase, frozenset[Phase]]] = {
    "register": {_A: frozenset({_L}), _L: frozenset({_L}), _M: frozenset({_M})},
    "elect": {_L: frozenset({_M}), _M: frozenset({_M})},
    "elect_none": {_M: frozenset({_L})},
    "alter": {_M: frozenset({_M})},
    "clean_members": {_L: frozenset({_L, _A}), _M: frozenset({_M, _L, _A})},
    "clean_set": {_L: frozenset({_A}), _M: frozenset({_A})},
    "report": {_L: frozenset({_L}), _M: frozenset({_M})},
}


def _phase(bs: BrokerSet | None) -> Phase:
    if bs is None:
        return Phase.ABSENT
    return Phase.LEADERLESS if bs.master_id is None else Phase.MASTERED


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


def _bad(message: str) -> _Reject:
    return _Reject("INVALID_ARGUMENT", message)


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass and never a valid id, epoch or offset


def _need_nonneg(v: object, what: str) -> None:
    if not _is_int(v) or v < 0:  # type: ignore[operator]
        raise _bad(f"{what} must be a non-negative integer, got {v!r}")


def _need_name(v: object, what: str) -> None:
    if not isinstance(v, str) or not NAME_PATTERN.match(v):
        raise _bad(f"{what} must match {NAME_PATTERN.pattern}, got {v!r}")


def _need_address(v: object, what: str) -> None:
    ok = False
    if isinstance(v, str) and 0 < len(v) <= MAX_ADDRESS_CHARS and v.isprintable() and " " not in v:
        host, sep, port = v.rpartition(":")
        ok = bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
    if not ok:
        raise _bad(f"{what} must be 'host:port' with a port in 1..65535, got {v!r}")


def _need_ids(v: object, what: str) -> frozenset[int]:
    if not isinstance(v, (set, frozenset)) or not all(_is_int(i) and i >= 0 for i in v):
        raise _bad(f"{what} must be a set of non-negative broker ids, got {v!r}")
    return frozenset(v)


def _need_meta_key(v: object) -> None:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_META_KEY_CHARS or not v.isprintable():
        raise _bad(f"metadata key must be 1..{MAX_META_KEY_CHARS} printable characters, got {v!r}")


def _check_ledger_update(key: str, old: bytes, new: bytes) -> None:
    """Ledger metadata moves only along the ledger rules (ledger/RULES.md M5–M7), whoever writes it.

    Both values are decoded here, so a client cannot move a ledger backwards (CLOSED → OPEN), change
    where a CLOSED ledger ends, or store a value that is not ledger metadata. The check is a pure
    function of the two values: ``apply`` stays deterministic.
    """
    try:
        before = LedgerMetadata.decode(old)
        after = LedgerMetadata.decode(new)
        check_update(before, after)
    except TidelogError as err:
        raise _Reject(err.code, f"metadata {key}: {err.message}") from None


def _check_ledger_proof(key: str, stored: bytes, presented_hash: bytes | None, what: str) -> None:
    """Only a holder of the ledger's password changes or deletes its metadata (ledger/RULES.md M8)."""
    try:
        before = LedgerMetadata.decode(stored)
    except TidelogError:
        # Not ledger metadata (stored before values under ledger/ were checked): nothing to
        # protect; a CAS of it is refused by the rules check, a delete may clean it up.
        return
    if presented_hash is not None and not isinstance(presented_hash, bytes):
        raise _bad("ledger_password_hash must be bytes")
    try:
        check_change_proof(before, presented_hash, what=what)
    except TidelogError as err:
        raise _Reject(err.code, f"metadata {key}: {err.message}") from None


def _check_ledger_create(key: str, value: bytes) -> None:
    try:
        LedgerMetadata.decode(value)
    except TidelogError as err:
        raise _Reject(err.code, f"metadata {key}: {err.message}") from None


def _snapshot(bs: BrokerSet) -> BrokerSet:
    return copy.deepcopy(bs)


# --- the state machine --------------------------------------------------------------------


class ControllerState:
    """The replicated controller state. Mutate it only through ``apply``."""

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
        # Configuration, not state: every replica must be started with the same value.
        self.max_meta_value_bytes = max_meta_value_bytes
        self._handlers: dict[type, Callable[[Any], tuple[Result, str | None]]] = {
            RegisterBroker: self._register,
            ElectMaster: self._elect,
            AlterSyncStateSet: self._alter,
            CleanBrokerData: self._clean,
            ReportOffsets: self._report,
            CreateTopic: self._create_topic,
            DeleteTopic: self._delete_topic,
            MetaCreate: self._meta_create,
            MetaCompareAndSet: self._meta_cas,
            MetaDelete: self._meta_delete,
            ReplaceLedgerReplicas: self._replace_ledger_replicas,
        }

    # -- the one entry point --

    def apply(self, cmd: object) -> Result:
        """Apply one replicated command; deterministic, and never raises for a bad request."""
        handler = self._handlers.get(type(cmd))
        if handler is None:
            return Result("INVALID_ARGUMENT", f"unknown command {type(cmd).__name__}")
        set_name = getattr(cmd, "broker_set", None)
        before = self.broker_sets.get(set_name) if isinstance(set_name, str) else None
        before_phase = _phase(before)
        before_epochs = (before.master_epoch, before.sss_epoch, before.next_broker_id, before.master_id,
                         before.sync_state_set) if before else None
        cluster_id = self.cluster_id
        try:
            result, event = handler(cmd)
        except _Reject as rej:
            result, event = Result(rej.code, rej.message, rej.value), None
        _check(not cluster_id or self.cluster_id == cluster_id,
               f"the cluster id changed from {cluster_id} to {self.cluster_id}")
        if isinstance(set_name, str):
            self._check_set_after(set_name, before_phase, before_epochs, event if result.changed else None)
        return result

    # -- read helpers (copies: callers cannot corrupt replicated state by mutating them) --

    def broker_set(self, name: str) -> BrokerSet | None:
        bs = self.broker_sets.get(name)
        return _snapshot(bs) if bs is not None else None

    def deleted_topic(self, name: str) -> Topic | None:
        t = self.deleted_topics.get(name)
        return copy.deepcopy(t) if t is not None else None

    def topic(self, name: str) -> Topic | None:
        t = self.topics.get(name)
        return copy.deepcopy(t) if t is not None else None

    def route(self, topic: str) -> Route | None:
        """Topic -> its broker sets with the recorded master and replicas; None if no such topic.
        A broker set that is not (or no longer) registered appears with no master and no replicas."""
        t = self.topics.get(topic)
        if t is None:
            return None
        parts = []
        for name in sorted(t.queues):
            bs = self.broker_sets.get(name)
            master = bs.master if bs else None
            parts.append(QueueRoute(
                broker_set=name,
                queues=t.queues[name],
                master_id=master.broker_id if master else None,
                master_address=master.address if master else None,
                master_epoch=bs.master_epoch if bs else 0,
                replicas=tuple((i, bs.members[i].address) for i in sorted(bs.members)) if bs else (),
            ))
        return Route(topic=t.name, perm=t.perm, brokers=tuple(parts))

    def get_meta(self, key: str) -> MetaEntry | None:
        return self.metadata.get(key)

    def list_prefix(self, prefix: str) -> list[MetaEntry]:
        return [self.metadata[k] for k in sorted(self.metadata) if k.startswith(prefix)]

    # -- broker sets --

    def _register(self, c: RegisterBroker) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        _need_address(c.address, "address")
        _need_address(c.ha_address, "ha_address")
        for label, what in ((c.datacenter, "datacenter"), (c.rack, "rack")):
            if not isinstance(label, str) or not _LABEL_PATTERN.match(label):
                raise _bad(f"{what} must match {_LABEL_PATTERN.pattern}, got {label!r}")
        if (not isinstance(c.identity, str) or not 0 < len(c.identity) <= MAX_IDENTITY_CHARS
                or not c.identity.isprintable()):
            raise _bad(f"identity must be 1..{MAX_IDENTITY_CHARS} printable characters")
        if c.broker_id is not None:
            _need_nonneg(c.broker_id, "broker_id")
        _need_nonneg(c.now_ms, "now_ms")
        for value, what in ((c.cluster_id, "cluster_id"), (c.new_cluster_id, "new_cluster_id")):
            if not isinstance(value, str) or not _CLUSTER_ID_PATTERN.match(value):
                raise _bad(f"{what} must be 0..64 of a-z 0-9 -, got {value!r}")
        cluster_id = self.cluster_id or self._first_cluster_id(c)
        if c.cluster_id and cluster_id and c.cluster_id != cluster_id:  # R7: a disk of another cluster
            raise _Reject("CLUSTER_MISMATCH", f"the data directory of this broker belongs to cluster {c.cluster_id}, "
                                              f"not {cluster_id or 'this one'}")
        result, event = self._register_member(c)  # raises on refusal: nothing below happens then
        if cluster_id and cluster_id != self.cluster_id:
            self.cluster_id = cluster_id  # fixed by the first registration (an invariant keeps it)
            result = replace(result, changed=True)
        return result, event

    def _first_cluster_id(self, c: RegisterBroker) -> str:
        """R7, a state without a cluster id: a fresh cluster takes the leader's draw; one restored
        from an older snapshot takes the id a member proves it wrote (its id and identity token
        match), so the brokers that hold the data are never locked out; else it stays unknown."""
        if not self.broker_sets:
            return c.new_cluster_id
        bs = self.broker_sets.get(c.broker_set)
        member = bs.members.get(c.broker_id) if bs is not None and c.broker_id is not None else None
        if member is not None and member.identity == c.identity:
            return c.cluster_id
        return ""

    def _register_member(self, c: RegisterBroker) -> tuple[Result, str | None]:
        bs = self.broker_sets.get(c.broker_set)
        if c.broker_id is None:
            # A retried "register me as new" must not mint a second id: the identity finds it.
            if bs is not None:
                for m in bs.members.values():
                    if m.identity == c.identity:
                        return self._refresh_member(bs, m, c)
            if bs is None:
                bs = BrokerSet(name=c.broker_set, members={},
                               next_broker_id=self.next_id_floor.pop(c.broker_set, 1))
                self.broker_sets[c.broker_set] = bs
            new_id = bs.next_broker_id
            bs.next_broker_id += 1
            bs.members[new_id] = Member(
                broker_id=new_id, address=c.address, ha_address=c.ha_address, datacenter=c.datacenter,
                rack=c.rack, identity=c.identity, registered_ms=c.now_ms)
            return Result(value=new_id, message=f"registered broker {new_id}", changed=True), "register"

        if bs is None:
            raise _Reject("CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
                          f"broker set {c.broker_set} is not registered; register without a broker id")
        member = bs.members.get(c.broker_id)
        if member is None:
            if c.broker_id >= bs.next_broker_id or c.broker_id < 1:
                raise _Reject("CONTROLLER_BROKER_ID_INVALID",
                              f"broker id {c.broker_id} was never assigned in {c.broker_set}")
            raise _Reject("CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
                          f"broker {c.broker_id} of {c.broker_set} was cleaned; register without a broker id")
        if member.identity != c.identity:
            raise _Reject("CONTROLLER_BROKER_ID_INVALID",
                          f"broker id {c.broker_id} of {c.broker_set} belongs to another broker identity")
        return self._refresh_member(bs, member, c)

    def _refresh_member(self, bs: BrokerSet, m: Member, c: RegisterBroker) -> tuple[Result, str | None]:
        fresh = (c.address, c.ha_address, c.datacenter, c.rack)
        if (m.address, m.ha_address, m.datacenter, m.rack) == fresh:
            return Result(value=m.broker_id, message=f"broker {m.broker_id} already registered"), None
        m.address, m.ha_address, m.datacenter, m.rack = fresh
        return Result(value=m.broker_id, message=f"broker {m.broker_id} updated", changed=True), "register"

    def _elect(self, c: ElectMaster) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        if c.broker_id is not None:
            _need_nonneg(c.broker_id, "broker_id")
        if type(c.designated) is not bool or type(c.enable_unclean) is not bool:
            raise _bad("designated and enable_unclean must be booleans")
        if c.designated and c.broker_id is None:
            raise _bad("a designated election needs the broker_id to elect")
        if not isinstance(c.alive, Mapping) or not all(
                _is_int(k) and isinstance(v, LiveInfo) for k, v in c.alive.items()):
            raise _bad("alive must map broker ids to LiveInfo")
        _need_nonneg(c.now_ms, "now_ms")

        # Step 1 (RULES.md E1): unknown set.
        bs = self.broker_sets.get(c.broker_set)
        if bs is None:
            raise _Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"no broker set {c.broker_set}")
        if c.broker_id is not None and c.broker_id not in bs.members:
            raise _Reject("CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
                          f"broker {c.broker_id} is not registered in {c.broker_set}")
        # Heartbeats of brokers this set no longer knows must not win an election.
        alive = {i: info for i, info in c.alive.items() if i in bs.members}
        old = bs.master_id

        if bs.master_epoch == 0 and c.broker_id is not None:
            # E3: the first election takes the asking/designated broker, but only if it is alive.
            new = c.broker_id if c.broker_id in alive else None
        else:
            # E4: the policy (election.py).
            new = elect(bs.sync_state_set, bs.members.keys(), old,
                        c.broker_id if c.designated else None, alive, c.enable_unclean)

        if new is not None and new == old:
            raise _Reject("CONTROLLER_MASTER_STILL_EXIST",
                          f"broker {old} is alive and stays master of {c.broker_set}", _snapshot(bs))
        if new is not None:
            unclean = bs.master_epoch > 0 and new not in bs.sync_state_set
            bs.master_id = new
            bs.master_epoch += 1
            if unclean:
                bs.unclean_epoch = bs.master_epoch
            bs.sync_state_set = frozenset({new})
            bs.sss_epoch += 1
            return Result(value=_snapshot(bs), changed=True,
                          message=f"broker {new} is master of {c.broker_set} at epoch {bs.master_epoch}"), "elect"
        if c.broker_id is None and old is not None:
            # E7: record "no master" once; a retry finds no master recorded and changes nothing,
            # so one failure bumps the epoch once (QUIRK fixed, RULES.md).
            bs.master_id = None
            bs.master_epoch += 1
            return Result("CONTROLLER_MASTER_NOT_AVAILABLE", value=_snapshot(bs), changed=True,
                          message=f"no electable broker in {c.broker_set}; master cleared at epoch "
                                  f"{bs.master_epoch}"), "elect_none"
        if c.broker_id is None:
            raise _Reject("CONTROLLER_MASTER_NOT_AVAILABLE",
                          f"no electable broker in {c.broker_set}", _snapshot(bs))
        raise _Reject("CONTROLLER_ELECT_MASTER_FAILED",
                      f"broker {c.broker_id} asked for an election in {c.broker_set} but no eligible "
                      f"broker is alive", _snapshot(bs))

    def _alter(self, c: AlterSyncStateSet) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        _need_nonneg(c.master_id, "master_id")
        _need_nonneg(c.master_epoch, "master_epoch")
        _need_nonneg(c.sss_epoch, "sss_epoch")
        new_set = _need_ids(c.new_sync_state_set, "new_sync_state_set")
        alive = _need_ids(c.alive, "alive")
        _need_nonneg(c.now_ms, "now_ms")

        fail = "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED"
        bs = self.broker_sets.get(c.broker_set)
        if bs is None:  # A1
            raise _Reject(fail, f"no broker set {c.broker_set}")
        snap = _snapshot(bs)
        if new_set == bs.sync_state_set:  # A2, before the master check as in the reference
            raise _Reject(fail, "the proposed SyncStateSet equals the current one", snap)
        if bs.master_id is None or bs.master_id != c.master_id:  # A3
            raise _Reject("CONTROLLER_INVALID_MASTER",
                          f"broker {c.master_id} is not the master of {c.broker_set} "
                          f"(master: {bs.master_id})", snap)
        if c.master_epoch != bs.master_epoch:  # A4
            raise _Reject("CONTROLLER_FENCED_MASTER_EPOCH",
                          f"master epoch {c.master_epoch} is not the current {bs.master_epoch}", snap)
        if c.sss_epoch != bs.sss_epoch:  # A5
            raise _Reject("CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
                          f"SyncStateSet epoch {c.sss_epoch} is not the current {bs.sss_epoch}", snap)
        for i in sorted(new_set):  # A6, ascending so every replica reports the same broker
            if i not in bs.members:
                raise _Reject("CONTROLLER_INVALID_REPLICAS", f"broker {i} is not registered in {c.broker_set}",
                              snap)
            if i not in alive:
                raise _Reject("CONTROLLER_BROKER_NOT_ALIVE", f"broker {i} of {c.broker_set} is not alive", snap)
        if bs.master_id not in new_set:  # A7
            raise _Reject(fail, f"the proposed SyncStateSet leaves out the master {bs.master_id}", snap)
        bs.sync_state_set = new_set  # A8
        bs.sss_epoch += 1
        return Result(value=_snapshot(bs), changed=True,
                      message=f"SyncStateSet of {c.broker_set} is {sorted(new_set)} at epoch {bs.sss_epoch}"), "alter"

    def _clean(self, c: CleanBrokerData) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        ids = _need_ids(c.broker_ids, "broker_ids")
        alive = _need_ids(c.alive, "alive")
        if type(c.clean_living) is not bool:
            raise _bad("clean_living must be a boolean")
        if c.expect_epochs is not None and (
                not isinstance(c.expect_epochs, tuple) or len(c.expect_epochs) != 2
                or not all(type(e) is int and e >= 0 for e in c.expect_epochs)):
            raise _bad("expect_epochs must be (master epoch, SyncStateSet epoch)")
        _need_nonneg(c.now_ms, "now_ms")

        invalid = "CONTROLLER_INVALID_CLEAN_BROKER_METADATA"
        bs = self.broker_sets.get(c.broker_set)
        if not c.clean_living:  # C1: never forget a live broker by accident
            targets = ids if ids else (frozenset(bs.members) if bs else frozenset())
            living = sorted(targets & alive)
            if living:
                raise _Reject(invalid, f"broker {living[0]} of {c.broker_set} is still alive, clean up failure")
        if bs is None:  # C2
            raise _Reject(invalid, f"broker set {c.broker_set} does not exist, clean broker data failure")
        if c.expect_epochs is not None and (bs.master_epoch, bs.sss_epoch) != c.expect_epochs:  # C2a
            raise _Reject("CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
                          f"{c.broker_set} changed since the decommission was checked (epochs {c.expect_epochs} -> "
                          f"{(bs.master_epoch, bs.sss_epoch)}); check again")

        if not ids or bs.members.keys() <= ids:  # C3: the whole set goes
            self._drop_set(bs)
            return Result(message=f"broker set {c.broker_set} removed", changed=True), "clean_set"
        removed = ids & bs.members.keys()
        if not removed:
            return Result(value=_snapshot(bs), message="nothing to clean"), None
        for i in removed:
            del bs.members[i]
        if bs.master_id in removed:
            # QUIRK fixed: the reference keeps a removed master's id; a master must be a member.
            bs.master_id = None
            bs.master_epoch += 1
        if bs.sync_state_set & removed:
            bs.sync_state_set = bs.sync_state_set - removed
            bs.sss_epoch += 1  # every SyncStateSet change gets a new epoch (RULES.md C4)
        return Result(value=_snapshot(bs), changed=True,
                      message=f"removed brokers {sorted(removed)} from {c.broker_set}"), "clean_members"

    def _drop_set(self, bs: BrokerSet) -> None:
        self.next_id_floor[bs.name] = bs.next_broker_id
        del self.broker_sets[bs.name]

    def _report(self, c: ReportOffsets) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        _need_nonneg(c.broker_id, "broker_id")
        for v, what in ((c.epoch, "epoch"), (c.max_offset, "max_offset")):
            if not _is_int(v) or v < -1:
                raise _bad(f"{what} must be an integer >= -1, got {v!r}")
        bs = self.broker_sets.get(c.broker_set)
        if bs is None:
            raise _Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"no broker set {c.broker_set}")
        m = bs.members.get(c.broker_id)
        if m is None:
            raise _Reject("CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
                          f"broker {c.broker_id} is not registered in {c.broker_set}")
        if (c.epoch, c.max_offset) <= (m.last_epoch, m.last_max_offset):
            return Result(message="offsets not newer than recorded"), None
        m.last_epoch, m.last_max_offset = c.epoch, c.max_offset
        return Result(changed=True, message="offsets recorded"), "report"

    # -- topics --

    def _create_topic(self, c: CreateTopic) -> tuple[Result, str | None]:
        _need_name(c.name, "topic name")
        if (problem := user_topic_problem(c.name)) is not None:
            raise _bad(problem)
        if not isinstance(c.queues, Mapping) or not c.queues:
            raise _bad("queues must map at least one broker set name to a queue count")
        for name, count in c.queues.items():
            _need_name(name, "broker set name")
            if not _is_int(count) or not 1 <= count <= MAX_QUEUES_PER_BROKER_SET:
                raise _bad(f"queue count for {name} must be 1..{MAX_QUEUES_PER_BROKER_SET}, got {count!r}")
        if c.perm not in TOPIC_PERMS:
            raise _bad(f"perm must be one of {TOPIC_PERMS}, got {c.perm!r}")
        _need_nonneg(c.now_ms, "now_ms")
        _need_nonneg(c.recreate_after_ms, "recreate_after_ms")
        if c.name in self.topics:
            raise _Reject("TOPIC_EXISTS", f"topic {c.name} already exists")
        for name in sorted(c.queues):
            if name not in self.broker_sets:
                raise _Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST",
                              f"topic {c.name} names unknown broker set {name}")
        tomb = self.deleted_topics.get(c.name)
        if tomb is not None and c.now_ms - tomb.deleted_ms < c.recreate_after_ms:
            wait = tomb.deleted_ms + c.recreate_after_ms - c.now_ms
            raise _Reject("TOPIC_DELETION_PENDING", f"topic {c.name} was deleted {c.now_ms - tomb.deleted_ms} ms ago; "
                                                    f"it can be created again in {wait} ms, once every broker has "
                                                    f"dropped its data")
        t = Topic(name=c.name, queues=dict(sorted(c.queues.items())), perm=c.perm, created_ms=c.now_ms,
                  generation=self.next_topic_generation)
        self.next_topic_generation += 1
        self.deleted_topics.pop(c.name, None)
        self.topics[c.name] = t
        return Result(value=copy.deepcopy(t), changed=True, message=f"topic {c.name} created"), None

    def _delete_topic(self, c: DeleteTopic) -> tuple[Result, str | None]:
        _need_name(c.name, "topic name")
        _need_nonneg(c.now_ms, "now_ms")
        if c.name not in self.topics:
            raise _Reject("TOPIC_NOT_FOUND", f"no topic {c.name}")
        t = self.topics.pop(c.name)
        t.deleted_ms = c.now_ms
        self.deleted_topics[c.name] = t
        return Result(changed=True, message=f"topic {c.name} deleted"), None

    # -- versioned metadata --

    def _need_value(self, v: object) -> bytes:
        if not isinstance(v, (bytes, bytearray)):
            raise _bad("metadata value must be bytes")
        if len(v) > self.max_meta_value_bytes:
            raise _Reject("METADATA_TOO_LARGE",
                          f"metadata value of {len(v)} bytes exceeds {self.max_meta_value_bytes}")
        return bytes(v)

    def _meta_create(self, c: MetaCreate) -> tuple[Result, str | None]:
        _need_meta_key(c.key)
        value = self._need_value(c.value)
        _need_nonneg(c.now_ms, "now_ms")
        if c.key in self.metadata:
            raise _Reject("METADATA_EXISTS", f"metadata {c.key} already exists", self.metadata[c.key])
        if c.key.startswith(LEDGER_KEY_PREFIX):
            _check_ledger_create(c.key, value)
        e = MetaEntry(key=c.key, value=value, version=1, modified_ms=c.now_ms)
        self.metadata[c.key] = e
        return Result(value=e, changed=True), None

    def _meta_cas(self, c: MetaCompareAndSet) -> tuple[Result, str | None]:
        _need_meta_key(c.key)
        value = self._need_value(c.value)
        _need_nonneg(c.expected_version, "expected_version")
        _need_nonneg(c.now_ms, "now_ms")
        cur = self.metadata.get(c.key)
        if cur is None:
            raise _Reject("METADATA_NOT_FOUND", f"no metadata {c.key}")
        if cur.version != c.expected_version:
            raise _Reject("METADATA_VERSION_MISMATCH",
                          f"metadata {c.key} is at version {cur.version}, not {c.expected_version}", cur)
        if c.key.startswith(LEDGER_KEY_PREFIX):
            _check_ledger_proof(c.key, cur.value, c.ledger_password_hash, "change")
            _check_ledger_update(c.key, cur.value, value)
        e = MetaEntry(key=c.key, value=value, version=cur.version + 1, modified_ms=c.now_ms)
        self.metadata[c.key] = e
        return Result(value=e, changed=True), None

    def _meta_delete(self, c: MetaDelete) -> tuple[Result, str | None]:
        _need_meta_key(c.key)
        if c.expected_version is not None:
            _need_nonneg(c.expected_version, "expected_version")
        _need_nonneg(c.now_ms, "now_ms")
        cur = self.metadata.get(c.key)
        if cur is None:
            raise _Reject("METADATA_NOT_FOUND", f"no metadata {c.key}")
        if c.expected_version is not None and cur.version != c.expected_version:
            raise _Reject("METADATA_VERSION_MISMATCH",
                          f"metadata {c.key} is at version {cur.version}, not {c.expected_version}", cur)
        if c.key.startswith(LEDGER_KEY_PREFIX):
            _check_ledger_proof(c.key, cur.value, c.ledger_password_hash, "delete")
        del self.metadata[c.key]
        return Result(changed=True), None

    def _replace_ledger_replicas(self, c: ReplaceLedgerReplicas) -> tuple[Result, str | None]:
        _need_name(c.broker_set, "broker set name")
        _need_nonneg(c.now_ms, "now_ms")
        if not isinstance(c.repairs, tuple) or not c.repairs:
            raise _bad("repairs must name at least one ledger")
        bs = self.broker_sets.get(c.broker_set)
        if bs is None:
            raise _Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"broker set {c.broker_set} does not exist")
        updates = []
        keys = [r[0] for r in c.repairs if isinstance(r, tuple) and len(r) == 2]
        if len(set(keys)) != len(keys):
            raise _bad("each ledger may be named once in a repair")
        for repair in c.repairs:
            if not isinstance(repair, tuple) or len(repair) != 2:
                raise _bad("each repair is (ledger metadata key, ((old, new), ...))")
            key, pairs = repair
            _need_meta_key(key)
            if (not key.startswith(LEDGER_KEY_PREFIX) or not isinstance(pairs, tuple) or not pairs
                    or not all(isinstance(p, tuple) and len(p) == 2 for p in pairs)):
                raise _bad(f"{key!r}: a ledger key and at least one (old, new) pair")
            for old, new in pairs:
                _need_nonneg(old, "old broker id")
                _need_nonneg(new, "new broker id")
                if old in bs.members:  # PL8: only a broker that left the set is replaced
                    raise _Reject("PLACEMENT_REFUSED", f"broker {old} is still a member of {c.broker_set}")
                if new not in bs.sync_state_set:  # PL8: the new one must hold every acknowledged byte
                    raise _Reject("PLACEMENT_REFUSED", f"broker {new} is not in the SyncStateSet of {c.broker_set}")
            cur = self.metadata.get(key)
            if cur is None:
                continue  # deleted since the repair was planned: nothing to re-replicate
            try:
                meta = LedgerMetadata.decode(cur.value)
                new_meta = meta.with_replicas_replaced(dict(pairs))
                check_update(meta, new_meta)
            except TidelogError as err:
                raise _Reject(err.code, f"metadata {key}: {err.message}") from None
            if meta.broker_set != c.broker_set:
                raise _bad(f"{key} is a ledger of {meta.broker_set}, not {c.broker_set}")
            if new_meta != meta:
                updates.append(MetaEntry(key=key, value=new_meta.encode(), version=cur.version + 1,
                                         modified_ms=c.now_ms))
        for e in updates:
            self.metadata[e.key] = e
        return Result(value=[e.key for e in updates], changed=bool(updates),
                      message=f"{len(updates)} ledger(s) re-replicated"), None

    # -- invariants --

    def _check_set_after(self, name: str, before_phase: Phase,
                         before_epochs: tuple[int, int, int, int | None, frozenset[int]] | None,
                         event: str | None) -> None:
        bs = self.broker_sets.get(name)
        after = _phase(bs)
        if event is None:
            _check(after == before_phase, f"{name}: phase moved {before_phase} -> {after} without an event")
        else:
            allowed = _TRANSITIONS[event].get(before_phase, frozenset())
            _check(after in allowed, f"{name}: {event} may not move {before_phase} -> {after}")
        if bs is None:
            return
        _check_broker_set(bs)
        if before_epochs is not None:
            me, se, nid, master, sss = before_epochs
            _check(bs.master_epoch >= me, f"{name}: master epoch went back {me} -> {bs.master_epoch}")
            _check(bs.sss_epoch >= se, f"{name}: SyncStateSet epoch went back {se} -> {bs.sss_epoch}")
            _check(bs.next_broker_id >= nid, f"{name}: next broker id went back {nid} -> {bs.next_broker_id}")
            # One master per epoch: whoever is master now was master for the whole epoch.
            _check(bs.master_id == master or bs.master_epoch > me,
                   f"{name}: master changed {master} -> {bs.master_id} within epoch {me}")
            _check(bs.sync_state_set == sss or bs.sss_epoch > se,
                   f"{name}: SyncStateSet changed within its epoch {se}")

    def check_invariants(self) -> None:
        """Check every invariant of the whole state (used after restoring a snapshot)."""
        for name, bs in self.broker_sets.items():
            _check(bs.name == name, f"broker set stored under {name} is named {bs.name}")
            _check_broker_set(bs)
            _check(self.next_id_floor.get(name, 1) <= bs.next_broker_id,
                   f"{name}: next broker id below its retired floor")
        for name, t in self.topics.items():
            _check(t.name == name and bool(t.queues), f"topic {name} is malformed")
            _check(0 <= t.generation < self.next_topic_generation, f"topic {name}: generation {t.generation} "
                                                                    f"not below the counter {self.next_topic_generation}")
        for name, t in self.deleted_topics.items():
            _check(t.name == name and name not in self.topics, f"tombstone {name} is malformed or alive")
        for key, e in self.metadata.items():
            _check(e.key == key and e.version >= 1, f"metadata {key} is malformed")

    # -- snapshots --

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot; bytes are base64, sets are sorted lists, order is canonical."""
        return {
            "format": SNAPSHOT_FORMAT,
            "broker_sets": [
                {
                    "name": bs.name,
                    "next_broker_id": bs.next_broker_id,
                    "master_id": bs.master_id,
                    "master_epoch": bs.master_epoch,
                    "sync_state_set": sorted(bs.sync_state_set),
                    "sss_epoch": bs.sss_epoch,
                    "unclean_epoch": bs.unclean_epoch,
                    "members": [vars(bs.members[i]).copy() for i in sorted(bs.members)],
                }
                for _, bs in sorted(self.broker_sets.items())
            ],
            "next_id_floor": dict(sorted(self.next_id_floor.items())),
            "cluster_id": self.cluster_id,
            "topics": [_topic_dict(t) for _, t in sorted(self.topics.items())],
            "next_topic_generation": self.next_topic_generation,
            "deleted_topics": [_topic_dict(t) for _, t in sorted(self.deleted_topics.items())],
            "metadata": [
                {"key": e.key, "value": base64.b64encode(e.value).decode("ascii"), "version": e.version,
                 "modified_ms": e.modified_ms}
                for _, e in sorted(self.metadata.items())
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], max_meta_value_bytes: int = MAX_META_VALUE_BYTES) -> ControllerState:
        if d.get("format") not in (1, SNAPSHOT_FORMAT):
            raise ValueError(f"unsupported controller snapshot format {d.get('format')!r}")
        s = cls(max_meta_value_bytes=max_meta_value_bytes)
        for b in d["broker_sets"]:
            members = {m["broker_id"]: Member(**m) for m in b["members"]}
            s.broker_sets[b["name"]] = BrokerSet(
                name=b["name"], members=members, next_broker_id=b["next_broker_id"],
                master_id=b["master_id"], master_epoch=b["master_epoch"],
                sync_state_set=frozenset(b["sync_state_set"]), sss_epoch=b["sss_epoch"],
                unclean_epoch=b.get("unclean_epoch", 0))
        s.next_id_floor = {str(k): int(v) for k, v in d.get("next_id_floor", {}).items()}
        s.cluster_id = str(d.get("cluster_id", ""))  # snapshots from before cluster ids have none
        for t in d["topics"]:
            s.topics[t["name"]] = _topic_from(t)
        # snapshots from before topic generations: their topics are generation 0
        s.next_topic_generation = int(d.get("next_topic_generation", 1))
        for t in d.get("deleted_topics", ()):
            s.deleted_topics[t["name"]] = _topic_from(t)
        for e in d["metadata"]:
            s.metadata[e["key"]] = MetaEntry(key=e["key"], value=base64.b64decode(e["value"]),
                                             version=e["version"], modified_ms=e.get("modified_ms", 0))
        s.check_invariants()
        return s

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ControllerState):
            return NotImplemented
        return (self.broker_sets, self.topics, self.metadata, self.next_id_floor, self.next_topic_generation,
                self.deleted_topics, self.cluster_id) == (other.broker_sets, other.topics, other.metadata,
                                                          other.next_id_floor, other.next_topic_generation,
                                                          other.deleted_topics, other.cluster_id)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (f"ControllerState({len(self.broker_sets)} broker sets, {len(self.topics)} topics, "
                f"{len(self.metadata)} metadata keys)")


def _topic_dict(t: Topic) -> dict[str, Any]:
    return {"name": t.name, "queues": dict(sorted(t.queues.items())), "perm": t.perm, "created_ms": t.created_ms,
            "generation": t.generation, "deleted_ms": t.deleted_ms}


def _topic_from(d: Mapping[str, Any]) -> Topic:
    return Topic(name=d["name"], queues=dict(d["queues"]), perm=d["perm"], created_ms=d.get("created_ms", 0),
                 generation=d.get("generation", 0), deleted_ms=d.get("deleted_ms", 0))


def _check_broker_set(bs: BrokerSet) -> None:
    n = bs.name
    _check(bool(bs.members), f"{n}: a registered broker set has members")
    _check(all(i == m.broker_id and 1 <= i < bs.next_broker_id for i, m in bs.members.items()),
           f"{n}: member ids must be assigned ids below next_broker_id {bs.next_broker_id}")
    _check(bs.master_epoch >= 0 and bs.sss_epoch >= 0, f"{n}: negative epoch")
    _check(bs.sync_state_set <= bs.members.keys(), f"{n}: SyncStateSet {sorted(bs.sync_state_set)} "
                                                   f"names non-members")
    if bs.master_id is not None:
        _check(bs.master_id in bs.members, f"{n}: master {bs.master_id} is not a member")
        _check(bs.master_id in bs.sync_state_set, f"{n}: master {bs.master_id} is not in its SyncStateSet")
    if bs.master_epoch == 0:
        _check(bs.master_id is None and not bs.sync_state_set and bs.sss_epoch == 0,
               f"{n}: before the first election there is no master and no SyncStateSet")
