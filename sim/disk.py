"""The simulated commit log of one broker: records in memory, a flushed mark, the epoch file.

This is the model that stands in for `tidelog.commitlog` (segments, files, fsync). It keeps what
the replication rules look at and nothing else:

- records as `(start, end, epoch, mid)` in offset order (`mid`: the client's message id, so the
  checker can tell two records at one offset apart); offsets are physical, the log begins at 0;
- `flushed`: what a crash keeps for certain; records past it survive a crash only as a random
  whole prefix (a torn tail is cut by recovery's CRC scan, as `commitlog/recovery.py` does);
- `confirm` and the checkpoint's confirm (written with each flush), recovered as
  ``min(checkpoint confirm, recovered end)`` like `commitlog/recovery.py`;
- the epoch file, written atomically (it is never torn), appended through the real
  `commitlog.epochs.check_append` and cut like `EpochFile.truncate_suffix` / `truncate_after`;
- `corrupt`: starts of records whose stored bytes had a bit flipped (a read finds the CRC wrong).

Every change of the confirm offset and every truncation goes through a hook, so the checker sees
them as they happen (`sim.checker.Checker`).
"""

from __future__ import annotations

import bisect
from random import Random
from typing import Protocol

from tidelog.commitlog.epochs import check_append, with_ends


class DiskFailed(Exception):
    """A write or sync failed (a full disk, an I/O error): the broker must fail-stop."""


class DivergedError(Exception):
    """Two logs differ inside an epoch (a safety violation the checker reports)."""


class DiskHooks(Protocol):
    def on_confirm(self, disk: Disk, old: int, new: int) -> None: ...
    def on_truncate(self, disk: Disk, to: int) -> None: ...


Record = tuple[int, int, int, int]  # start, end, epoch, mid


class Disk:
    def __init__(self, owner: int, hooks: DiskHooks) -> None:
        self.owner = owner
        self.hooks = hooks
        self.recs: list[Record] = []
        self.starts: list[int] = []
        self.max = 0
        self.flushed = 0
        self.confirm = 0
        self.cp_confirm = 0
        self.epochs: list[tuple[int, int]] = []
        self.corrupt: set[int] = set()
        self.failing = False  # disk full or I/O errors: every write and sync fails

    # ------------------------------------------------------------------ reads

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    def mid_at(self, start: int) -> int | None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and self.starts[i] == start:
            return self.recs[i][3]
        return None

    def range(self, lo: int, hi: int) -> list[Record]:
        """The records starting in [lo, hi)."""
        i = bisect.bisect_left(self.starts, lo)
        j = bisect.bisect_left(self.starts, hi)
        return self.recs[i:j]

    def epoch_at(self, offset: int) -> tuple[int, int, int]:
        """(epoch, start, end) of the epoch entry holding `offset` (the last one: at the end)."""
        entries = with_ends(self.epochs, None)
        for e in reversed(entries):
            if e.start <= offset:
                return e.epoch, e.start, e.end
        return 0, 0, 2**63 - 1

    def epoch_start(self, epoch: int) -> int:
        starts = [s for e, s in self.epochs if e == epoch]
        return starts[-1] if starts else self.max

    # ------------------------------------------------------------------ writes

    def append(self, rec: Record) -> None:
        if self.failing:
            raise DiskFailed(f"broker {self.owner}: append at {rec[0]} failed")
        if rec[0] != self.max:
            raise AssertionError(f"broker {self.owner}: append at {rec[0]}, log ends at {self.max}")
        self.recs.append(rec)
        self.starts.append(rec[0])
        self.max = rec[1]

    def record_epoch(self, epoch: int, start: int) -> None:
        if self.failing:
            raise DiskFailed(f"broker {self.owner}: epoch file write failed")
        check_append(self.epochs, epoch, start)
        self.epochs.append((epoch, start))

    def flush_to(self, offset: int) -> None:
        if self.failing:
            raise DiskFailed(f"broker {self.owner}: fsync failed")
        self.flushed = max(self.flushed, min(offset, self.max))
        self.cp_confirm = self.confirm

    def set_confirm(self, offset: int) -> None:
        old = self.confirm
        if offset != old:
            self.hooks.on_confirm(self, old, offset)
            self.confirm = offset

    def truncate(self, to: int) -> None:
        """Fork repair: cut records at and past `to`, and the epoch entries starting there."""
        self.hooks.on_truncate(self, to)
        i = bisect.bisect_left(self.starts, to)
        if to < self.max and to != (self.recs[i - 1][1] if i else 0):
            # the master's records differ from ours within an epoch both logs call the same
            raise DivergedError(
                f"b{self.owner}: fork repair cuts at {to}, inside a record: this log and its master's "
                f"hold different records within the same epoch"
            )
        del self.recs[i:], self.starts[i:]
        self.max = min(self.max, to)
        self.flushed = min(self.flushed, self.max)
        self.confirm = min(self.confirm, self.max)
        self.cp_confirm = min(self.cp_confirm, self.max)
        self.epochs = [(e, s) for e, s in self.epochs if s < to]
        self.corrupt = {c for c in self.corrupt if c < to}

    def flip(self, rng: Random) -> int | None:
        """A bit flips in one stored record; returns its start."""
        if not self.recs:
            return None
        start = self.recs[rng.randrange(len(self.recs))][0]
        self.corrupt.add(start)
        return start

    def repair(self, start: int, source: Disk) -> bool:
        """Rewrite a damaged record from `source`'s copy if that copy is the same record and intact."""
        i = bisect.bisect_left(self.starts, start)
        j = bisect.bisect_left(source.starts, start)
        if (
            i < len(self.starts)
            and j < len(source.starts)
            and source.starts[j] == start
            and source.recs[j] == self.recs[i]
            and start not in source.corrupt
        ):
            self.corrupt.discard(start)
            return True
        return False

    # ------------------------------------------------------------------ crash and recovery

    def crash(self, rng: Random) -> None:
        """The process died: unsynced records survive only as a random whole prefix; a torn last
        record fails its CRC and recovery cuts it; the confirm offset comes from the checkpoint."""
        i = bisect.bisect_left(self.starts, self.flushed)
        unsynced = len(self.recs) - i
        keep = i + (rng.randint(0, unsynced) if unsynced else 0)
        end = self.recs[keep - 1][1] if keep else 0
        del self.recs[keep:], self.starts[keep:]
        self.max = end
        self.flushed = end
        self.confirm = min(self.cp_confirm, end)
        self.cp_confirm = self.confirm
        # EpochFile.truncate_after: an entry starting exactly at the end is kept
        self.epochs = [(e, s) for e, s in self.epochs if s <= end]
        self.corrupt = {c for c in self.corrupt if c < end}
