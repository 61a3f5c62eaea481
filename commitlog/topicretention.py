"""Per-topic retention in one shared log: the rule as pure functions (time passed in).

Theory of operation (docs/ARCHITECTURE.md §6.4)
------------------------------------------------
Every topic of a broker set shares one physical log, so segments still go by the broker's rule
(`commitlog/retentionpolicy.py`). A topic's own `retention_ms` (stored with the topic by the
controller; 0 means the broker's) changes what its *readers* see, and what the broker's rule
may delete:

- **shorter** than the broker's `retention_ms` (or the broker keeps by age forever, 0): the
  topic's consume queues are *cut* below `cut_below` — the end of the longest run of oldest
  segments whose newest write is older than the topic's retention. Every record there arrived
  before that newest write, so it is older than the topic's retention: nothing younger is ever
  cut. A record is cut at most one segment's worth of time late (the segment it shares with
  younger records keeps it); a cheap bound, since no record's own store time is read. Its bytes
  stay until the broker's rule deletes their segment.
- **longer** than the broker's: a *floor* named `topic:<name>` for the broker's rule — the first
  of the topic's records in the oldest segment whose newest write is within the topic's
  retention. A segment holding a record younger than the topic's retention has a newest write
  younger still, so it lies at or after that segment and stays (and, the rule deleting only a
  prefix, so does everything after it). The floor holds against `retention_bytes` too: a topic
  that asks for days keeps its days.
- **equal**, or 0: nothing of its own.

`limit` caps every cut at the log's max offset as read *before* the segments' times: a record
appended after that read lies at or above it, so a cut never reaches a record whose arrival the
times did not see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .retentionpolicy import SegmentInfo

__all__ = ["TopicPlan", "expired_end", "plan", "young_start"]


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """`cut_below`: topic -> physical offset below which its queue units go. `young_from`: topic
    -> physical offset from which segments may hold its records younger than its retention
    (its first record at or above it is its floor)."""

    cut_below: Mapping[str, int] = field(default_factory=dict)
    young_from: Mapping[str, int] = field(default_factory=dict)


def expired_end(segments: Sequence[SegmentInfo], now_ms: int, retention_ms: int, limit: int) -> int:
    """The end of the longest run of oldest segments whose newest write is more than
    `retention_ms` before `now_ms`, capped at `limit` (0: no such segment)."""
    end = 0
    for seg in segments:
        if now_ms - seg.newest_ms <= retention_ms:
            break
        end = seg.end
    return min(end, limit)


def young_start(segments: Sequence[SegmentInfo], now_ms: int, retention_ms: int) -> int | None:
    """The base of the oldest segment whose newest write is within `retention_ms` of `now_ms`
    (None: every segment is older)."""
    for seg in segments:
        if now_ms - seg.newest_ms <= retention_ms:
            return seg.base
    return None


def plan(
    segments: Sequence[SegmentInfo],
    now_ms: int,
    broker_retention_ms: int,
    topics: Mapping[str, int],
    limit: int,
) -> TopicPlan:
    """What each topic's own retention (`topics`: name -> ms, 0 = the broker's) asks of this log.

    `broker_retention_ms` 0 means the broker keeps by age forever: every topic retention is then
    shorter. Topics whose retention asks nothing are absent from both maps."""
    cut: dict[str, int] = {}
    young: dict[str, int] = {}
    for topic, retention in sorted(topics.items()):
        if retention <= 0 or retention == broker_retention_ms:
            continue
        if broker_retention_ms == 0 or retention < broker_retention_ms:
            end = expired_end(segments, now_ms, retention, limit)
            if end > 0:
                cut[topic] = end
        else:
            start = young_start(segments, now_ms, retention)
            if start is not None:
                young[topic] = start
    return TopicPlan(cut, young)
