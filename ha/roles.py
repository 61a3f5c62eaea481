"""A replica's role transitions, as a table and a pure state machine: `RoleCore.step(event, now_ms) -> actions`.

Theory of operation
-------------------
The controller is the only authority on roles. Every answer that carries a role assignment
(registration, heartbeat, election, SyncStateSet change) becomes an `Assigned` event. The event
is classified (`classify`) into one of a few kinds, and `TRANSITIONS` maps (current role, kind)
to the actions to carry out and the next role — the table of docs/ARCHITECTURE.md §4.6:

- an assignment from an older master epoch than one already acted on is stale: nothing;
- no master, in a newer epoch: a master stops taking writes (next: none); a slave keeps its
  stream until a master is named;
- this broker, master of the epoch it already leads: only the SyncStateSet may have changed;
- this broker, master of an epoch older than its epoch file's last: refuse the promotion;
- this broker, master of an epoch it does not lead yet, on the word of a controller leader that
  cannot vouch for its state (cut off from its majority, or electing in this set: the reply renews
  no lease): nothing, until a leader that can vouch says so (a stale leader's old role must not
  make a broker master of an epoch the cluster has moved past; the simulator's seed 6343);
- this broker, master of a newer epoch (or after a restart): stop following, stop leading,
  start the epoch (`Promote`: append `epoch -> max offset` to the epoch file when it is new and
  confirm everything held), lead;
- another broker, the one already followed at the same epoch and address: nothing;
- another broker otherwise: stop leading, stop following, follow it (fork repair happens there).

`broker.replica.Replica` carries the actions out (under its role lock, in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "MASTER",
    "NONE",
    "SLAVE",
    "TRANSITIONS",
    "Action",
    "Assigned",
    "Follow",
    "Kind",
    "Promote",
    "RefusePromotion",
    "Role",
    "RoleCore",
    "StopMaster",
    "StopSlave",
    "UpdateSyncStateSet",
    "classify",
]

MASTER, SLAVE, NONE = "master", "slave", "none"


@dataclass(frozen=True)
class Role:
    """The controller's role assignment, decoupled from the wire type."""

    has_master: bool
    master_id: int
    master_address: str
    master_ha_address: str
    master_epoch: int
    sync_state_set: frozenset[int]
    sss_epoch: int
    unclean_epoch: int = 0  # the last master epoch elected from outside the SyncStateSet (0: none)

    @classmethod
    def from_pb(cls, pb: Any) -> Role:
        return cls(
            pb.has_master,
            pb.master_id,
            pb.master_address,
            pb.master_ha_address,
            pb.master_epoch,
            frozenset(pb.sync_state_set),
            pb.sync_state_set_epoch,
            pb.last_unclean_epoch,
        )


@dataclass(frozen=True)
class Assigned:
    """The controller assigned `role` to broker `broker_id`; `last_epoch` is the last epoch in its
    epoch file. `vouched`: the answering leader heard its majority recently and is electing nothing
    in this set (a heartbeat reply that renews a lease); every answer after a Raft commit is."""

    role: Role
    last_epoch: int
    broker_id: int
    vouched: bool = True


class Kind(Enum):
    STALE = "stale"  # older than an assignment already acted on
    NO_MASTER_NEWER = "no master, newer epoch"
    NO_MASTER_SAME = "no master, same epoch"
    SELF_SAME_TERM = "this broker, the epoch it leads"
    SELF_BEHIND_FILE = "this broker, an epoch older than its epoch file"
    SELF_UNVOUCHED = "this broker, an epoch it does not lead, from a leader that cannot vouch"
    SELF_NEW_TERM = "this broker, a new epoch"
    SAME_MASTER = "the master already followed"
    OTHER_MASTER = "another master"


# ---------------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class StopMaster:
    pass


@dataclass(frozen=True)
class StopSlave:
    pass


@dataclass(frozen=True)
class Promote:
    """Lead `role.master_epoch`; `new_epoch`: append it to the epoch file and confirm what is held."""

    role: Role
    new_epoch: bool


@dataclass(frozen=True)
class RefusePromotion:
    epoch: int
    last_epoch: int


@dataclass(frozen=True)
class UpdateSyncStateSet:
    sync_state_set: frozenset[int]
    sss_epoch: int


@dataclass(frozen=True)
class Follow:
    role: Role


Action = StopMaster | StopSlave | Promote | RefusePromotion | UpdateSyncStateSet | Follow

_SAME = "same"  # the next role is the current one
_ANY = "any"

#: (current role or "any", kind) -> (actions by name, next role or "same"). Looked up with the
#: current role first, then "any". The names are turned into actions by `RoleCore._make`.
TRANSITIONS: dict[tuple[str, Kind], tuple[tuple[str, ...], str]] = {
    (_ANY, Kind.STALE): ((), _SAME),
    (MASTER, Kind.NO_MASTER_NEWER): (("stop_master",), NONE),
    (SLAVE, Kind.NO_MASTER_NEWER): ((), SLAVE),  # keep the stream until a master is named
    (NONE, Kind.NO_MASTER_NEWER): ((), NONE),
    (_ANY, Kind.NO_MASTER_SAME): ((), _SAME),
    (MASTER, Kind.SELF_SAME_TERM): (("update_sss",), MASTER),
    (_ANY, Kind.SELF_BEHIND_FILE): (("refuse_promotion",), _SAME),
    (_ANY, Kind.SELF_UNVOUCHED): ((), _SAME),
    (_ANY, Kind.SELF_NEW_TERM): (("stop_slave", "stop_master", "promote"), MASTER),
    (SLAVE, Kind.SAME_MASTER): ((), SLAVE),
    (_ANY, Kind.OTHER_MASTER): (("stop_master", "stop_slave", "follow"), SLAVE),
}


@dataclass(frozen=True)
class Following:
    master_id: int
    master_epoch: int
    ha_address: str


def classify(
    *, role: str, known_epoch: int, leading: int | None, following: Following | None, event: Assigned
) -> Kind:
    """Which kind of assignment `event` is for a replica in this state (a pure function)."""
    a = event.role
    if a.master_epoch < known_epoch:
        return Kind.STALE
    if not a.has_master:
        return Kind.NO_MASTER_NEWER if a.master_epoch > known_epoch else Kind.NO_MASTER_SAME
    if a.master_id == event.broker_id:
        if role == MASTER and leading == a.master_epoch:
            return Kind.SELF_SAME_TERM
        if not event.vouched:
            return Kind.SELF_UNVOUCHED
        return Kind.SELF_BEHIND_FILE if a.master_epoch < event.last_epoch else Kind.SELF_NEW_TERM
    if role == SLAVE and following == Following(a.master_id, a.master_epoch, a.master_ha_address):
        return Kind.SAME_MASTER
    return Kind.OTHER_MASTER


@dataclass
class RoleCore:
    """What a replica knows of its role; `step` decides each transition from `TRANSITIONS`."""

    role: str = NONE
    master_epoch: int = 0
    master_id: int = -1
    master_address: str = ""
    last_sss_epoch: int = 0
    leading: int | None = None  # the epoch this replica leads, when master
    following: Following | None = None  # the master this replica streams from, when slave

    def step(self, event: Assigned, now_ms: int) -> list[Action]:
        del now_ms  # role changes follow the controller's word, not the clock
        kind = classify(
            role=self.role,
            known_epoch=self.master_epoch,
            leading=self.leading,
            following=self.following,
            event=event,
        )
        names, nxt = TRANSITIONS.get((self.role, kind)) or TRANSITIONS[(_ANY, kind)]
        actions = [self._make(name, event) for name in names]
        if nxt != _SAME:
            self.role = nxt
        self._record(kind, event.role)
        return actions

    def closed(self) -> None:
        """The replica stopped serving: it leads and follows nothing until the next assignment."""
        self.role, self.leading, self.following = NONE, None, None

    def _make(self, name: str, event: Assigned) -> Action:
        a = event.role
        if name == "stop_master":
            self.leading = None
            return StopMaster()
        if name == "stop_slave":
            self.following = None
            return StopSlave()
        if name == "promote":
            self.leading = a.master_epoch
            return Promote(a, new_epoch=a.master_epoch > event.last_epoch)
        if name == "follow":
            self.following = Following(a.master_id, a.master_epoch, a.master_ha_address)
            return Follow(a)
        if name == "update_sss":
            return UpdateSyncStateSet(a.sync_state_set, a.sss_epoch)
        return RefusePromotion(a.master_epoch, event.last_epoch)

    def _record(self, kind: Kind, a: Role) -> None:
        if kind in (Kind.STALE, Kind.SELF_UNVOUCHED):
            return
        self.master_epoch = a.master_epoch
        if not a.has_master:
            self.master_id, self.master_address = -1, ""
            return
        self.master_id, self.master_address = a.master_id, a.master_address
        self.last_sss_epoch = a.sss_epoch
