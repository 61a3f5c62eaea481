"""Which replica acks a write needs, and which offsets those acks make safe. Pure functions.

Theory of operation
-------------------
A write to the master goes through three questions, each answered here from plain numbers:

1. **Before writing** — `required_acks(cfg, |SyncStateSet|)`: how many SyncStateSet members
   (the master included) must hold the write before the producer is told it is stored. If that
   number can never be reached, `InSyncReplicasNotEnoughError` is raised *before* anything is
   appended, so the producer may retry safely.
2. **While waiting** — `acked_by(needed, ...)`: the highest offset that `needed` members hold.
   Every producer whose write ends at or below it is answered (`OffsetWaiters.release`).
3. **For readers** — `confirm_offset(...)`: the offset below which every member of the
   SyncStateSet holds the data; consumers, slaves and Spark never read past it, so a failover
   (which elects only a SyncStateSet member) can never take back what someone has read.

Only members of the SyncStateSet count, in both (2) and (3). That is stricter than RocketMQ,
whose `need >= 2` path also counts acks from slaves outside the set (docs/reference/rocketmq-controller-ha.md §4): a write
acknowledged by such a slave is not protected by an election, which only picks SyncStateSet
members, so tidelog does not count it. The caller (`ha.mastercore`) passes a different set to
each question, the conservative one in both directions of a change: (2) counts a quorum only
over the controller-confirmed set (a member of a pending expansion is not electable yet, so its
ack must not stand in for a confirmed member's; `MasterCore.acked_by` also requires it to hold
the write, since it may become electable at any moment), or else needs every member of the *effective*
set (`held_by_all`: the confirmed set united with a pending proposal, see `syncstate.py`), which
is safe whichever way the change goes and is what lets a master acknowledge without a lease
(`ha/lease.py`); (3) waits for the effective set, so a reader never passes what a member joining
or leaving may lack.

Offsets are physical commit-log offsets; an ack is the slave's max offset (the end of its log).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from tidelog.errors import ConfigError, InSyncReplicasNotEnoughError

__all__ = ["REPLICATION_MODES", "AckConfig", "acked_by", "confirm_offset", "held_by_all", "required_acks"]

REPLICATION_MODES = frozenset({"sync", "async"})


@dataclass(frozen=True)
class AckConfig:
    """The broker's replication settings (names follow RocketMQ's MessageStoreConfig)."""

    replication: str = "sync"  # "sync": wait for replica acks; "async": answer after the local append
    in_sync_replicas: int = 1  # acks a sync write needs, the master's own included
    min_in_sync_replicas: int = 1  # below this many SyncStateSet members, sync writes fail fast
    auto_in_sync_replicas: bool = False  # lower the need to the set's size, but never below the minimum
    all_ack_in_sync_state_set: bool = False  # need every SyncStateSet member

    def __post_init__(self) -> None:
        if self.replication not in REPLICATION_MODES:
            raise ConfigError(
                f"replication must be one of {sorted(REPLICATION_MODES)}, got {self.replication!r}"
            )
        for name in ("in_sync_replicas", "min_in_sync_replicas"):
            value = getattr(self, name)
            # bool is an int in Python; `in_sync_replicas: true` in YAML is a typo, not 1
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{name} must be an integer of at least 1 (the master counts), got {value!r}"
                )
        for name in ("auto_in_sync_replicas", "all_ack_in_sync_state_set"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.min_in_sync_replicas > self.in_sync_replicas:
            raise ConfigError(
                f"min_in_sync_replicas ({self.min_in_sync_replicas}) must not exceed in_sync_replicas "
                f"({self.in_sync_replicas})"
            )


def required_acks(cfg: AckConfig, sss_size: int) -> int:
    """Acks (master included) a write needs now, or InSyncReplicasNotEnoughError before writing.

    - ``async``: 1, the master's own append.
    - ``sync``: fewer than `min_in_sync_replicas` members in the SyncStateSet fails fast. Then
      `all_ack_in_sync_state_set` needs every member; `auto_in_sync_replicas` needs
      ``max(min(in_sync_replicas, sss_size), min_in_sync_replicas)``; otherwise
      `in_sync_replicas`.
    - A need larger than the set fails fast too. RocketMQ would append and then wait out the
      slave timeout, because it also counts acks from slaves outside the set; tidelog counts only
      members (see the module docstring), so such a write could never complete. Answering
      FLUSH_SLAVE_TIMEOUT three seconds later would leave a stored message the producer
      believes may be lost; refusing first is the honest answer, and retryable.

    `sss_size` is the size of the effective SyncStateSet (pending expansion included).
    """
    if cfg.replication == "async":
        return 1
    if sss_size < cfg.min_in_sync_replicas:
        raise InSyncReplicasNotEnoughError(
            f"the SyncStateSet has {sss_size} member(s), min_in_sync_replicas is {cfg.min_in_sync_replicas}",
            sync_state_set_size=sss_size,
            needed=cfg.min_in_sync_replicas,
        )
    if cfg.all_ack_in_sync_state_set:
        needed = sss_size
    elif cfg.auto_in_sync_replicas:
        # docs/ARCHITECTURE.md §3.4's formula as written; with min <= in_sync (validated) and min <= sss_size
        # (checked above) the outer max never bites, but it states the floor the user configured
        needed = max(min(cfg.in_sync_replicas, sss_size), cfg.min_in_sync_replicas)
    else:
        needed = cfg.in_sync_replicas
    if needed > sss_size:
        raise InSyncReplicasNotEnoughError(
            f"a write needs {needed} in-sync replicas, the SyncStateSet has {sss_size}",
            sync_state_set_size=sss_size,
            needed=needed,
        )
    return needed


def _member_offsets(
    master_id: int, master_offset: int, acks: Mapping[int, int], sync_state_set: AbstractSet[int]
) -> list[int]:
    # The master always counts, with its own log end, whether or not the caller listed it. A
    # member that has not acked yet holds nothing we know of: 0. Nobody counts beyond the
    # master's end (a slave cannot hold what the master never wrote; a stale ack from before a
    # truncation must not confirm bytes that are gone).
    offsets = [master_offset]
    for member in sync_state_set:
        if member != master_id:
            offsets.append(min(acks.get(member, 0), master_offset))
    return offsets


def acked_by(
    needed: int, master_id: int, master_offset: int, acks: Mapping[int, int], sync_state_set: AbstractSet[int]
) -> int:
    """The highest offset that at least `needed` SyncStateSet members hold (the master counts).

    Acks of brokers outside the set are ignored; members without an ack count as 0;
    ``needed <= 1`` is the master's own `master_offset`. With more `needed` than members the
    answer is 0: nothing is acknowledged (required_acks refuses such writes up front).
    """
    if needed <= 1:
        return master_offset
    offsets = _member_offsets(master_id, master_offset, acks, sync_state_set)
    if needed > len(offsets):
        return 0
    offsets.sort(reverse=True)
    return offsets[needed - 1]


def confirm_offset(
    master_id: int,
    master_offset: int,
    acks: Mapping[int, int],
    connected: AbstractSet[int],
    sync_state_set: AbstractSet[int],
    current: int,
) -> int:
    """The new confirm offset: what every SyncStateSet member holds; it never moves back here.

    ``min(master_offset, ack of every other member)``, but no advance at all (`current`) while
    some other member is not connected: its last ack may be stale, and the set is about to
    shrink anyway. A connected member that has not acked yet also holds the value back
    (RocketMQ skips acks <= 0 instead; right after a reconnect that would confirm data the
    member may not have). Truncation is the only thing that lowers the confirm offset, and it
    does so elsewhere; `current` is expected to be at most `master_offset`.
    """
    others = [m for m in sync_state_set if m != master_id]
    if any(m not in connected for m in others):
        return current
    candidate = min(_member_offsets(master_id, master_offset, acks, sync_state_set))
    return max(current, candidate)


def held_by_all(
    master_id: int,
    master_offset: int,
    acks: Mapping[int, int],
    connected: AbstractSet[int],
    members: AbstractSet[int],
) -> int:
    """The highest offset every one of `members` holds (the master with its own end), or -1 while
    some other member is not connected (its last ack may be stale). Unlike `confirm_offset` it does
    not keep a floor: it answers for the members as they are now."""
    if any(m != master_id and m not in connected for m in members):
        return -1
    return min(_member_offsets(master_id, master_offset, acks, members))
