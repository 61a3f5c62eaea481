"""The slave's replication decisions, as a pure state machine: `SlaveCore.step(event, now_ms) -> actions`.

Theory of operation
-------------------
`ha.slave.HaSlave` owns the socket and the commit log; what to do with what the master sends is
decided here, from plain numbers (the local log's facts come in with each event):

- `MasterAnswered` (the handshake reply): refuse a master older than an epoch known here (a
  deposed master must not write here); otherwise find the last point both histories agree on
  (`commitlog.epochs.last_consistent_point`) and cut there (`Truncate`) — but never below the
  confirm offset unless the controller declared an election outside the SyncStateSet after the
  last epoch this replica holds (a clean election keeps what every in-sync member held). An
  empty replica below the master's retention begins at the master's min offset (`StartAt`).
  Then `Ack` the log's end (after `AwaitFlush` under flush: sync: the first ack counts too).
- `TransferArrived`: refuse data of an older epoch than the stream already carried and data not
  starting exactly at the local end; otherwise `RecordEpoch` when a new epoch starts,
  `Append`, (`AwaitFlush`), `Ack`, and follow the master's confirm offset, never past the local
  end (`SetConfirm`).
- `AckTick`: the periodic ack (an ack under flush: sync promises the bytes are on disk).

A refusal is an action (`Refuse`); the shell closes the connection and tries again later. The
rules are those of docs/ARCHITECTURE.md §3.2 (fork repair) and §4.7.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidelog.commitlog.epochs import last_consistent_point

__all__ = [
    "Ack",
    "AckTick",
    "Action",
    "Append",
    "AwaitFlush",
    "Event",
    "LocalLog",
    "MasterAnswered",
    "RecordEpoch",
    "Refuse",
    "SetConfirm",
    "SlaveCore",
    "StartAt",
    "TransferArrived",
    "Truncate",
]


@dataclass(frozen=True)
class LocalLog:
    """What the slave's own log holds, at the moment of an event."""

    epochs: tuple[tuple[int, int], ...]  # (epoch, start offset), oldest first
    min_offset: int
    max_offset: int
    confirm_offset: int
    flushed_offset: int = 0

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class MasterAnswered:
    master_epoch: int
    master_min: int
    master_max: int
    master_epochs: tuple[tuple[int, int], ...]
    local: LocalLog


@dataclass(frozen=True)
class TransferArrived:
    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    length: int
    local: LocalLog


@dataclass(frozen=True)
class AckTick:
    local: LocalLog


Event = MasterAnswered | TransferArrived | AckTick


# ---------------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Refuse:
    """Close the connection and count nothing of it. `kind` says why (for counters and logs):
    'deposed', 'below-confirm', 'epoch-went-back', 'offset-mismatch'."""

    kind: str
    reason: str


@dataclass(frozen=True)
class Truncate:
    to: int
    no_common_epoch: bool = False  # the local log comes from a history the controller did not keep


@dataclass(frozen=True)
class StartAt:
    """An empty log begins at `offset` (the master's min offset): nothing below it is here."""

    offset: int


@dataclass(frozen=True)
class RecordEpoch:
    epoch: int
    start: int


@dataclass(frozen=True)
class Append:
    """Append the transfer's bytes at the local end."""


@dataclass(frozen=True)
class AwaitFlush:
    offset: int


@dataclass(frozen=True)
class Ack:
    offset: int


@dataclass(frozen=True)
class SetConfirm:
    offset: int


Action = Refuse | Truncate | StartAt | RecordEpoch | Append | AwaitFlush | Ack | SetConfirm


@dataclass
class SlaveCore:
    """Replication state of one broker following `master_id` of `master_epoch`."""

    master_id: int
    master_epoch: int
    flush_sync: bool
    # The last epoch the controller elected outside the SyncStateSet: only a replica whose history
    # ends before it may have its confirmed tail cut by fork repair.
    unclean_epoch: int = 0
    seen_epoch: int = 0  # the newest epoch the stream (or the repaired log) has carried

    def step(self, event: Event, now_ms: int) -> list[Action]:
        del now_ms  # no rule of the slave depends on time yet; the entry keeps the shape of the others
        match event:
            case MasterAnswered():
                return self._answered(event)
            case TransferArrived():
                return self._transfer(event)
            case AckTick(local):
                return [Ack(local.flushed_offset if self.flush_sync else local.max_offset)]
        return []

    def _answered(self, ev: MasterAnswered) -> list[Action]:
        local = ev.local
        known = max(self.master_epoch, local.last_epoch)
        if ev.master_epoch < known:
            return [
                Refuse(
                    "deposed",
                    f"the master is of epoch {ev.master_epoch}, older than epoch {known} known here",
                )
            ]
        actions: list[Action] = []
        end = local.max_offset
        cut = self._repair_point(ev)
        if isinstance(cut, Refuse):
            return [cut]
        if isinstance(cut, StartAt):
            actions.append(cut)
            end = cut.offset
        elif cut is not None:
            actions.append(cut)
            end = cut.to
        # Within the stream, epochs never go back from what the repaired log holds; a lagging slave
        # still takes older epochs' records beyond its end (the master's history).
        self.seen_epoch = (
            _last_epoch_below(local.epochs, end) if isinstance(cut, Truncate) else local.last_epoch
        )
        if self.flush_sync:
            actions.append(AwaitFlush(end))
        actions.append(Ack(end))
        return actions

    def _repair_point(self, ev: MasterAnswered) -> Truncate | StartAt | Refuse | None:
        """Where fork repair cuts the local log (None: nowhere), or why it must refuse."""
        local = ev.local
        empty = local.max_offset == local.min_offset
        if empty and not local.epochs:
            if local.max_offset < ev.master_min:
                # Retention deleted the master's start: an empty replica begins where the
                # master's log now begins (what lies below is gone from every replica that
                # follows this master, and the master's state records were carried forward).
                return StartAt(ev.master_min)
            return None
        point = last_consistent_point(
            list(local.epochs), local.max_offset, list(ev.master_epochs), ev.master_max
        )
        no_common = point < 0
        if no_common:
            point = local.min_offset
        if point < local.confirm_offset and self.unclean_epoch <= local.last_epoch:
            # Below the confirm offset lies what every in-sync replica held; a master elected cleanly
            # holds all of it, so a demand to cut there comes from a history the controller did not
            # choose. Refuse and keep retrying: the controller may name another master, or declare
            # the election unclean.
            return Refuse(
                "below-confirm",
                f"master {self.master_id} demands a cut to {point}, below the confirm "
                f"offset {local.confirm_offset}; refused",
            )
        if point < local.max_offset:
            return Truncate(point, no_common_epoch=no_common)
        return None

    def _transfer(self, ev: TransferArrived) -> list[Action]:
        local = ev.local
        if ev.epoch < self.seen_epoch:
            return [
                Refuse(
                    "epoch-went-back",
                    f"data of epoch {ev.epoch} after epoch {self.seen_epoch}: refusing a deposed master",
                )
            ]
        if ev.offset != local.max_offset:
            return [
                Refuse(
                    "offset-mismatch",
                    f"transfer at {ev.offset}, local max is {local.max_offset}; re-handshaking",
                )
            ]
        actions: list[Action] = []
        end = local.max_offset
        if ev.length:
            if ev.epoch > local.last_epoch:
                actions.append(RecordEpoch(ev.epoch, ev.epoch_start))
            actions.append(Append())
            end = ev.offset + ev.length
            if self.flush_sync:
                actions.append(AwaitFlush(end))
            actions.append(Ack(end))
        self.seen_epoch = max(self.seen_epoch, ev.epoch)
        confirm = min(ev.confirm_offset, end)
        if confirm > local.confirm_offset:
            actions.append(SetConfirm(confirm))
        return actions


def _last_epoch_below(epochs: tuple[tuple[int, int], ...], end: int) -> int:
    """The last epoch a log cut at `end` keeps (the epoch file drops entries starting at the cut)."""
    kept = [e for e, start in epochs if start < end]
    return kept[-1] if kept else 0
