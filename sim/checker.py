"""The safety and liveness properties the simulator checks, as events happen and at the end.

A broken property raises `Violation`; the run stops there and reports the trace around it.

1. No acknowledged message is lost: every record that must survive is in the log of every master
   elected after it (checked at each promotion and at the end). What must survive: every record
   below some replica's confirm offset (a reader may have seen it), and, when every write needs
   every member of the effective SyncStateSet (``all_ack_in_sync_state_set``, or two replicas),
   every acknowledged record. With fewer acks than members a write is promised to survive only as
   far as those members do, so there the acks are checked by (4) and by the confirm offset.
2. Confirmed prefixes of all replicas are identical: the record below any replica's confirm offset
   at a given offset is the same record on every replica, for the whole run.
3. No read returns a record a failover later took back: every record a reader saw is a record
   of (2), hence of (1).
4. At most one master acknowledges per epoch, and no master acknowledges a write after a newer
   master was promoted whose log lacks it (the lease and its replication rule, §3.5).
5. Confirm offsets move back only by truncation (or a crash's recovery), never past the log's end,
   and a truncation never cuts a record that must survive.
6. Under flush: sync a slave acks only what is on its disk.
7. A member the controller adds to a SyncStateSet holds every record that must survive when the
   change commits: a clean election may pick it from then on (§3.3). (Members already in the
   set are checked when one is promoted, by (1).)
8. Liveness, after the last fault heals: a master exists and a write is acknowledged within the
   bound `LIVENESS_MS`.

`InvariantViolation` raised by the real cores (their own checks) is reported the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .disk import Disk, Record

if TYPE_CHECKING:
    from .broker import Broker


class Violation(Exception):
    """A property the simulator checks was broken."""


class Checker:
    def __init__(self, strict_acks: bool) -> None:
        self.strict_acks = strict_acks
        self.confirmed: dict[int, int] = {}  # start -> mid, below some replica's confirm offset
        self.acked: dict[int, int] = {}  # start -> mid
        self.must: dict[int, tuple[int, str]] = {}  # start -> (mid, why)
        self.ack_epoch: dict[int, int] = {}  # master epoch -> the broker that acknowledged in it
        self.top: tuple[int, Broker | None] = (0, None)  # the newest promotion: (epoch, broker)
        self.acks = 0
        self.reads = 0

    # ------------------------------------------------------------------ the disk hooks

    def on_confirm(self, disk: Disk, old: int, new: int) -> None:
        if new < old:
            raise Violation(
                f"b{disk.owner}: confirm offset went back from {old} to {new} without a truncation"
            )
        if new > disk.max:
            raise Violation(f"b{disk.owner}: confirm offset {new} passes the log's end {disk.max}")
        confirmed, must = self.confirmed, self.must
        for start, _, _, mid in disk.range(old, new):
            seen = confirmed.get(start)
            if seen is None:
                confirmed[start] = mid
                if start not in must:
                    must[start] = (mid, "confirmed")
            elif seen != mid:
                raise Violation(
                    f"b{disk.owner}: confirmed record at {start} is message {mid}; another replica "
                    f"confirmed message {seen} there"
                )

    def on_truncate(self, disk: Disk, to: int) -> None:
        must = self.must
        for start, _, _, mid in disk.range(to, disk.max):
            kept = must.get(start)
            if kept is not None and kept[0] == mid:
                raise Violation(
                    f"b{disk.owner}: truncation to {to} cuts message {mid} at {start} ({kept[1]}); "
                    f"confirm offset {disk.confirm}"
                )

    # ------------------------------------------------------------------ the broker hooks

    def on_promote(self, broker: Broker, epoch: int) -> None:
        if epoch > self.top[0]:
            self.top = (epoch, broker)
        self._holds_all(broker, f"master of epoch {epoch}")

    def on_ack(self, broker: Broker, epoch: int, rec: Record) -> None:
        start, _, _, mid = rec
        self.acks += 1
        who = self.ack_epoch.setdefault(epoch, broker.bid)
        if who != broker.bid:
            raise Violation(f"two masters acknowledged in epoch {epoch}: b{who} and b{broker.bid}")
        if self.strict_acks and self.acked.get(start, mid) != mid:
            raise Violation(
                f"b{broker.bid} acknowledged message {mid} at {start}, where message {self.acked[start]} was acknowledged"
            )
        self.acked[start] = mid
        if self.strict_acks:
            self.must.setdefault(start, (mid, "acknowledged"))
        top_epoch, top = self.top
        if top_epoch > epoch and top is not None and top.disk.mid_at(start) != mid:
            raise Violation(
                f"b{broker.bid}, master of epoch {epoch}, acknowledged message {mid} at {start} after "
                f"b{top.bid} became master of epoch {top_epoch} without it"
            )

    def on_slave_ack(self, disk: Disk, offset: int) -> None:
        """flush: sync: an ack promises the bytes are on this replica's disk (ha/slavecore.py)."""
        if offset > disk.flushed:
            raise Violation(f"b{disk.owner} acks {offset}, beyond what is on its disk ({disk.flushed})")

    def on_read(self, broker: Broker, start: int, mid: int) -> None:
        self.reads += 1
        seen = self.confirmed.get(start)
        if seen != mid:
            raise Violation(
                f"a read of b{broker.bid} returned message {mid} at {start}; the confirmed record is {seen}"
            )

    def on_expansion(
        self, brokers: dict[int, Broker], added: frozenset[int], members: frozenset[int], sss_epoch: int
    ) -> None:
        for bid in sorted(added):
            self._holds_all(brokers[bid], f"added to the SyncStateSet {sorted(members)} of epoch {sss_epoch}")

    def _holds_all(self, broker: Broker, what: str) -> None:
        disk = broker.disk
        for start, (mid, why) in self.must.items():
            if disk.mid_at(start) != mid:
                raise Violation(
                    f"b{broker.bid}, {what}, lacks message {mid} at {start} ({why}); its log ends at "
                    f"{disk.max}, epochs {disk.epochs}"
                )

    def final(self, master: Broker) -> None:
        self._holds_all(master, "master at the end")
