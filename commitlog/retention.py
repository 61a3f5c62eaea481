"""Retention: delete whole segments, oldest first, by age or total size.

The active (last) segment is never deleted, nor a segment holding any byte at or above
`keep_from` (an offset a replica or consumer still needs). Each queue then starts at its first
unit at or above the new min offset, key index files whose entries all point below it are
deleted, and the confirm offset is raised to it if below.

The broker decides with the pure rule of `commitlog/retentionpolicy.py` over `segment_infos`,
then calls `delete_before`; `delete_expired` is the same for a caller with no floors beyond one.
"""

from __future__ import annotations

import logging
import os

from tidelog.commitlog.core import LogCore
from tidelog.commitlog.retentionpolicy import SegmentInfo

log = logging.getLogger(__name__)


def delete_expired(
    core: LogCore, now_ms: int, max_age_ms: int | None, max_total_bytes: int | None, keep_from: int | None
) -> int:
    """See `CommitLog.delete_expired`; `now_ms` is the time segment ages are measured at."""
    core.check_open()
    with core.flush_lock, core.lock:
        doomed = _count_doomed(core, now_ms, max_age_ms, max_total_bytes, keep_from)
        if not doomed:
            return core.min_offset
        return _delete_first(core, doomed)


def segment_infos(core: LogCore) -> list[SegmentInfo]:
    """The segments, oldest first, with their modification time as the newest write's upper bound."""
    core.check_open()
    with core.lock:
        return [
            SegmentInfo(s.base, s.base + s.size, int(os.fstat(s.fd).st_mtime * 1000))
            for s in core.segments.list
        ]


def delete_before(core: LogCore, offset: int) -> int:
    """Delete every segment that ends at or below `offset`, never the active one; the new min."""
    core.check_open()
    with core.flush_lock, core.lock:
        segments = core.segments.list
        doomed = 0
        for seg in segments[:-1]:
            if seg.base + core.segment_bytes > offset:
                break
            doomed += 1
        return _delete_first(core, doomed) if doomed else core.min_offset


def _delete_first(core: LogCore, doomed: int) -> int:
    """Delete the `doomed` oldest segments and move everything derived from them (locks held)."""
    for seg in core.segments.delete_first(doomed):
        log.info("retention deleted %s", seg.path)
    new_min = core.min_offset
    core.queues.trim_below(new_min)
    core.keys.drop_below(new_min)
    core.epochs.truncate_prefix(new_min)
    core.offsets.raise_confirm_to_min(new_min)
    return new_min


def _count_doomed(
    core: LogCore, now_ms: int, max_age_ms: int | None, max_total_bytes: int | None, keep_from: int | None
) -> int:
    """How many of the oldest segments may go."""
    segments = core.segments.list
    total = sum(s.size for s in segments)
    doomed = 0
    for seg in segments[:-1]:
        if keep_from is not None and seg.base + core.segment_bytes > keep_from:
            break
        old = max_age_ms is not None and now_ms - int(os.fstat(seg.fd).st_mtime * 1000) > max_age_ms
        big = max_total_bytes is not None and total > max_total_bytes
        if not (old or big):
            break
        doomed += 1
        total -= seg.size
    return doomed
