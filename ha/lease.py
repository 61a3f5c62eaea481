"""When a master may acknowledge a write: the lease, and the replication rule that can stand in for it.

Theory of operation
-------------------
A deposed master must never acknowledge a write that the new master's history lacks
(docs/ARCHITECTURE.md §3.5). Two things can guarantee it:

1. **The lease.** Each heartbeat the controller answers renews it until
   ``sent + fraction × heartbeat timeout``. The controller saw that heartbeat no earlier than
   ``sent`` and elects no other master before ``sent + timeout``, so a master cut off from the
   controllers stops acknowledging before a replacement can exist. It needs the controllers: with
   no quorum answering, every write stops.
2. **The replication rule.** A write held by *every* member of every SyncStateSet the controller
   might know (``MasterCore.held_by_all``: the confirmed set united with a pending proposal) is held
   by whichever broker a clean election can pick. A promoted slave stops following the old master,
   so the old master cannot collect the acks it needs for anything written after the promotion,
   and a master alone in its set cannot be replaced by a clean election at all. No clock and no
   controller are needed, as long as elections are clean.

`Lease.may_acknowledge` decides between them: the rule when it covers the write and the controller
says unclean elections are off, the lease otherwise (an unclean election picks a broker outside the
set, which the rule cannot cover; asynchronous replication acknowledges before any member holds the
write). The steps of the argument are numbered in docs/ARCHITECTURE.md §3.5 and each is a test in
tests/ha/test_lease.py.

Time is passed in (milliseconds of a monotonic clock); nothing here reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tidelog.invariants import require

__all__ = [
    "DRIFT_BOUND",
    "GRANT_WINDOW_FRACTION",
    "LEASE_FRACTION",
    "Lease",
    "LeaseFences",
    "grants_lease",
    "handover_wait_ms",
    "majority_contact_age",
    "prior_leader_lease_ms",
]

LEASE_FRACTION = (
    0.75  # of the controller's heartbeat timeout: how long an answered heartbeat lets a master acknowledge
)


# A controller leader grants a lease only while a majority of its Raft group answered it within
# this fraction of the heartbeat timeout. A leader cut off from its majority keeps believing it
# leads for `leader_fallback_timeout_ms` (PySyncObj steps down only then) and would go on renewing
# leases that outlive the new leader's election of another master (the simulator's seed 46). With
# the window, the last lease it grants ends before `cut + GRANT_WINDOW_FRACTION x timeout +
# LEASE_FRACTION x timeout`, inside the timeout after which the majority may replace the master.
GRANT_WINDOW_FRACTION = 0.15


def majority_contact_age(now_ms: float, last_answers_ms: list[float], group_size: int) -> float:
    """How long ago a majority of a Raft group (the leader itself counted at `now_ms`) last answered
    the leader, from the other members' last answer times; infinite when too few ever answered."""
    need = group_size // 2  # others that, with the leader, make a majority
    if need <= 0:
        return 0.0
    if len(last_answers_ms) < need:
        return float("inf")
    newest_first = sorted(last_answers_ms, reverse=True)
    return max(0.0, now_ms - newest_first[need - 1])


# The bound on how far two processes' monotonic clocks may run apart in rate (docs/ARCHITECTURE.md
# §3.5): 1 %, the simulator's DRIFT. Waits that outlast a lease counted on another clock add it.
DRIFT_BOUND = 0.01


def handover_wait_ms(heartbeat_timeout_ms: int) -> int:
    """How long after a leader stops renewing a master's lease that lease may still hold, on the
    leader's clock: the longest lease (counted by the master from a heartbeat it sent before the
    leader stopped), stretched by the drift bound on both clocks. A designated election that
    replaces a live master waits this long before it is proposed."""
    return math.ceil(LEASE_FRACTION * heartbeat_timeout_ms * (1 + DRIFT_BOUND) / (1 - DRIFT_BOUND)) + 1


def prior_leader_lease_ms(heartbeat_timeout_ms: int) -> int:
    """How long after a controller becomes leader a lease granted by an earlier leader may still
    hold, on the new leader's clock. An earlier leader grants only while a majority answered it
    within the grant window; a member of that majority voted for the new leader before it led and
    answers the old term no more, so the last grant is at most a grant window before the new
    leadership, and the lease it grants runs at most `handover_wait_ms` after that (RULES.md L4)."""
    return math.ceil(GRANT_WINDOW_FRACTION * heartbeat_timeout_ms) + handover_wait_ms(heartbeat_timeout_ms)


class LeaseFences:
    """The masters whose lease a controller leader has stopped renewing because it is electing
    another (RULES.md L7).

    An election is decided on the leader's liveness table and committed through Raft some time
    later. A heartbeat from the old master answered in between (a leader that resumes from a pause
    decides before it reads the heartbeats that waited for it: the simulator's seed 2645) would
    renew a lease that outlives the commit, and a master with `in_sync_replicas` below its set's
    size acknowledges on the lease alone a write the new master lacks. So the leader fences the
    set's master epoch *before* it decides, and lifts the fence only once Raft has settled the
    command (committed or refused: the new state then names the new master, or the old one stays).
    Counted, because a controller-triggered and a requested election may overlap. Pure: no clock,
    no I/O; the shell holds one per node and clears it when it leads a new term (that term answers
    nothing before its state holds every earlier term's commands).
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], int] = {}
        self._generation = 0  # bumped by `clear`: a fence held before it is released as a no-op

    def hold(self, broker_set: str, master_epoch: int) -> tuple[str, int, int]:
        key = (broker_set, master_epoch)
        self._held[key] = self._held.get(key, 0) + 1
        return (broker_set, master_epoch, self._generation)

    def release(self, token: tuple[str, int, int]) -> None:
        broker_set, master_epoch, generation = token
        if generation != self._generation:
            return  # cleared since (a new term): nothing of it is held any more
        key = (broker_set, master_epoch)
        n = self._held.get(key, 0)
        require(n > 0, f"lease fence {key} released more often than held")
        if n == 1:
            del self._held[key]
        else:
            self._held[key] = n - 1

    def withholds(self, broker_set: str, master_epoch: int) -> bool:
        """Whether the master of `broker_set` at `master_epoch` gets no lease now."""
        return (broker_set, master_epoch) in self._held

    def clear(self) -> None:
        self._held.clear()
        self._generation += 1


def grants_lease(majority_age_ms: float, heartbeat_timeout_ms: int) -> bool:
    """Whether a leader whose majority last answered `majority_age_ms` ago may renew a lease."""
    return majority_age_ms <= GRANT_WINDOW_FRACTION * heartbeat_timeout_ms


@dataclass
class Lease:
    """A master's right to acknowledge writes in one master epoch, as far as the controller's word gives it.

    Only an answer that names this broker master of epoch E renews it, and only for E: an answer
    naming another master says the controller has already replaced this one (the simulator's seed
    6343: a broker back from a fail-stop took a stale leader's old role while the new leader's
    answers, naming another master, went on renewing its lease)."""

    fraction: float = LEASE_FRACTION
    until_ms: int = -1  # monotonic time until which the lease holds (-1: never renewed)
    epoch: int = -1  # the master epoch the lease was granted for (-1: none)
    # The controller's word on elections outside the SyncStateSet (from its heartbeat replies). Until
    # a controller has said otherwise it is assumed on: the rule then does not stand in for the lease.
    unclean_elections: bool = True

    def __post_init__(self) -> None:
        require(0 < self.fraction < 1, f"the lease fraction must be within (0, 1), got {self.fraction}")

    def renew(self, sent_ms: int, heartbeat_timeout_ms: int, *, epoch: int, unclean_elections: bool) -> None:
        """A heartbeat sent at `sent_ms` was answered naming this broker master of `epoch`; the
        controller's timeout and election policy with it. An answer for an older epoch than the
        lease's changes nothing; one for a newer epoch replaces the lease."""
        require(heartbeat_timeout_ms > 0, f"a heartbeat timeout must be positive, got {heartbeat_timeout_ms}")
        if epoch < self.epoch:
            return
        until = sent_ms + int(self.fraction * heartbeat_timeout_ms)
        self.until_ms = until if epoch > self.epoch else max(self.until_ms, until)
        self.epoch = epoch
        self.unclean_elections = unclean_elections

    def holds(self, now_ms: int, epoch: int) -> bool:
        """Whether the lease lets the master of `epoch` acknowledge at `now_ms`."""
        return epoch == self.epoch and now_ms <= self.until_ms

    def rule_covers(self, end: int, held_by_all: int, *, replication: str) -> bool:
        """Whether the replication rule alone makes a write ending at `end` safe to acknowledge:
        synchronous replication, clean elections only, and every member the controller might know
        holds the write."""
        return replication == "sync" and not self.unclean_elections and end <= held_by_all

    def may_acknowledge(
        self, now_ms: int, epoch: int, end: int, held_by_all: int, *, replication: str
    ) -> bool:
        """Whether the master of `epoch` may answer a write ending at `end`, whose acks are in, as stored now."""
        return self.rule_covers(end, held_by_all, replication=replication) or self.holds(now_ms, epoch)

    def may_start(self, now_ms: int, epoch: int, *, replication: str, needs_every_member: bool) -> bool:
        """Whether the master of `epoch` may append a write now with any hope of it being
        acknowledged: the lease holds, or the rule will cover it once every member holds it. Checked
        again after the acks (`may_acknowledge`); this is the fail-fast half."""
        if self.holds(now_ms, epoch):
            return True
        return replication == "sync" and not self.unclean_elections and needs_every_member
