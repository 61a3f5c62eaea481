"""Who becomes master: the election policy, as one pure function.

This module owns the *choice* of a new master and nothing else. It does not know whether the
election was triggered by a broker, by the controller or by an operator, it does not bump epochs
and it does not reset the SyncStateSet: `state.ControllerState.apply(ElectMaster)` does that
around it (RULES.md, "Election"). Liveness arrives as data (the leader's heartbeat snapshot), so
the same inputs give the same answer on every replica.

Theory of operation
-------------------
An election is two passes over candidate sets, the safe one first:

    pass 1   candidates = SyncStateSet             (no acknowledged data can be lost)
    pass 2   candidates = every registered member  (only with unclean election enabled;
                                                    data beyond the winner's log is lost)

Inside one pass (``_try``) the rules are, in order:

    1. keep only candidates that are alive (present in ``alive``);          none left -> no one
    2. the old master is alive and no other broker is preferred             -> the old master
       (the caller reports this as "master still exists", not as a change)
    3. an operator preferred a broker                                       -> that broker if it
       is an alive candidate of this pass, else no one in this pass (no fallback to others:
       the operator asked for one broker, not for "anyone")
    4. otherwise the best alive candidate by (epoch desc, max_offset desc, priority asc,
       broker_id asc) — the newest log wins; a lower priority value is preferred; the lowest
       id breaks exact ties so every replica picks the same broker.

RocketMQ sorts with a comparator that casts an offset difference to int and collapses equal
brokers in a TreeSet (QUIRK, docs/reference/rocketmq-controller-ha.md §2.1); a plain tuple key has
neither problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .model import LiveInfo

__all__ = ["elect", "rank_key"]


def rank_key(broker_id: int, info: LiveInfo) -> tuple[int, int, int, int]:
    """Sort key of an alive candidate; the smallest key wins."""
    return (-info.epoch, -info.max_offset, info.priority, broker_id)


def _try(
    candidates: Iterable[int],
    old_master: int | None,
    preferred: int | None,
    alive: Mapping[int, LiveInfo],
) -> int | None:
    living = sorted(c for c in set(candidates) if c in alive)
    if not living:
        return None
    if old_master is not None and old_master in living and preferred in (None, old_master):
        return old_master
    if preferred is not None:
        return preferred if preferred in living else None
    return min(living, key=lambda b: rank_key(b, alive[b]))


def elect(
    sync_state_set: Iterable[int],
    all_members: Iterable[int],
    old_master: int | None,
    preferred: int | None,
    alive: Mapping[int, LiveInfo],
    enable_unclean: bool,
) -> int | None:
    """The broker id that should be master, or None when nobody may be.

    Returns ``old_master`` when it is alive and not asked to hand over; the caller treats that
    as "no change". With ``enable_unclean`` off the answer is always a SyncStateSet member.
    """
    winner = _try(sync_state_set, old_master, preferred, alive)
    if winner is None and enable_unclean:
        winner = _try(all_members, old_master, preferred, alive)
    return winner
