"""SyncStateSet upkeep on the master (docs/reference/rocketmq-controller-ha.md §3.5), as a pure state machine.

Theory of operation
-------------------
The controller owns the SyncStateSet; the master only *proposes* changes (AlterSyncStateSet,
carrying the set's epoch, which the controller checks) and applies what the controller confirms.
The tracker therefore holds two sets:

- `local`: the last set the controller confirmed, with its epoch;
- `pending`: at most one proposal in flight.

and the state moves only on these events (time is always an argument, never read here):

================================  =====================================================================
event                             transition
================================  =====================================================================
`on_ack`                          record when the slave was last caught up; if it is outside `local`,
                                  caught up, at or past the confirm offset and the current epoch's start,
                                  and nothing is pending: propose ``local | {slave}``
`on_disconnect`                   a member of `local` went away: propose ``local - {slave}`` (if
                                  something is pending, remember it and let `check_shrink` propose)
`check_shrink` (periodic)         members not caught up for more than `max_not_catchup_ms`, or
                                  disconnected, are dropped: propose ``local - dropped``
`on_controller_state`             a set with a *higher* epoch replaces `local` and ends `pending`
`on_alter_failed`                 the controller refused the proposal: `pending` ends, `local` stays
================================  =====================================================================

While a proposal is pending, `effective = local | proposed` is what acks and the confirm offset
use. Both directions are conservative: an expansion may already be applied at the controller
(so the new member may be elected and must hold what we confirm), and a shrink is not applied
yet (so the leaving member still may be elected). Only one proposal is in flight because each
carries the epoch of `local`; a second one on the same epoch would be fenced anyway, and
replacing the first would drop it from `effective` while the controller might still apply it.

A controller state with the same epoch never ends `pending`: it cannot tell whether an in-flight
proposal will still be applied. Call `on_alter_failed` only when the controller has definitely
refused (a timeout is not a refusal; wait for a newer state, or retry the same proposal).

Invariant, checked with assertions after every transition: the master is in `local`, in
`effective` and in every proposal; the master is never removed.

Deliberate differences from RocketMQ: a member never seen caught up is measured from when the
tracker was created (or from when it joined `local`) instead of being dropped at the first check
— after a master restart its slaves need a moment to reconnect; and a disconnect while a
proposal is pending is remembered rather than overwriting that proposal.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.invariants import require

__all__ = ["Proposal", "SyncStateTracker"]


@dataclass(frozen=True)
class Proposal:
    """What the master sends in AlterSyncStateSet."""

    new_sync_state_set: frozenset[int]
    sss_epoch: int  # the epoch of the set this change starts from; the controller checks it


class SyncStateTracker:
    def __init__(
        self,
        master_id: int,
        sync_state_set: frozenset[int],
        sss_epoch: int,
        *,
        max_not_catchup_ms: int = 15000,
        now_ms: int,
    ) -> None:
        if master_id not in sync_state_set:
            raise ValueError(f"the master {master_id} must be in its SyncStateSet {sorted(sync_state_set)}")
        if max_not_catchup_ms < 0:
            raise ValueError(f"max_not_catchup_ms must not be negative, got {max_not_catchup_ms}")
        self.master_id = master_id
        self.max_not_catchup_ms = max_not_catchup_ms
        self._local = frozenset(sync_state_set)
        self._epoch = sss_epoch
        self._pending: Proposal | None = None
        # slave -> last time it was caught up; only grows (docs/reference/rocketmq-controller-ha.md §3.5 connectionCaughtUpTimeTable)
        self._caught_up: dict[int, int] = {}
        # member -> when it joined `local` as far as we know; the grace start for a member never
        # seen caught up
        self._since: dict[int, int] = dict.fromkeys(self._local, now_ms)
        self._disconnected: set[int] = set()
        self._now = now_ms  # the latest time seen, for events that carry none
        self._check()

    # --- reads --------------------------------------------------------------------------

    @property
    def local(self) -> frozenset[int]:
        """The last controller-confirmed set."""
        return self._local

    @property
    def sss_epoch(self) -> int:
        return self._epoch

    @property
    def effective(self) -> frozenset[int]:
        """`local`, united with the proposed set while a change is pending (for acks and confirm)."""
        if self._pending is None:
            return self._local
        return self._local | self._pending.new_sync_state_set

    @property
    def pending(self) -> Proposal | None:
        return self._pending

    def caught_up_ms(self, slave_id: int) -> int | None:
        """When `slave_id` was last caught up, or None if never."""
        return self._caught_up.get(slave_id)

    # --- events -------------------------------------------------------------------------

    def on_controller_state(
        self, sync_state_set: frozenset[int], sss_epoch: int, *, now_ms: int | None = None
    ) -> bool:
        """Apply a controller-confirmed set; True if it was applied.

        Applied only when its epoch is higher than `local`'s; then `pending` ends (the proposal
        was applied, or was fenced by whatever was). The same epoch with the same set is already
        known and changes nothing (pending stays: see the module docstring). A lower epoch is
        stale and ignored, and so is a set without this master: the broker has been demoted,
        which its role handling acts on, not this tracker. Same epoch with another set cannot come
        from a correct controller and is ignored as well.
        """
        if now_ms is not None:
            self._tick(now_ms)
        sync_state_set = frozenset(sync_state_set)
        if sss_epoch <= self._epoch or self.master_id not in sync_state_set:
            return False
        for member in sync_state_set - self._local:
            self._since[member] = self._now
        for member in self._local - sync_state_set:
            self._since.pop(member, None)
        self._local = sync_state_set
        self._epoch = sss_epoch
        self._pending = None
        self._check()
        return True

    def on_ack(
        self,
        slave_id: int,
        slave_max: int,
        *,
        now_ms: int,
        master_max: int,
        last_sent_master_max: int,
        last_sent_ms: int,
        confirm_offset: int,
        epoch_start: int,
    ) -> Proposal | None:
        """A slave acked `slave_max`; returns an expansion to propose, if any.

        `last_sent_master_max`/`last_sent_ms` are the master's max offset and the time when the
        master last sent to this slave; `epoch_start` is where the master's current epoch begins.
        A slave that has everything that was sent is caught up: as of now if it also has the
        master's current end, else as of that send.
        """
        self._tick(now_ms)
        if slave_id == self.master_id:
            return None
        self._disconnected.discard(slave_id)
        if slave_max < last_sent_master_max:
            return None
        caught = now_ms if slave_max >= master_max else last_sent_ms
        self._caught_up[slave_id] = max(self._caught_up.get(slave_id, caught), caught)
        if (
            slave_id in self._local
            or self._pending is not None
            or slave_max < confirm_offset
            or slave_max < epoch_start
        ):
            return None
        return self._propose(self._local | {slave_id})

    def on_disconnect(self, slave_id: int, *, now_ms: int) -> Proposal | None:
        """The connection to `slave_id` closed; returns the removal to propose, if any."""
        self._tick(now_ms)
        if slave_id == self.master_id:
            return None
        self._disconnected.add(slave_id)
        if slave_id not in self._local or self._pending is not None:
            return None
        return self._propose(self._local - {slave_id})

    def check_shrink(self, *, now_ms: int) -> Proposal | None:
        """Periodic check: the removal of stale or disconnected members to propose, if any."""
        self._tick(now_ms)
        if self._pending is not None:
            return None
        dropped = {
            m
            for m in self._local
            if m != self.master_id and (m in self._disconnected or self._stale(m, now_ms))
        }
        if not dropped:
            return None
        return self._propose(self._local - dropped)

    def on_alter_failed(self) -> None:
        """The controller refused the pending proposal; a later event or check proposes again."""
        self._pending = None
        self._check()

    # --- internals ----------------------------------------------------------------------

    def _stale(self, member: int, now_ms: int) -> bool:
        # measured from the later of its last catch-up and its joining: a member that joined
        # (or was there when this master started) gets the full grace before it counts as stale
        joined = self._since.get(member, self._now)
        last = max(self._caught_up.get(member, joined), joined)
        return now_ms - last > self.max_not_catchup_ms

    def _tick(self, now_ms: int) -> None:
        self._now = max(self._now, now_ms)

    def _propose(self, new_set: frozenset[int]) -> Proposal | None:
        if new_set == self._local:
            return None
        self._pending = Proposal(frozenset(new_set), self._epoch)
        self._check()
        return self._pending

    def _check(self) -> None:
        require(self.master_id in self._local, f"master {self.master_id} left its SyncStateSet {self._local}")
        require(
            self._pending is None or self.master_id in self._pending.new_sync_state_set,
            f"proposal {self._pending} drops the master {self.master_id}",
        )
