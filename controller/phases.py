"""The invariants of the controller state: the broker-set lifecycle table and the checks run after
every command (and on a restored snapshot).

Broker-set lifecycle (``TRANSITIONS``): a set is ABSENT, LEADERLESS (registered, no master)
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
A violation raises ``InvariantViolation``: the replica must stop rather than keep diverging state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from tidelog.invariants import require

from .model import BrokerSet, StateData


class Phase(Enum):
    ABSENT = "absent"
    LEADERLESS = "leaderless"
    MASTERED = "mastered"


_A, _L, _M = Phase.ABSENT, Phase.LEADERLESS, Phase.MASTERED
TRANSITIONS: dict[str, dict[Phase, frozenset[Phase]]] = {
    "register": {_A: frozenset({_L}), _L: frozenset({_L}), _M: frozenset({_M})},
    "elect": {_L: frozenset({_M}), _M: frozenset({_M})},
    "elect_none": {_M: frozenset({_L})},
    "alter": {_M: frozenset({_M})},
    "clean_members": {_L: frozenset({_L, _A}), _M: frozenset({_M, _L, _A})},
    "clean_set": {_L: frozenset({_A}), _M: frozenset({_A})},
    "report": {_L: frozenset({_L}), _M: frozenset({_M})},
}


def phase(bs: BrokerSet | None) -> Phase:
    if bs is None:
        return Phase.ABSENT
    return Phase.LEADERLESS if bs.master_id is None else Phase.MASTERED


@dataclass(frozen=True)
class SetBefore:
    """A broker set's phase, epochs, id counter, master and SyncStateSet before a command."""

    phase: Phase
    master_epoch: int = 0
    sss_epoch: int = 0
    next_broker_id: int = 1
    master_id: int | None = None
    sync_state_set: frozenset[int] = frozenset()
    existed: bool = False

    @classmethod
    def of(cls, bs: BrokerSet | None) -> SetBefore:
        if bs is None:
            return cls(Phase.ABSENT)
        return cls(
            phase(bs),
            bs.master_epoch,
            bs.sss_epoch,
            bs.next_broker_id,
            bs.master_id,
            bs.sync_state_set,
            existed=True,
        )


def check_set_after(name: str, bs: BrokerSet | None, before: SetBefore, event: str | None) -> None:
    """The set moved along the transition table and its epochs and counters never went back."""
    after = phase(bs)
    if event is None:
        require(after == before.phase, f"{name}: phase moved {before.phase} -> {after} without an event")
    else:
        allowed = TRANSITIONS[event].get(before.phase, frozenset())
        require(after in allowed, f"{name}: {event} may not move {before.phase} -> {after}")
    if bs is None:
        return
    check_broker_set(bs)
    if before.existed:
        _check_no_step_back(name, bs, before)


def _check_no_step_back(name: str, bs: BrokerSet, b: SetBefore) -> None:
    me, se = b.master_epoch, b.sss_epoch
    require(bs.master_epoch >= me, f"{name}: master epoch went back {me} -> {bs.master_epoch}")
    require(bs.sss_epoch >= se, f"{name}: SyncStateSet epoch went back {se} -> {bs.sss_epoch}")
    require(
        bs.next_broker_id >= b.next_broker_id,
        f"{name}: next broker id went back {b.next_broker_id} -> {bs.next_broker_id}",
    )
    # One master per epoch: whoever is master now was master for the whole epoch.
    require(
        bs.master_id == b.master_id or bs.master_epoch > me,
        f"{name}: master changed {b.master_id} -> {bs.master_id} within epoch {me}",
    )
    require(
        bs.sync_state_set == b.sync_state_set or bs.sss_epoch > se,
        f"{name}: SyncStateSet changed within its epoch {se}",
    )


def check_broker_set(bs: BrokerSet) -> None:
    n = bs.name
    require(bool(bs.members), f"{n}: a registered broker set has members")
    require(
        all(i == m.broker_id and 1 <= i < bs.next_broker_id for i, m in bs.members.items()),
        f"{n}: member ids must be assigned ids below next_broker_id {bs.next_broker_id}",
    )
    require(bs.master_epoch >= 0 and bs.sss_epoch >= 0, f"{n}: negative epoch")
    require(
        bs.sync_state_set <= bs.members.keys(),
        f"{n}: SyncStateSet {sorted(bs.sync_state_set)} names non-members",
    )
    if bs.master_id is not None:
        require(bs.master_id in bs.members, f"{n}: master {bs.master_id} is not a member")
        require(bs.master_id in bs.sync_state_set, f"{n}: master {bs.master_id} is not in its SyncStateSet")
    if bs.master_epoch == 0:
        require(
            bs.master_id is None and not bs.sync_state_set and bs.sss_epoch == 0,
            f"{n}: before the first election there is no master and no SyncStateSet",
        )


def check_state(s: StateData) -> None:
    """Every invariant of the whole state (used after restoring a snapshot)."""
    for name, bs in s.broker_sets.items():
        require(bs.name == name, f"broker set stored under {name} is named {bs.name}")
        check_broker_set(bs)
        require(
            s.next_id_floor.get(name, 1) <= bs.next_broker_id,
            f"{name}: next broker id below its retired floor",
        )
    for name, t in s.topics.items():
        require(t.name == name and bool(t.queues), f"topic {name} is malformed")
        require(
            0 <= t.generation < s.next_topic_generation,
            f"topic {name}: generation {t.generation} not below the counter {s.next_topic_generation}",
        )
    for name, t in s.deleted_topics.items():
        require(t.name == name and name not in s.topics, f"tombstone {name} is malformed or alive")
    for key, e in s.metadata.items():
        require(e.key == key and e.version >= 1, f"metadata {key} is malformed")
