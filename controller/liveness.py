"""Which brokers are alive: every controller's heartbeat table, as a pure state machine.

This module owns liveness and nothing else. The table lives only in memory (it is never
replicated: heartbeats arrive every second from every broker). Every controller keeps one: a
broker sends each heartbeat to the leader and a copy to every other controller, so a follower
that becomes leader already knows who has been silent. Time is always an argument (``now_ms``,
from a monotonic clock in the shell); the table never reads a clock, so tests drive it with plain
integers.

Theory of operation
-------------------
One entry per (broker set, broker id):

    beat(now)        entry absent   -> created with the reported (epoch, max_offset, confirm)
                     entry present  -> last_seen = now; priority refreshed; (epoch, max_offset)
                                       replaced only if it is lexicographically larger, so the
                                       stored pair never decreases while the entry lives; the
                                       confirm offset moves with a larger pair, or upward on an
                                       equal pair (a late, reordered heartbeat cannot roll it back)
                     heard_since    -> the start of the current unbroken run of heartbeats: reset
                                       to now when the entry had already timed out
    touch(now)       last_seen only (a follower that cannot check the claims yet)
    is_alive(now)    entry present and now - last_seen <= timeout
    expire(now)      entries with now - last_seen > timeout are removed and returned
    forget(...)      the shell saw the broker's connection close, or its data was cleaned

A leader that has just taken over may know nothing recent (it restarted, or the brokers could
not reach it). ``on_leadership(now)`` opens a grace window of one full timeout in which
``masters_needing_election`` declares a master dead only on *witnessed* silence: the master is
not alive and another member of its set has been heard without a break for at least a full
timeout, so this node was listening the whole time the master said nothing (RULES.md L4). Without
such a witness the set waits for the window to end, so brokers that have not yet found the new
leader are not failed over. Even witnessed silence waits until no lease an earlier leader granted
can still run (`ha/lease.py::prior_leader_lease_ms`, from the leadership): a witness's run breaks
only at a gap longer than the timeout, so this node's own shorter deafness counted as the master's
silence while the old leader still renewed its lease (the simulator's seed 2144). Grace never makes a broker *alive*: an election or a SyncStateSet
change still needs a real heartbeat (the LiveInfo it carries is what the election policy ranks).

A controller recovered alone after the datacenter of the other controllers was lost (`tide
controller recover --lost-datacenter`) is told which datacenters are gone (``presume_lost``):
within its grace, a silent master registered in one of them is failed over as soon as another
member of its set is alive, without a witness, from a time the shell derives from the recovery
command's start so that no lease the lost master held can outlive the election (RULES.md L8).

A leader that was not listening — its process paused (SIGSTOP, a long GC, a stalled host) or its
loop starved — looks, when it resumes, exactly like one that could not hear the brokers: every
entry is stale, and the silence it shows is silence nobody witnessed. ``on_tick(now)``, called on
every turn of the leader's loop, notices a gap of at least half the timeout since the last turn and
treats it like a new leadership: grace opens again, and every entry's ``heard_since`` restarts at
``now``, so no member witnesses the time this node was away (RULES.md L9).

A set whose controller-triggered election found nobody is left without a master (RULES.md E7);
``leaderless_sets_electable`` lists such sets once an electable broker is alive again, so the
leader can retry without waiting for a broker to ask.

The liveness predicate is ``last_seen + timeout >= now`` (docs/reference/rocketmq-controller-ha.md §1.2,
"Liveness predicate").
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.controller.election import elect
from tidelog.controller.state import ControllerState, LiveInfo
from tidelog.ha.lease import prior_leader_lease_ms

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_MS", "MAX_REPORTED_OFFSET", "HeartbeatTable", "heartbeat_problem"]

DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000  # docs/ARCHITECTURE.md §7.3: heartbeat every 1 s, timeout 5 s
_PRIORITY_DEFAULT = 2**31 - 1
# Offsets a heartbeat may claim: 2^53 bytes (8 PiB) is past any real log, and every offset below
# it survives a trip through a JSON number (a double) in status output and tools unchanged.
MAX_REPORTED_OFFSET = 2**53 - 1


@dataclass
class _Entry:
    epoch: int
    max_offset: int
    confirm_offset: int
    priority: int
    last_seen_ms: int
    heard_since_ms: int

    def info(self) -> LiveInfo:
        return LiveInfo(
            epoch=self.epoch,
            max_offset=self.max_offset,
            confirm_offset=self.confirm_offset,
            priority=self.priority,
        )


def heartbeat_problem(set_epoch: int, epoch: int, max_offset: int, confirm_offset: int) -> str | None:
    """Why a heartbeat's claims cannot be true of a member of a set at `set_epoch`, or None.

    A broker's epoch file only ever gains epochs the controller assigned, so a heartbeat claiming
    a later one is forged or from another cluster's history; accepting it would let the claimant
    win the next election (highest epoch first). Offsets must be non-negative and the confirm
    offset (-1: not reported) never past the max offset.
    """
    if epoch < -1:
        return f"epoch {epoch} is not an epoch"
    if epoch > set_epoch:
        return f"epoch {epoch} is beyond the broker set's epoch {set_epoch}"
    if max_offset < 0:
        return f"max offset {max_offset} is negative"
    if max_offset > MAX_REPORTED_OFFSET:
        return f"max offset {max_offset} is beyond 2^53 - 1, larger than any log"
    if confirm_offset < -1 or confirm_offset > max_offset:
        return f"confirm offset {confirm_offset} is outside [-1, max offset {max_offset}]"
    return None


class HeartbeatTable:
    """In-memory liveness of brokers. Not thread-safe: the shell serialises calls."""

    def __init__(self, timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS) -> None:
        if type(timeout_ms) is not int or timeout_ms <= 0:
            raise ValueError(f"heartbeat timeout must be a positive integer of ms, got {timeout_ms!r}")
        self.timeout_ms = timeout_ms
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._grace_until_ms: int | None = None
        self._witness_from_ms = 0  # no witnessed failover before earlier leaders' leases ran out
        self._last_tick_ms: int | None = None
        self._lost_datacenters: frozenset[str] = frozenset()
        self._lost_from_ms = 0

    def beat(
        self,
        broker_set: str,
        broker_id: int,
        epoch: int,
        max_offset: int,
        confirm_offset: int,
        now_ms: int,
        priority: int = _PRIORITY_DEFAULT,
    ) -> None:
        key = (broker_set, broker_id)
        e = self._entries.get(key)
        if e is None:
            self._entries[key] = _Entry(epoch, max_offset, confirm_offset, priority, now_ms, now_ms)
            return
        self._heard(e, now_ms)
        e.priority = priority
        if (epoch, max_offset) > (e.epoch, e.max_offset):
            e.epoch, e.max_offset, e.confirm_offset = epoch, max_offset, confirm_offset
        elif (epoch, max_offset) == (e.epoch, e.max_offset):
            e.confirm_offset = max(e.confirm_offset, confirm_offset)

    def touch(self, broker_set: str, broker_id: int, now_ms: int) -> None:
        """A heartbeat whose claims this node cannot check yet: it proves only that the broker lives."""
        e = self._entries.get((broker_set, broker_id))
        if e is not None:
            self._heard(e, now_ms)

    def _heard(self, e: _Entry, now_ms: int) -> None:
        if e.last_seen_ms + self.timeout_ms < now_ms:
            e.heard_since_ms = now_ms  # it had timed out: a new run of heartbeats starts
        # A heartbeat delayed in the network may carry an older clock reading; never move back.
        e.last_seen_ms = max(e.last_seen_ms, now_ms)

    def on_leadership(self, now_ms: int) -> None:
        self._grace_until_ms = now_ms + self.timeout_ms
        self._witness_from_ms = now_ms + prior_leader_lease_ms(self.timeout_ms)
        self._last_tick_ms = now_ms

    @property
    def tick_gap_ms(self) -> int:
        """The longest pause between two turns of the leader's loop that is still listening."""
        return self.timeout_ms // 2

    def on_tick(self, now_ms: int) -> bool:
        """One turn of the leader's loop at `now_ms`. True when it follows a gap of at least
        `tick_gap_ms` since the last turn (or the leadership): the node was not listening, so grace
        opens again and no member's run of heartbeats spans the gap (RULES.md L9)."""
        last = self._last_tick_ms
        self._last_tick_ms = now_ms if last is None else max(last, now_ms)
        if last is None or now_ms - last < self.tick_gap_ms:
            return False
        self._grace_until_ms = now_ms + self.timeout_ms
        for e in self._entries.values():
            e.heard_since_ms = max(e.heard_since_ms, now_ms)
        return True

    def presume_lost(self, datacenters: frozenset[str], from_ms: int = 0) -> None:
        """Take the masters registered in `datacenters` as gone from `from_ms` on (RULES.md L8):
        the operator declared those datacenters lost when forcing a recovery. Empty: none."""
        self._lost_datacenters = datacenters
        self._lost_from_ms = from_ms

    def _presumed_lost(self, state: ControllerState, broker_set: str, broker_id: int, now_ms: int) -> bool:
        if not self._lost_datacenters or now_ms < self._lost_from_ms:
            return False
        member = state.broker_sets[broker_set].members.get(broker_id)
        return member is not None and member.datacenter in self._lost_datacenters

    def in_grace(self, now_ms: int) -> bool:
        return self._grace_until_ms is not None and now_ms < self._grace_until_ms

    def is_alive(self, broker_set: str, broker_id: int, now_ms: int) -> bool:
        e = self._entries.get((broker_set, broker_id))
        return e is not None and e.last_seen_ms + self.timeout_ms >= now_ms

    def alive(self, broker_set: str, now_ms: int) -> dict[int, LiveInfo]:
        """Alive brokers of one set with what they last reported, ascending id."""
        return {
            bid: e.info()
            for (name, bid), e in sorted(self._entries.items())
            if name == broker_set and e.last_seen_ms + self.timeout_ms >= now_ms
        }

    def heard(self, now_ms: int) -> int:
        """How many brokers, of every set, are alive in this table."""
        return sum(1 for e in self._entries.values() if e.last_seen_ms + self.timeout_ms >= now_ms)

    def alive_ids(self, broker_set: str, now_ms: int) -> frozenset[int]:
        return frozenset(self.alive(broker_set, now_ms))

    def info(self, broker_set: str, broker_id: int) -> LiveInfo | None:
        """The last report of a broker, alive or not yet expired."""
        e = self._entries.get((broker_set, broker_id))
        return e.info() if e is not None else None

    def expire(self, now_ms: int) -> list[tuple[str, int]]:
        """Remove and return the entries whose timeout has passed, in ascending order."""
        dead = sorted(k for k, e in self._entries.items() if e.last_seen_ms + self.timeout_ms < now_ms)
        for k in dead:
            del self._entries[k]
        return dead

    def forget(self, broker_set: str, broker_id: int | None = None) -> None:
        """Drop one broker's entry, or every entry of a broker set (``broker_id`` None)."""
        if broker_id is not None:
            self._entries.pop((broker_set, broker_id), None)
            return
        for k in [k for k in self._entries if k[0] == broker_set]:
            del self._entries[k]

    def masters_needing_election(self, state: ControllerState, now_ms: int) -> list[str]:
        """Broker sets whose recorded master is dead while some member is alive
        (docs/reference/rocketmq-controller-ha.md §1.2, scanNeedReelectBrokerSets), ascending name;
        during the new-leader grace window only those whose master's silence a continuously heard
        member witnessed (RULES.md L4), or whose master is in a datacenter declared lost (L8)."""
        grace = self.in_grace(now_ms)
        out = []
        for name in sorted(state.broker_sets):
            bs = state.broker_sets[name]
            if bs.master_id is None or self.is_alive(name, bs.master_id, now_ms):
                continue
            # a master declared lost needs no witness: it is not expected to find this leader
            witnessed = grace and not self._presumed_lost(state, name, bs.master_id, now_ms)
            if witnessed and now_ms < self._witness_from_ms:
                continue  # an earlier leader's lease may still let that master acknowledge
            if any(
                self._witness(name, i, now_ms) if witnessed else self.is_alive(name, i, now_ms)
                for i in bs.members
                if i != bs.master_id
            ):
                out.append(name)
        return out

    def _witness(self, broker_set: str, broker_id: int, now_ms: int) -> bool:
        """Alive and heard without a break for a full timeout: had the master been beating too,
        this node would have heard it within that time."""
        e = self._entries.get((broker_set, broker_id))
        return (
            e is not None
            and e.last_seen_ms + self.timeout_ms >= now_ms
            and now_ms - e.heard_since_ms >= self.timeout_ms
        )

    def leaderless_sets_electable(
        self, state: ControllerState, now_ms: int, enable_unclean: bool
    ) -> list[str]:
        """Broker sets that had a master once, have none now, and would elect one with the current
        liveness (RULES.md L6), ascending name; none during the grace window.

        After a failed controller-triggered election the set has no master, so
        ``masters_needing_election`` no longer lists it; this is how the leader notices that a
        SyncStateSet member came back, without waiting for a broker to ask."""
        if self.in_grace(now_ms):
            return []
        out = []
        for name in sorted(state.broker_sets):
            bs = state.broker_sets[name]
            if bs.master_id is not None or bs.master_epoch == 0:
                continue
            alive = {i: info for i, info in self.alive(name, now_ms).items() if i in bs.members}
            if elect(bs.sync_state_set, bs.members.keys(), None, None, alive, enable_unclean) is not None:
                out.append(name)
        return out

    def __len__(self) -> int:
        return len(self._entries)
