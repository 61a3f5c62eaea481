"""The commit log's offsets and the rules between them.

`max` is where the next record goes, `flushed` what fdatasync covers, `confirm` what readers may
see (set by the HA layer from replica acks) and `cq_durable` what the consume-queue files cover.
Each rule is checked in one place, with `require` (a violation is a bug, see tidelog/invariants.py):

- the confirm offset never passes the max offset, and only grows through `advance_confirm`;
- the flushed offset never passes the max offset (`mark_flushed`);
- after retention the min offset is not above the confirm offset (`raise_confirm_to_min`).

Truncation (fork repair) is the one legitimate way down for every offset: `lower_to` says so.
Recovery sets them once with `restore`.
"""

from __future__ import annotations

from tidelog.invariants import require


class Offsets:
    """The four offsets of one log; `where` names the log in violation messages."""

    __slots__ = ("where", "max", "flushed", "confirm", "cq_durable")

    def __init__(self, where: str) -> None:
        self.where = where
        self.max = 0
        self.flushed = 0
        self.confirm = 0
        self.cq_durable = 0

    def restore(self, end: int, confirm: int) -> None:
        """After recovery: everything below `end` is on disk and indexed."""
        self.max = self.flushed = self.cq_durable = end
        self.confirm = confirm

    def advance_confirm(self, value: int) -> None:
        """The owner's confirm offset: derived from replica acks, which never exceed what this log
        holds, and never going back (truncation and retention move it themselves)."""
        require(
            value <= self.max, f"{self.where}: confirm offset {value} would pass the max offset {self.max}"
        )
        require(
            value >= self.confirm,
            f"{self.where}: confirm offset would go back from {self.confirm} to {value}",
        )
        self.confirm = value

    def mark_flushed(self, target: int) -> None:
        """fdatasync covered every byte below `target`."""
        require(target <= self.max, f"{self.where}: flushed offset {target} would pass the max {self.max}")
        self.flushed = target

    def lower_to(self, cut: int) -> None:
        """Truncation at `cut`: the log ends there, and every offset past it comes down with it.
        The only place the confirm offset goes back (fork repair drops records a diverged master
        wrote, confirmed or not; the HA layer confirms again from the replicas' acks)."""
        self.max = cut
        self.confirm = min(self.confirm, cut)
        self.flushed = min(self.flushed, cut)
        self.cq_durable = min(self.cq_durable, cut)

    def raise_confirm_to_min(self, new_min: int) -> None:
        """Retention moved the min offset to `new_min`: nothing below it can be read, so the
        confirm offset is at least there (never past the max offset)."""
        self.confirm = max(self.confirm, min(new_min, self.max))
        require(
            new_min <= self.confirm,
            f"{self.where}: after retention min {new_min} is above confirm {self.confirm} (max {self.max})",
        )
