"""Which brokers are alive: the controller leader's heartbeat table, as a pure state machine.

This module owns liveness and nothing else. The table lives only in the Raft leader's memory
(it is never replicated: heartbeats arrive every second from every broker, and a follower does
not need them). Time is always an argument (``now_ms``, from a monotonic clock in the shell);
the table never reads a clock, so tests drive it with plain integers.

Theory of operation
-------------------
One entry per (broker set, broker id):

    beat(now)        entry absent   -> created with the reported (epoch, max_offset, confirm)
                     entry present  -> last_seen = now; priority refreshed; (epoch, max_offset)
                                       replaced only if it is lexicographically larger, so the
                                       stored pair never decreases while the entry lives; the
                                       confirm offset moves with a larger pair, or upward on an
                                       equal pair (a late, reordered heartbeat cannot roll it back)
    is_alive(now)    entry present and now - last_seen <= timeout
    expire(now)      entries with now - last_seen > timeout are removed and returned
    forget(...)      the shell saw the broker's connection close, or its data was cleaned

A leader that has just taken over knows nothing recent. ``on_leadership(now)`` opens a grace
window of one full timeout: entries it already holds are treated as just seen, and
``masters_needing_election`` declares no master dead before the window ends, so brokers that
have not yet found the new leader are not failed over. Grace never makes a broker *alive*: an
election or a SyncStateSet change still needs a real heartbeat (the LiveInfo it carries is what
the election policy ranks).

A set whose controller-triggered election found nobody is left without a master (RULES.md E7);
``leaderless_sets_electable`` lists such sets once an electable broker is alive again, so the
leader can retry without waiting for a broker to ask.

The liveness predicate is ``last_seen + timeout >= now`` (docs/reference/rocketmq-controller-ha.md §1.2, "Liveness predicate").
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.controller.election import elect
from tidelog.controller.state import ControllerState, LiveInfo

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT_MS", "HeartbeatTable"]

DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000  # docs/DESIGN.md: heartbeat every 1 s, timeout 5 s
_PRIORITY_DEFAULT = 2**31 - 1


@dataclass
class _Entry:
    epoch: int
    max_offset: int
    confirm_offset: int
    priority: int
    last_seen_ms: int

    def info(self) -> LiveInfo:
        return LiveInfo(epoch=self.epoch, max_offset=self.max_offset,
                        confirm_offset=self.confirm_offset, priority=self.priority)


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
    if confirm_offset < -1 or confirm_offset > max_offset:
        return f"confirm offset {confirm_offset} is outside [-1, max offset {max_offset}]"
    return None


class HeartbeatTable:
    """Leader-memory liveness of brokers. Not thread-safe: the shell serialises calls."""

    def __init__(self, timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS) -> None:
        if type(timeout_ms) is not int or timeout_ms <= 0:
            raise ValueError(f"heartbeat timeout must be a positive integer of ms, got {timeout_ms!r}")
        self.timeout_ms = timeout_ms
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._grace_until_ms: int | None = None

    def beat(self, broker_set: str, broker_id: int, epoch: int, max_offset: int, confirm_offset: int,
             now_ms: int, priority: int = _PRIORITY_DEFAULT) -> None:
        key = (broker_set, broker_id)
        e = self._entries.get(key)
        if e is None:
            self._entries[key] = _Entry(epoch, max_offset, confirm_offset, priority, now_ms)
            return
        # A heartbeat delayed in the network may carry an older clock reading; never move back.
        e.last_seen_ms = max(e.last_seen_ms, now_ms)
        e.priority = priority
        if (epoch, max_offset) > (e.epoch, e.max_offset):
            e.epoch, e.max_offset, e.confirm_offset = epoch, max_offset, confirm_offset
        elif (epoch, max_offset) == (e.epoch, e.max_offset):
            e.confirm_offset = max(e.confirm_offset, confirm_offset)

    def on_leadership(self, now_ms: int) -> None:
        self._grace_until_ms = now_ms + self.timeout_ms
        for e in self._entries.values():
            e.last_seen_ms = max(e.last_seen_ms, now_ms)

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
        """Broker sets whose recorded master is dead while some member is alive (docs/reference/rocketmq-controller-ha.md §1.2,
        scanNeedReelectBrokerSets), ascending name; none during the new-leader grace window."""
        if self.in_grace(now_ms):
            return []
        out = []
        for name in sorted(state.broker_sets):
            bs = state.broker_sets[name]
            if bs.master_id is None or self.is_alive(name, bs.master_id, now_ms):
                continue
            if any(self.is_alive(name, i, now_ms) for i in bs.members):
                out.append(name)
        return out

    def leaderless_sets_electable(self, state: ControllerState, now_ms: int, enable_unclean: bool) -> list[str]:
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
