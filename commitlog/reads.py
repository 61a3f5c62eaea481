"""Reads: by queue offset (clients and the broker's indexes), by physical offset, by store time,
and raw chunks of whole records for replication.

Reads by queue offset never return a record that ends past the confirm offset unless asked to
(`confirmed_only=False`, for the broker's own indexes); every record read is CRC-checked, so
damage that recovery did not scan is an error, never a silent gap.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import walk
from tidelog.commitlog.consumequeue import ConsumeQueue, check_topic_queue
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.segments import Segment
from tidelog.errors import (
    CorruptRecordError,
    DataUnavailableError,
    InvalidArgumentError,
    OffsetBelowRetentionError,
)

_NO_LIMIT = 1 << 62
_RUN_UNITS = 256  # consume-queue units fetched at once while finding a run


def read(
    core: LogCore,
    topic: str,
    queue_id: int,
    queue_offset: int,
    max_count: int,
    max_bytes: int | None,
    confirmed_only: bool,
) -> list[rec.StoredMessage]:
    """See `CommitLog.read`."""
    core.check_open()
    check_topic_queue(topic, queue_id)
    if not isinstance(queue_offset, int) or queue_offset < 0:
        raise InvalidArgumentError(f"queue offset must be a non-negative integer, not {queue_offset!r}")
    if not isinstance(max_count, int) or max_count < 1:
        raise InvalidArgumentError(f"max_count must be a positive integer, not {max_count!r}")
    cq = core.queues.get(topic, queue_id)
    if cq is None:
        return []
    cq.check_readable(queue_offset)
    end = min(
        cq.confirmed_end(core.offsets.confirm) if confirmed_only else cq.next_offset, queue_offset + max_count
    )
    out: list[rec.StoredMessage] = []
    budget = max_bytes if max_bytes is not None else _NO_LIMIT
    i = queue_offset
    while i < end:
        run_end, span = _contiguous_run(core, cq, i, end, budget)
        left = _decode_run(core, cq, i, span, budget, out)
        if left is None:
            return out
        budget = left
        i = run_end
    return out


def read_encoded(
    core: LogCore, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int
) -> tuple[bytes, int]:
    """See `CommitLog.read_encoded`: the bytes of whole confirmed records, at least one when any
    is confirmed, within `max_bytes` otherwise."""
    core.check_open()
    check_topic_queue(topic, queue_id)
    if not isinstance(queue_offset, int) or queue_offset < 0 or max_count < 1 or max_bytes < 1:
        raise InvalidArgumentError("a read takes a non-negative offset and positive limits")
    cq = core.queues.get(topic, queue_id)
    if cq is None:
        return b"", 0
    cq.check_readable(queue_offset)
    end = min(cq.confirmed_end(core.offsets.confirm), queue_offset + max_count)
    parts: list[bytes] = []
    budget = max_bytes
    i = queue_offset
    while i < end and budget > 0:
        run_end, span = _contiguous_run(core, cq, i, end, budget)
        phys = cq.unit(i)[0]
        if span > budget:
            if run_end - i == 1 and parts:
                break  # the next record would overrun the budget: it starts the next read
            if run_end - i > 1:
                run_end -= 1
                span -= cq.unit(run_end)[1]
        data, seg = core.segments.pread(phys, span)
        _check_run(cq, data, seg.path, phys, i, run_end - i)
        parts.append(data)
        budget -= span
        i = run_end
    return b"".join(parts), i - queue_offset


def _check_run(cq: ConsumeQueue, data: bytes, path: str, phys: int, first: int, count: int) -> None:
    """The run's bytes are `count` intact records, the first one the record the index names.
    Damage names the size the index gives the damaged record, so that the replica can ask for a
    copy of exactly it (`Replica.on_corrupt`)."""
    try:
        starts = walk(data, path, phys)
    except CorruptRecordError as exc:
        sizes = {p: size for p, size, _ in (cq.unit(q) for q in range(first, first + count))}
        raise CorruptRecordError(path, exc.offset, exc.reason, size=sizes.get(exc.offset)) from None
    if len(starts) != count:
        raise CorruptRecordError(
            path, phys, f"the index names {count} records here, the log holds {len(starts)}"
        )
    h = rec.decode_header(data, 0)
    if h.topic != cq.topic or h.queue_id != cq.queue_id or h.queue_offset != first:
        raise CorruptRecordError(path, phys, "index points at another queue's record")


def _contiguous_run(core: LogCore, cq: ConsumeQueue, i: int, end: int, budget: int) -> tuple[int, int]:
    """Queue offsets [i, run_end) whose records lie back to back in one segment (read in one
    pread), and their bytes; at least one record, more only while within `budget`."""
    # this unit and the next (queues interleave: most runs are one record), then larger batches
    units, at = cq.units(i, min(end, i + 2)), i  # units[0] is queue offset `at`
    phys, size, _ = units[0]
    if phys < core.min_offset:
        raise OffsetBelowRetentionError(i, cq.min_offset, what=f"queue offset of {cq.topic}/{cq.queue_id}")
    run_end = i + 1
    span = size
    seg_end = phys - phys % core.segment_bytes + core.segment_bytes
    while run_end < end and span < budget:
        if run_end - at == len(units):
            units, at = cq.units(run_end, min(end, run_end + _RUN_UNITS)), run_end
        nphys, nsize, _ = units[run_end - at]
        if nphys != phys + span or nphys + nsize > seg_end:
            break
        span += nsize
        run_end += 1
    return run_end, span


def _decode_run(
    core: LogCore, cq: ConsumeQueue, first: int, span: int, budget: int, out: list[rec.StoredMessage]
) -> int | None:
    """Check and decode the run of records starting at queue offset `first` into `out`; returns
    the budget left, or None once a record did not fit (the read ends there)."""
    phys = cq.unit(first)[0]
    data, seg = core.segments.pread(phys, span)
    pos = 0
    i = first
    while pos < span:
        kind, rsize, reason = rec.check_at(data, pos)
        if kind != rec.VALID:
            raise CorruptRecordError(
                seg.path, phys + pos, reason or "no record where the index points", size=cq.unit(i)[1]
            )
        m = rec.decode(data, pos)
        if m.topic != cq.topic or m.queue_id != cq.queue_id or m.queue_offset != i:
            raise CorruptRecordError(seg.path, phys + pos, "index points at another queue's record")
        if out and budget - m.size < 0:
            return None
        budget -= m.size
        out.append(m)
        pos += rsize
        i += 1
    return budget


def first_stored_at(lo: int, hi: int, timestamp_ms: int, store_ts_at: Callable[[int], int]) -> int:
    """The first offset in [lo, hi) whose store time is at or after `timestamp_ms` (hi: none), by
    binary search: store times within a queue do not go down (the master stamps them as it
    appends). `store_ts_at(i)` reads the store time of offset i."""
    return bisect.bisect_left(range(lo, hi), timestamp_ms, key=store_ts_at) + lo


def offset_for_time(core: LogCore, topic: str, queue_id: int, timestamp_ms: int) -> int:
    """See `CommitLog.offset_for_time`."""
    core.check_open()
    lo, _, hi = core.queues.offsets(topic, queue_id, core.offsets.confirm)

    def store_ts_at(i: int) -> int:
        try:
            got = read(core, topic, queue_id, i, 1, None, True)
        except OffsetBelowRetentionError:
            return -1  # retention took it during the search: it was older than what stays
        return got[0].store_ts if got else timestamp_ms  # confirm lowered meanwhile (fork repair)

    return first_stored_at(lo, hi, timestamp_ms, store_ts_at)


def read_at(core: LogCore, phys_offset: int) -> rec.StoredMessage:
    """See `CommitLog.read_at`."""
    core.check_open()
    if phys_offset < core.min_offset:
        raise OffsetBelowRetentionError(phys_offset, core.min_offset)
    if phys_offset >= core.offsets.max:
        raise InvalidArgumentError(f"offset {phys_offset} is at or beyond the max offset {core.offsets.max}")
    head, seg = core.segments.pread(phys_offset, 8)
    size, magic = rec.BLANK.unpack(head)
    if magic != rec.MAGIC:
        raise InvalidArgumentError(f"offset {phys_offset} is not the start of a record")
    data, seg = core.segments.pread(phys_offset, size)
    kind, _, reason = rec.check_at(data, 0)
    if kind != rec.VALID:
        raise CorruptRecordError(seg.path, phys_offset, reason)
    return rec.decode(data)


class RawSpan(NamedTuple):
    """Where a chunk of whole records lies in its segment file, found without reading it."""

    fd: int
    position: int  # in the segment file
    length: int
    next_offset: int  # the physical offset after the chunk


def _raw_start(core: LogCore, phys_offset: int, max_bytes: int) -> tuple[Segment, int, int, int] | None:
    """The checks of a raw read: (segment, offset in it, bytes to read, bytes available up to
    the max offset), or None at or beyond the max offset."""
    core.check_open()
    if not isinstance(phys_offset, int) or phys_offset < 0 or max_bytes < 1:
        raise InvalidArgumentError("read_raw takes a non-negative offset and a positive size")
    if phys_offset >= core.offsets.max:
        return None
    if phys_offset < core.min_offset:
        raise OffsetBelowRetentionError(phys_offset, core.min_offset)
    seg = core.segments.at(phys_offset)
    in_seg = phys_offset - seg.base
    avail = min(seg.size, core.offsets.max - seg.base) - in_seg
    return seg, in_seg, min(max(max_bytes, rec.HEADER_SIZE), avail), avail


def _known_span(
    core: LogCore, seg: Segment, phys_offset: int, in_seg: int, want: int, avail: int
) -> RawSpan | None:
    if want == avail and seg.base + in_seg + avail == core.offsets.max:
        # Everything up to the max offset, which is always a record boundary, and no blank marker
        # (the max offset lies in this segment): whole records, no need to walk them.
        return RawSpan(seg.fd, in_seg, avail, core.offsets.max)
    # Where an append ended inside this segment: whole records before it. (An append that ended
    # at the segment's end closed it with a blank marker, which must be read as the 8 bytes it is.)
    known = core.boundary_in(phys_offset, min(phys_offset + want, seg.base + core.segment_bytes - 1))
    if known is not None:
        return RawSpan(seg.fd, in_seg, known - phys_offset, known)
    return None


def raw_span(core: LogCore, phys_offset: int, max_bytes: int) -> RawSpan | None:
    """See `CommitLog.raw_span`."""
    start = _raw_start(core, phys_offset, max_bytes)
    if start is None:
        return None
    seg, in_seg, want, avail = start
    return _known_span(core, seg, phys_offset, in_seg, want, avail)


def read_raw_chunk(core: LogCore, phys_offset: int, max_bytes: int) -> tuple[bytes, int]:
    """See `CommitLog.read_raw_chunk`."""
    start = _raw_start(core, phys_offset, max_bytes)
    if start is None:
        return b"", phys_offset
    seg, in_seg, want, avail = start
    span = _known_span(core, seg, phys_offset, in_seg, want, avail)
    if span is not None:
        data = os.pread(seg.fd, span.length, in_seg)
        if len(data) == span.length:
            return data, span.next_offset
    # No known boundary in reach (or a short file, which the walk reports): walk the records.
    return _walk_chunk(seg, core.segment_bytes, os.pread(seg.fd, want, in_seg), phys_offset, in_seg)


def _walk_chunk(
    seg: Segment, segment_bytes: int, data: bytes, phys_offset: int, in_seg: int
) -> tuple[bytes, int]:
    """The whole records (or the blank marker) at the start of `data`, found record by record."""
    pos = 0
    while pos + 8 <= len(data):
        size, magic = rec.BLANK.unpack_from(data, pos)
        if magic == rec.BLANK_MAGIC:
            return data[: pos + rec.BLANK_SIZE], seg.base + segment_bytes
        if magic != rec.MAGIC:
            raise CorruptRecordError(
                seg.path,
                phys_offset + pos,
                f"bad magic 0x{magic:08x}" + (" (not a record boundary?)" if pos == 0 else ""),
            )
        if pos + size > len(data):
            if pos == 0:  # a single record larger than max_bytes: return it whole
                return _whole_record(seg.fd, seg.path, phys_offset, in_seg, size)
            break
        pos += size
    return data[:pos], phys_offset + pos


def _whole_record(fd: int, path: str, phys_offset: int, in_seg: int, size: int) -> tuple[bytes, int]:
    data = os.pread(fd, size, in_seg)
    if len(data) != size:
        raise DataUnavailableError(f"{path} is short at offset {phys_offset}")
    return data, phys_offset + size
