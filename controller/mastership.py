"""Who masters a broker set: electing a master (ElectMaster, RULES.md §2) and changing its
SyncStateSet (AlterSyncStateSet, §4).

Which alive broker wins is the policy in ``election.py``; this module applies the outcome with
the epochs the invariants demand (a new master or SyncStateSet always comes with a new epoch).
"""

from __future__ import annotations

from collections.abc import Mapping

from .commands import AlterSyncStateSet, ElectMaster, Result
from .election import elect as choose_master
from .membership import copy_set
from .model import BrokerSet, LiveInfo, StateData
from .validation import Outcome, Reject, bad, is_int, need_ids, need_name, need_nonneg

# --- ElectMaster ------------------------------------------------------------------------------


def _check_elect_args(c: ElectMaster) -> None:
    need_name(c.broker_set, "broker set name")
    if c.broker_id is not None:
        need_nonneg(c.broker_id, "broker_id")
    if type(c.designated) is not bool or type(c.enable_unclean) is not bool or type(c.restarted) is not bool:
        raise bad("designated, enable_unclean and restarted must be booleans")
    if c.restarted and (c.broker_id is None or c.designated):
        raise bad("a restarted master's election names the asking broker and is not designated")
    if c.designated and c.broker_id is None:
        raise bad("a designated election needs the broker_id to elect")
    if not isinstance(c.alive, Mapping) or not all(
        is_int(k) and isinstance(v, LiveInfo) for k, v in c.alive.items()
    ):
        raise bad("alive must map broker ids to LiveInfo")
    need_nonneg(c.now_ms, "now_ms")
    need_nonneg(c.restarted_epoch, "restarted_epoch")
    if c.restarted_epoch and not c.restarted:
        raise bad("restarted_epoch belongs to a restarted master's election")


def _electing_set(s: StateData, c: ElectMaster) -> BrokerSet:
    bs = s.broker_sets.get(c.broker_set)
    if bs is None:  # E1: unknown set
        raise Reject("CONTROLLER_BROKER_METADATA_NOT_EXIST", f"no broker set {c.broker_set}")
    if c.broker_id is not None and c.broker_id not in bs.members:
        raise Reject(
            "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED",
            f"broker {c.broker_id} is not registered in {c.broker_set}",
        )
    return bs


def _candidate(bs: BrokerSet, c: ElectMaster) -> int | None:
    # Heartbeats of brokers this set no longer knows must not win an election.
    alive = {i: info for i, info in c.alive.items() if i in bs.members}
    if bs.master_epoch == 0 and c.broker_id is not None:
        # E3: the first election takes the asking/designated broker, but only if it is alive.
        return c.broker_id if c.broker_id in alive else None
    # E4: the policy (election.py).
    return choose_master(
        bs.sync_state_set,
        bs.members.keys(),
        bs.master_id,
        c.broker_id if c.designated else None,
        alive,
        c.enable_unclean,
    )


def elect(s: StateData, c: ElectMaster) -> Outcome:
    _check_elect_args(c)
    bs = _electing_set(s, c)
    if c.restarted:
        return _reelect(bs, c)
    old = bs.master_id
    new = _candidate(bs, c)
    if new is not None and new == old:
        raise Reject(
            "CONTROLLER_MASTER_STILL_EXIST",
            f"broker {old} is alive and stays master of {c.broker_set}",
            copy_set(bs),
        )
    if new is not None:
        return _install_master(bs, new)
    return _no_master(bs, c)


def _reelect(bs: BrokerSet, c: ElectMaster) -> Outcome:
    """E8: the recorded master, back from a crash, gives up its epoch: the best alive member of the
    SyncStateSet (itself included, ranked on what its heartbeat reported) leads a new epoch, so
    fork repair can tell the records its crash cost it from those written after."""
    if bs.master_id != c.broker_id:
        raise Reject(
            "CONTROLLER_INVALID_MASTER",
            f"broker {c.broker_id} is not the master of {c.broker_set} (it is {bs.master_id})",
            copy_set(bs),
        )
    if c.restarted_epoch and c.restarted_epoch != bs.master_epoch:
        # a late copy of a call the broker made before the epoch it now masters (a call given up
        # on, run later): that master is not the one that crashed, and holds a lease
        raise Reject(
            "CONTROLLER_FENCED_MASTER_EPOCH",
            f"broker {c.broker_id} gives up master epoch {c.restarted_epoch} of {c.broker_set}, "
            f"which is at epoch {bs.master_epoch}",
            copy_set(bs),
        )
    alive = {i: info for i, info in c.alive.items() if i in bs.members}
    new = choose_master(bs.sync_state_set, bs.members.keys(), None, None, alive, False)
    if new is None:  # not even itself heard yet: it heartbeats first, then asks again
        raise Reject(
            "CONTROLLER_ELECT_MASTER_FAILED",
            f"broker {c.broker_id} asked to be elected again in {c.broker_set} but no member is alive",
            copy_set(bs),
        )
    return _install_master(bs, new)


def _install_master(bs: BrokerSet, new: int) -> Outcome:
    unclean = bs.master_epoch > 0 and new not in bs.sync_state_set
    bs.master_id = new
    bs.master_epoch += 1
    if unclean:
        bs.unclean_epoch = bs.master_epoch
    bs.sync_state_set = frozenset({new})
    bs.sss_epoch += 1
    return Result(
        value=copy_set(bs),
        changed=True,
        message=f"broker {new} is master of {bs.name} at epoch {bs.master_epoch}",
    ), "elect"


def _no_master(bs: BrokerSet, c: ElectMaster) -> Outcome:
    if c.broker_id is None and bs.master_id is not None:
        # E7: record "no master" once; a retry finds no master recorded and changes nothing,
        # so one failure bumps the epoch once (QUIRK fixed, RULES.md).
        bs.master_id = None
        bs.master_epoch += 1
        return Result(
            "CONTROLLER_MASTER_NOT_AVAILABLE",
            value=copy_set(bs),
            changed=True,
            message=f"no electable broker in {c.broker_set}; master cleared at epoch {bs.master_epoch}",
        ), "elect_none"
    if c.broker_id is None:
        raise Reject(
            "CONTROLLER_MASTER_NOT_AVAILABLE", f"no electable broker in {c.broker_set}", copy_set(bs)
        )
    raise Reject(
        "CONTROLLER_ELECT_MASTER_FAILED",
        f"broker {c.broker_id} asked for an election in {c.broker_set} but no eligible broker is alive",
        copy_set(bs),
    )


# --- AlterSyncStateSet ------------------------------------------------------------------------

_ALTER_FAILED = "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED"


def _check_alter_args(c: AlterSyncStateSet) -> tuple[frozenset[int], frozenset[int]]:
    """The proposed SyncStateSet and the alive ids, once every argument checked out."""
    need_name(c.broker_set, "broker set name")
    need_nonneg(c.master_id, "master_id")
    need_nonneg(c.master_epoch, "master_epoch")
    need_nonneg(c.sss_epoch, "sss_epoch")
    new_set = need_ids(c.new_sync_state_set, "new_sync_state_set")
    alive = need_ids(c.alive, "alive")
    need_nonneg(c.now_ms, "now_ms")
    need_nonneg(c.attempt, "attempt")
    return new_set, alive


def _check_fencing(bs: BrokerSet, c: AlterSyncStateSet, new_set: frozenset[int], snap: BrokerSet) -> None:
    """A2-A5: a real change, asked by the current master in the current epochs."""
    if new_set == bs.sync_state_set:  # A2, before the master check as in the reference
        raise Reject(_ALTER_FAILED, "the proposed SyncStateSet equals the current one", snap)
    if bs.master_id is None or bs.master_id != c.master_id:  # A3
        raise Reject(
            "CONTROLLER_INVALID_MASTER",
            f"broker {c.master_id} is not the master of {c.broker_set} (master: {bs.master_id})",
            snap,
        )
    if c.master_epoch != bs.master_epoch:  # A4
        raise Reject(
            "CONTROLLER_FENCED_MASTER_EPOCH",
            f"master epoch {c.master_epoch} is not the current {bs.master_epoch}",
            snap,
        )
    if c.attempt and (c.master_epoch, c.attempt) <= bs.alter_attempt:  # A4b
        raise Reject(
            "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
            f"attempt {c.attempt} of master epoch {c.master_epoch} is not newer than attempt "
            f"{bs.alter_attempt[1]}, already answered",
            snap,
        )
    if c.sss_epoch != bs.sss_epoch:  # A5
        raise Reject(
            "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH",
            f"SyncStateSet epoch {c.sss_epoch} is not the current {bs.sss_epoch}",
            snap,
        )


def _check_members(bs: BrokerSet, new_set: frozenset[int], alive: frozenset[int], snap: BrokerSet) -> None:
    """A6 and A7: only registered, alive brokers, and the master among them."""
    for i in sorted(new_set):  # A6, ascending so every replica reports the same broker
        if i not in bs.members:
            raise Reject("CONTROLLER_INVALID_REPLICAS", f"broker {i} is not registered in {bs.name}", snap)
        if i not in alive:
            raise Reject("CONTROLLER_BROKER_NOT_ALIVE", f"broker {i} of {bs.name} is not alive", snap)
    if bs.master_id not in new_set:  # A7
        raise Reject(_ALTER_FAILED, f"the proposed SyncStateSet leaves out the master {bs.master_id}", snap)


def alter(s: StateData, c: AlterSyncStateSet) -> Outcome:
    new_set, alive = _check_alter_args(c)
    bs = s.broker_sets.get(c.broker_set)
    if bs is None:  # A1
        raise Reject(_ALTER_FAILED, f"no broker set {c.broker_set}")
    snap = copy_set(bs)
    try:
        _check_fencing(bs, c, new_set, snap)
        _check_members(bs, new_set, alive, snap)
    finally:
        # A4b: whatever the answer, an attempt of the current master is answered; no earlier
        # attempt of it may apply after this one (a late copy of a call it gave up on)
        if c.attempt and c.master_id == bs.master_id and c.master_epoch == bs.master_epoch:
            bs.alter_attempt = max(bs.alter_attempt, (c.master_epoch, c.attempt))
    bs.sync_state_set = new_set  # A8
    bs.sss_epoch += 1
    message = f"SyncStateSet of {c.broker_set} is {sorted(new_set)} at epoch {bs.sss_epoch}"
    return Result(value=copy_set(bs), changed=True, message=message), "alter"
