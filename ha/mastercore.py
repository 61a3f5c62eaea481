"""The master's replication decisions, as a pure state machine: `MasterCore.step(event, now_ms) -> actions`.

Theory of operation
-------------------
`ha.master.HaMaster` owns the sockets, the commit log and the waiting producers; everything it
decides goes through here. It feeds events — the owner appended records, a slave connected at
an offset, bytes went out to a slave, a slave acked, a slave left, the controller confirmed a
SyncStateSet, a proposed change failed, a producer waits for `needed` acks, the periodic shrink
check — and carries out the actions that come back:

- `SetConfirm(offset)`: the new confirm offset (what every SyncStateSet member holds, see
  `ha.ackpolicy.confirm_offset`); the shell stores it in the log and wakes readers and senders;
- `Release(needed, offset)`: producers waiting for `needed` acks up to `offset` may be answered;
- `Propose(proposal)`: send this SyncStateSet change to the controller (`ha.syncstate`);
- `Reject(slave, reason)`: the slave broke the protocol (an ack beyond what was sent to it); close
  its connection, counting nothing of it.

Time is passed in (`now_ms`); nothing here awaits, reads a file or touches a socket, so the
tests drive it with any sequence of events (docs/ARCHITECTURE.md §4.7) and check the invariants
after every step: the confirm offset only grows and never passes the master's end, the master is
in its SyncStateSet, no slave is counted beyond what it was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.ha import ackpolicy
from tidelog.ha.syncstate import Proposal, SyncStateTracker
from tidelog.invariants import require

__all__ = [
    "Acked",
    "Action",
    "AlterFailed",
    "Appended",
    "ControllerState",
    "Event",
    "Flushed",
    "MasterCore",
    "Propose",
    "Reject",
    "Release",
    "Sent",
    "SetConfirm",
    "ShrinkCheck",
    "SlaveJoined",
    "SlaveLeft",
    "SlaveView",
    "Waiting",
]


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Appended:
    """The owner appended records; the log now ends at `master_max`."""

    master_max: int


@dataclass(frozen=True)
class SlaveJoined:
    """A slave proved itself and asked to be streamed from `start` (its log's end)."""

    slave: int
    start: int


@dataclass(frozen=True)
class Sent:
    """Bytes up to `end` went out to `slave` (a heartbeat: `end` is unchanged)."""

    slave: int
    end: int


@dataclass(frozen=True)
class Acked:
    slave: int
    offset: int


@dataclass(frozen=True)
class SlaveLeft:
    slave: int


@dataclass(frozen=True)
class ControllerState:
    sync_state_set: frozenset[int]
    sss_epoch: int


@dataclass(frozen=True)
class AlterFailed:
    """A proposed change did not happen: the controller refused it, or no answer came in time
    (it may still be applied). It is given up only while it is still the pending proposal at the
    set epoch it started from: a late answer about an overtaken proposal must not clear a newer
    one still in flight (the effective set would shrink and the confirm offset pass what a
    member joining may lack)."""

    proposal: Proposal
    sss_epoch_before: int


@dataclass(frozen=True)
class Flushed:
    """The master's own log is on disk up to `offset` (flush: sync): under `durable_only` the
    master counts toward the confirm offset only what it has flushed."""

    offset: int


@dataclass(frozen=True)
class Waiting:
    """A producer waits for `needed` acks: from now on releases for `needed` are computed."""

    needed: int


@dataclass(frozen=True)
class ShrinkCheck:
    """The periodic check for members to drop (stale or disconnected)."""


Event = (
    Appended
    | SlaveJoined
    | Sent
    | Acked
    | SlaveLeft
    | ControllerState
    | AlterFailed
    | Waiting
    | ShrinkCheck
    | Flushed
)


# ---------------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class SetConfirm:
    offset: int


@dataclass(frozen=True)
class Release:
    needed: int
    offset: int


@dataclass(frozen=True)
class Propose:
    proposal: Proposal


@dataclass(frozen=True)
class Reject:
    slave: int
    reason: str


Action = SetConfirm | Release | Propose | Reject


@dataclass
class SlaveView:
    """What the master knows of one connected slave."""

    ack_offset: int = -1
    sent_end: int = 0  # end of the bytes written to this slave's connection: no ack may pass it
    last_sent_master_max: int = 0  # the master's end when it last sent to this slave
    last_sent_ms: int = 0


@dataclass
class MasterCore:
    """Replication state of one broker while it is master of `epoch`."""

    broker_id: int
    epoch: int
    tracker: SyncStateTracker
    master_max: int
    confirm: int
    epoch_start: int  # where this epoch's records begin: a slave must hold them to join the set
    slaves: dict[int, SlaveView] = field(default_factory=dict)
    needs: set[int] = field(default_factory=set)
    # flush: sync: what the master holds toward the confirm offset is what it has flushed, not its
    # log's end; a master alone in its set otherwise confirms, and readers see, records a crash
    # takes back (the simulator's seed 1, tests/sim/test_found.py). None: its end counts (flush:
    # async promises no more than the page cache).
    durable: int | None = None

    @classmethod
    def start(
        cls,
        *,
        broker_id: int,
        epoch: int,
        sync_state_set: frozenset[int],
        sss_epoch: int,
        master_max: int,
        confirm: int,
        epoch_start: int,
        max_not_catchup_ms: int,
        now_ms: int,
        durable: int | None = None,
    ) -> MasterCore:
        # A master is always in its SyncStateSet (the controller makes it so at election); one handed
        # a set without it has a role from somewhere else and must not stream.
        require(
            broker_id in sync_state_set,
            f"master {broker_id} of epoch {epoch} is not in its SyncStateSet {sorted(sync_state_set)}",
        )
        tracker = SyncStateTracker(
            broker_id,
            frozenset(sync_state_set),
            sss_epoch,
            max_not_catchup_ms=max_not_catchup_ms,
            now_ms=now_ms,
        )
        core = cls(broker_id, epoch, tracker, master_max, confirm, epoch_start, durable=durable)
        core.check()
        return core

    # ------------------------------------------------------------------ reads

    def acks(self) -> dict[int, int]:
        return {sid: s.ack_offset for sid, s in self.slaves.items() if s.ack_offset >= 0}

    def acked_by(self, needed: int) -> int:
        """The highest offset a write needing `needed` acks may be released at (master counted).

        Two ways: `needed` members of the controller-confirmed set hold it (a member of a pending
        expansion does not vote there: if the controller never applies the expansion, its ack
        protected nothing), or every member of the effective set holds it (`held_by_all`), which
        covers whichever set the controller ends up with, so a write sized for a pending expansion
        is released as soon as the joining member holds it, without waiting for the controller.

        While an expansion is pending, the first way also needs every joining member: it is
        electable as soon as the controller applies the change, so a write released meanwhile must
        be one it holds. A write sized for the confirmed set before the expansion was proposed,
        and released after, was acknowledged without the joining member and lost with it when it
        was elected (the simulator's seed 7426)."""
        acks = self.acks()
        held: int = ackpolicy.acked_by(needed, self.broker_id, self.master_max, acks, self.tracker.local)
        joining = self.tracker.effective - self.tracker.local - {self.broker_id}
        if joining:
            held = min([held, *(acks.get(j, 0) for j in joining)])
        return max(held, self.held_by_all()) if needed <= len(self.tracker.effective) else held

    def held_by_all(self) -> int:
        """The highest offset every member of every SyncStateSet the controller might know holds:
        the confirmed set united with a pending proposal (an expansion counts from the moment it is
        proposed, a shrink only once confirmed). What `ha.lease` lets a master acknowledge without
        a lease (docs/ARCHITECTURE.md §3.5). A member not connected now counts as holding nothing
        new: its last ack may predate a restart that lost it."""
        held: int = ackpolicy.held_by_all(
            self.broker_id, self.master_max, self.acks(), set(self.slaves), self.tracker.effective
        )
        return held

    # ------------------------------------------------------------------ the one entry

    def step(self, event: Event, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        confirm_before = self.confirm
        proposal = self._apply(event, now_ms, actions)
        if proposal is not None:
            actions.append(Propose(proposal))
        # Bytes going out change no count (the hot path: once per transfer and heartbeat); a
        # rejected ack is counted nowhere.
        if not isinstance(event, Sent) and not any(isinstance(a, Reject) for a in actions):
            self._settle(actions)
        if self.confirm < confirm_before:  # messages are built only on a violation: this is the hot path
            require(
                False, f"master {self.broker_id}: confirm went back from {confirm_before} to {self.confirm}"
            )
        self.check()
        return actions

    def _apply(self, event: Event, now_ms: int, actions: list[Action]) -> Proposal | None:
        """Fold `event` into the state; returns the SyncStateSet change it calls for, if any."""
        match event:
            case Appended(master_max):
                require(
                    master_max >= self.master_max,
                    f"master {self.broker_id}: the log went back from {self.master_max} to {master_max}",
                )
                self.master_max = master_max
            case SlaveJoined(slave, start):
                self.slaves[slave] = SlaveView(sent_end=start)
                return self._ack(slave, start, now_ms, actions)
            case Sent(slave, end):
                self._sent(slave, end, now_ms)
            case Acked(slave, offset):
                return self._ack(slave, offset, now_ms, actions)
            case Waiting(needed):
                self.needs.add(needed)
            case Flushed(offset):
                self.durable = max(self.durable or 0, offset)
            case _:
                return self._membership(event, now_ms)
        return None

    def _membership(self, event: Event, now_ms: int) -> Proposal | None:
        """The events that change who is (or may become) in the SyncStateSet."""
        match event:
            case SlaveLeft(slave):
                if self.slaves.pop(slave, None) is not None:
                    return self.tracker.on_disconnect(slave, now_ms=now_ms)
            case ControllerState(sss, sss_epoch):
                self.tracker.on_controller_state(frozenset(sss), sss_epoch, now_ms=now_ms)
            case AlterFailed(proposal, before):
                if self.tracker.sss_epoch == before and self.tracker.pending == proposal:
                    self.tracker.on_alter_failed()
            case ShrinkCheck():
                return self.tracker.check_shrink(now_ms=now_ms)
        return None

    def _sent(self, slave: int, end: int, now_ms: int) -> None:
        view = self.slaves.get(slave)
        if view is not None:
            view.sent_end = max(view.sent_end, end)
            view.last_sent_master_max, view.last_sent_ms = self.master_max, now_ms

    def _ack(self, slave: int, offset: int, now_ms: int, actions: list[Action]) -> Proposal | None:
        view = self.slaves.get(slave)
        if view is None:
            return None  # an ack racing the connection's end
        if offset > view.sent_end:
            # Only what this connection carried can be held because of it: a higher ack is a
            # confused or hostile peer, and counting it could acknowledge writes no replica holds.
            actions.append(
                Reject(
                    slave,
                    f"slave {slave} acked {offset}, beyond the {view.sent_end} sent to it "
                    f"(this log's max {self.master_max})",
                )
            )
            return None
        view.ack_offset = max(view.ack_offset, offset)
        return self.tracker.on_ack(
            slave,
            view.ack_offset,
            now_ms=now_ms,
            master_max=self.master_max,
            last_sent_master_max=view.last_sent_master_max,
            last_sent_ms=view.last_sent_ms,
            confirm_offset=self.confirm,
            epoch_start=self.epoch_start,
        )

    def _settle(self, actions: list[Action]) -> None:
        """Move the confirm offset and release producers whose acks are in."""
        acks = self.acks()
        held = self.master_max if self.durable is None else min(self.master_max, self.durable)
        new = ackpolicy.confirm_offset(
            self.broker_id, held, acks, set(self.slaves), self.tracker.effective, self.confirm
        )
        if new != self.confirm:
            self.confirm = new
            actions.append(SetConfirm(new))
        actions.extend(Release(needed, self.acked_by(needed)) for needed in sorted(self.needs))

    def check(self) -> None:
        """The invariants of a master's replication state; a violation stops the process."""
        if (
            self.confirm <= self.master_max
            and self.broker_id in self.tracker.local
            and all(view.ack_offset <= view.sent_end for view in self.slaves.values())
        ):
            return  # every step passes here: the messages below are built only when one fails
        ctx = f"master {self.broker_id} of epoch {self.epoch}"
        require(
            self.confirm <= self.master_max, f"{ctx}: confirm {self.confirm} passes max {self.master_max}"
        )
        require(
            self.broker_id in self.tracker.local, f"{ctx} left its SyncStateSet {sorted(self.tracker.local)}"
        )
        for sid, view in self.slaves.items():
            require(
                view.ack_offset <= view.sent_end,
                f"{ctx}: slave {sid} counted at {view.ack_offset}, beyond the {view.sent_end} sent to it",
            )
