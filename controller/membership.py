"""Broker-set membership: registering brokers (RULES.md §1), forgetting them (CleanBrokerData,
§5) and recording the offsets they report.

Each handler takes the state and its command, validates completely, then mutates (RULES.md V1),
and answers an ``Outcome``: the ``Result`` and the broker-set event for the transition table.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from .commands import CleanBrokerData, RegisterBroker, ReportOffsets, Result
from .model import (
    CLUSTER_ID_PATTERN,
    LABEL_PATTERN,
    MAX_IDENTITY_CHARS,
    BrokerSet,
    Member,
    StateData,
)
from .validation import (
    Outcome,
    Reject,
    bad,
    is_int,
    need_address,
    need_ids,
    need_name,
    need_nonneg,
)


def copy_set(bs: BrokerSet) -> BrokerSet:
    """A copy for a ``Result``: callers cannot corrupt replicated state by mutating it."""
    return copy.deepcopy(bs)


# --- RegisterBroker ---------------------------------------------------------------------------


def _check_register_args(c: RegisterBroker) -> None:
    need_name(c.broker_set, "broker set name")
    need_address(c.address, "address")
    need_address(c.ha_address, "ha_address")
    for label, what in ((c.datacenter, "datacenter"), (c.rack, "rack")):
        if not isinstance(label, str) or not LABEL_PATTERN.match(label):
            raise bad(f"{what} must match {LABEL_PATTERN.pattern}, got {label!r}")
    if (
        not isinstance(c.identity, str)
        or not 0 < len(c.identity) <= MAX_IDENTITY_CHARS
        or not c.identity.isprintable()
    ):
        raise bad(f"identity must be 1..{MAX_IDENTITY_CHARS} printable characters")
    if c.broker_id is not None:
        need_nonneg(c.broker_id, "broker_id")
    need_nonneg(c.now_ms, "now_ms")
    for value, what in ((c.cluster_id, "cluster_id"), (c.new_cluster_id, "new_cluster_id")):
        if not isinstance(value, str) or not CLUSTER_ID_PATTERN.match(value):
            raise bad(f"{what} must be 0..64 of a-z 0-9 -, got {value!r}")


def register(s: StateData, c: RegisterBroker) -> Outcome:
    _check_register_args(c)
    cluster_id = s.cluster_id or _first_cluster_id(s, c)
    if c.cluster_id and cluster_id and c.cluster_id != cluster_id:  # R7: a disk of another cluster
        raise Reject(
            "CLUSTER_MISMATCH",
            f"the data directory of this broker belongs to cluster {c.cluster_id}, "
            f"not {cluster_id or 'this one'}",
        )
    result, event = _register_member(s, c)  # raises on refusal: nothing below happens then
    if cluster_id and cluster_id != s.cluster_id:
        s.cluster_id = cluster_id  # fixed by the first registration (an invariant keeps it)
        result = replace(result, changed=True)
    return result, event


def _first_cluster_id(s: StateData, c: RegisterBroker) -> str:
    """R7, a state without a cluster id: a fresh cluster takes the leader's draw; one restored
    from an older snapshot takes the id a member proves it wrote (its id and identity token
    match), so the brokers that hold the data are never locked out; else it stays unknown."""
    if not s.broker_sets:
        return c.new_cluster_id
    bs = s.broker_sets.get(c.broker_set)
    member = bs.members.get(c.broker_id) if bs is not None and c.broker_id is not None else None
    if member is not None and member.identity == c.identity:
        return c.cluster_id
    return ""


def _register_member(s: StateData, c: RegisterBroker) -> Outcome:
    if c.broker_id is None:
        return _register_new(s, c)
    bs = s.broker_sets.get(c.broker_set)
    if bs is None:
        raise Reject(
            "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
            f"broker set {c.broker_set} is not registered; register without a broker id",
        )
    member = bs.members.get(c.broker_id)
    if member is None:
        if c.broker_id >= bs.next_broker_id or c.broker_id < 1:
            raise Reject(
                "CONTROLLER_BROKER_ID_INVALID",
                f"broker id {c.broker_id} was never assigned in {c.broker_set}",
            )
        raise Reject(
            "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
            f"broker {c.broker_id} of {c.broker_set} was cleaned; register without a broker id",
        )
    if member.identity != c.identity:
        raise Reject(
            "CONTROLLER_BROKER_ID_INVALID",
            f"broker id {c.broker_id} of {c.broker_set} belongs to another broker identity",
        )
    return _refresh_member(member, c)


def _register_new(s: StateData, c: RegisterBroker) -> Outcome:
    bs = s.broker_sets.get(c.broker_set)
    # A retried "register me as new" must not mint a second id: the identity finds it.
    if bs is not None:
        for m in bs.members.values():
            if m.identity == c.identity:
                return _refresh_member(m, c)
    if bs is None:
        bs = BrokerSet(name=c.broker_set, members={}, next_broker_id=s.next_id_floor.pop(c.broker_set, 1))
        s.broker_sets[c.broker_set] = bs
    new_id = bs.next_broker_id
    bs.next_broker_id += 1
    bs.members[new_id] = Member(
        broker_id=new_id,
        address=c.address,
        ha_address=c.ha_address,
        datacenter=c.datacenter,
        rack=c.rack,
        identity=c.identity,
        registered_ms=c.now_ms,
    )
    return Result(value=new_id, message=f"registered broker {new_id}", changed=True), "register"


def _refresh_member(m: Member, c: RegisterBroker) -> Outcome:
    fresh = (c.address, c.ha_address, c.datacenter, c.rack)
    if (m.address, m.ha_address, m.datacenter, m.rack) == fresh:
        return Result(value=m.broker_id, message=f"broker {m.broker_id} already registered"), None
    m.address, m.ha_address, m.datacenter, m.rack = fresh
    return Result(value=m.broker_id, message=f"broker {m.broker_id} updated", changed=True), "register"


# --- CleanBrokerData --------------------------------------------------------------------------

_INVALID_CLEAN = "CONTROLLER_INVALID_CLEAN_BROKER_METADATA"


def _check_clean_args(c: CleanBrokerData) -> tuple[frozenset[int], frozenset[int]]:
    """The broker ids to forget and the alive ones, once every argument checked out."""
    need_name(c.broker_set, "broker set name")
    ids = need_ids(c.broker_ids, "broker_ids")
    alive = need_ids(c.alive, "alive")
    if type(c.clean_living) is not bool:
        raise bad("clean_living must be a boolean")
    if c.expect_epochs is not None and (
        not isinstance(c.expect_epochs, tuple)
        or len(c.expect_epochs) != 2
        or not all(type(e) is int and e >= 0 for e in c.expect_epochs)
    ):
        raise bad("expect_epochs must be (master epoch, SyncStateSet epoch)")
    need_nonneg(c.now_ms, "now_ms")
    return ids, alive


def _cleanable_set(s: StateData, c: CleanBrokerData, ids: frozenset[int], alive: frozenset[int]) -> BrokerSet:
    """The set to clean, after C1, C2 and C2a allowed it."""
    bs = s.broker_sets.get(c.broker_set)
    if not c.clean_living:  # C1: never forget a live broker by accident
        targets = ids if ids else (frozenset(bs.members) if bs else frozenset())
        living = sorted(targets & alive)
        if living:
            raise Reject(
                _INVALID_CLEAN, f"broker {living[0]} of {c.broker_set} is still alive, clean up failure"
            )
    if bs is None:  # C2
        raise Reject(_INVALID_CLEAN, f"broker set {c.broker_set} does not exist, clean broker data failure")
    if c.expect_epochs is not None and (bs.master_epoch, bs.sss_epoch) != c.expect_epochs:  # C2a
        raise Reject(
            "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
            f"{c.broker_set} changed since the decommission was checked "
            f"(epochs {c.expect_epochs} -> {(bs.master_epoch, bs.sss_epoch)}); check again",
        )
    return bs


def clean(s: StateData, c: CleanBrokerData) -> Outcome:
    ids, alive = _check_clean_args(c)
    bs = _cleanable_set(s, c, ids, alive)
    if not ids or bs.members.keys() <= ids:  # C3: the whole set goes
        s.next_id_floor[bs.name] = bs.next_broker_id
        del s.broker_sets[bs.name]
        return Result(message=f"broker set {c.broker_set} removed", changed=True), "clean_set"
    removed = ids & bs.members.keys()
    if not removed:
        return Result(value=copy_set(bs), message="nothing to clean"), None
    _remove_members(bs, removed)
    return Result(
        value=copy_set(bs), changed=True, message=f"removed brokers {sorted(removed)} from {c.broker_set}"
    ), "clean_members"


def _remove_members(bs: BrokerSet, removed: frozenset[int]) -> None:
    for i in removed:
        del bs.members[i]
    if bs.master_id in removed:
        # QUIRK fixed: the reference keeps a removed master's id; a master must be a member.
        bs.master_id = None
        bs.master_epoch += 1
    if bs.sync_state_set & removed:
        bs.sync_state_set = bs.sync_state_set - removed
        bs.sss_epoch += 1  # every SyncStateSet change gets a new epoch (RULES.md C4)


# --- ReportOffsets ----------------------------------------------------------------------------


def report(s: StateData, c: ReportOffsets) -> Outcome:
    need_name(c.broker_set, "broker set name")
    need_nonneg(c.broker_id, "broker_id")
    for v, what in ((c.epoch, "epoch"), (c.max_offset, "max_offset")):
        if not is_int(v) or v < -1:
            raise bad(f"{what} must be an integer >= -1, got {v!r}")
    bs = s.broker_sets.get(c.broker_set)
    if bs is None:
        raise Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"no broker set {c.broker_set}")
    m = bs.members.get(c.broker_id)
    if m is None:
        raise Reject(
            "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
            f"broker {c.broker_id} is not registered in {c.broker_set}",
        )
    if (c.epoch, c.max_offset) <= (m.last_epoch, m.last_max_offset):
        return Result(message="offsets not newer than recorded"), None
    m.last_epoch, m.last_max_offset = c.epoch, c.max_offset
    return Result(changed=True, message="offsets recorded"), "report"
