"""Which whole segments retention may delete: the rule as one pure function (time passed in).

Theory of operation (docs/ARCHITECTURE.md §6.4)
------------------------------------------------
Segments are considered oldest first, and only as a prefix: the first segment that must stay
keeps every later one too, so the log stays one run of bytes starting at its min offset. A
segment *may* go when it is expired — its newest write is older than `retention_ms`, or the log
without the segments already chosen is still larger than `retention_bytes` — and it *must* stay
when

- it is the active (last) segment: appends land there;
- any byte of it lies at or above a *floor*: an offset some reader, replica or recovery still
  needs. The floors are named (for logs and metrics) and come from the caller: the slowest
  replica's ack on a master, the master's min offset on a slave, the confirm, flushed and
  consume-queue offsets (what recovery restarts from), the named consumer groups' positions, and
  the oldest live metadata record not yet carried forward (group offsets, topic markers,
  ledgers still in use).

A segment's "newest write" is the caller's best upper bound of its newest record's arrival here
(the file's modification time): never earlier than the record's arrival, so a replica that
copied a segment later keeps it at least as long as its master does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Decision", "RetentionRules", "SegmentInfo", "decide"]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment: its bytes are [base, end); `newest_ms` bounds its newest write from above."""

    base: int
    end: int
    newest_ms: int

    @property
    def size(self) -> int:
        return self.end - self.base


@dataclass(frozen=True, slots=True)
class RetentionRules:
    """`retention_ms` / `retention_bytes`: 0 turns that rule off."""

    retention_ms: int = 0
    retention_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """Delete the `count` oldest segments; the log then starts at `new_min`.

    `held_by` says why the next segment stays: "not-expired", "active", or the name of the floor
    that holds it ("" when there is no next segment)."""

    count: int
    new_min: int
    held_by: str


def _expired(seg: SegmentInfo, now_ms: int, rules: RetentionRules, remaining: int) -> bool:
    old = rules.retention_ms > 0 and now_ms - seg.newest_ms > rules.retention_ms
    big = rules.retention_bytes > 0 and remaining > rules.retention_bytes
    return old or big


def _holding_floor(seg: SegmentInfo, floors: Mapping[str, int | None]) -> str:
    """The name of the lowest floor this segment reaches (a byte at or above it), or ""."""
    reached = [(offset, name) for name, offset in floors.items() if offset is not None and seg.end > offset]
    return min(reached)[1] if reached else ""


def decide(
    segments: Sequence[SegmentInfo],
    now_ms: int,
    rules: RetentionRules,
    floors: Mapping[str, int | None],
) -> Decision:
    """How many of the oldest `segments` (oldest first, contiguous) may be deleted now.

    A floor of None is no floor. Nothing below the returned `new_min` reaches any floor, and
    the last segment is never part of the count."""
    if not segments:
        return Decision(0, 0, "")
    remaining = sum(s.size for s in segments)
    count = 0
    held_by = "active"
    for seg in segments[:-1]:
        floor = _holding_floor(seg, floors)
        if floor:
            held_by = floor
            break
        if not _expired(seg, now_ms, rules, remaining):
            held_by = "not-expired"
            break
        count += 1
        remaining -= seg.size
    return Decision(count, segments[count].base, held_by)
