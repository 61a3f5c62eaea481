"""Scans of a replica's commit log: every record's length, magic and CRC, offline (`tide broker
verify`) or, a chunk at a time, in a running log (`scrub_chunk`, the broker's scrub).

A damaged record's length cannot be trusted, so the scan resynchronises on the next offset that
holds a valid record claiming to live at that very offset; the bytes in between are the damaged
range, which is exactly what a repair must copy from another replica. Reads the segment files
only (the broker may be stopped); changes nothing.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.commitlog import batch
from tidelog.commitlog import record as rec
from tidelog.commitlog.core import LogCore
from tidelog.errors import CorruptRecordError


@dataclass(frozen=True)
class Damage:
    path: str
    start: int  # physical offset of the first damaged byte
    end: int  # physical offset of the next valid record (or the end of the segment's data)
    reason: str


@dataclass(frozen=True)
class Scan:
    segments: int
    records: int
    bytes: int
    damage: list[Damage]


def _segments(directory: str) -> list[tuple[int, str]]:
    cl = os.path.join(directory, "commitlog")
    if not os.path.isdir(cl):
        raise FileNotFoundError(f"{directory} holds no commit log (no {cl})")
    return sorted((int(n), os.path.join(cl, n)) for n in os.listdir(cl) if n.isdigit() and len(n) == 20)


def _resync(mm: mmap.mmap | bytes, pos: int, base: int) -> int:
    """The next position after `pos` holding a valid record that says it lives there."""
    magic = rec.MAGIC.to_bytes(4, "big")
    at = pos + 1
    while True:
        found = mm.find(magic, at + 4)
        if found < 0:
            return len(mm)
        start = found - 4
        kind, _, _ = rec.check_at(mm, start)
        if kind == rec.VALID and rec.decode_header(mm, start).phys_offset == base + start:
            return start
        at = found - 3


def segment_bytes(directory: str) -> int:
    """The bytes `scan` will read: a progress bar's total."""
    return sum(os.path.getsize(path) for _, path in _segments(directory))


def scan(directory: str, on_segment: Callable[[int], None] | None = None) -> Scan:
    """Every segment of `directory`, in order; `on_segment(size)` after each (a progress bar's step)."""
    segs = _segments(directory)
    damage: list[Damage] = []
    records = total = 0
    for i, (base, path) in enumerate(segs):
        size = os.path.getsize(path)
        if size == 0:
            continue
        last = i == len(segs) - 1
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
            pos = 0
            while pos < size:
                kind, rsize, reason = rec.check_at(mm, pos)
                if kind == rec.VALID:
                    records += 1
                    total += rsize
                    pos += rsize
                    continue
                if kind == rec.IS_BLANK and pos + rsize == size:
                    break
                if kind == rec.END and (last or not any(mm[pos:size])):
                    break  # the end of the written data (the hole after a blank, or the log's tail)
                nxt = _resync(mm, pos, base)
                why = reason or "blank marker in the wrong place"
                damage.append(Damage(path, base + pos, base + nxt, why))
                pos = nxt
        if on_segment is not None:
            on_segment(size)
    return Scan(len(segs), records, total, damage)


def scrub_chunk(core: LogCore, offset: int, max_bytes: int) -> tuple[int, Damage | None]:
    """Check the records of a running log from `offset` (a record boundary; below the log's start:
    its start) for about `max_bytes`, never past the stable end (min(flushed, confirm): what no
    append, truncation or torn tail changes): (where the next chunk starts, the damage met or None).
    At the stable end it returns `offset` itself. A damaged record whose length is intact is
    reported as exactly that record (a repair copies whole records); one whose header is broken
    as the bytes up to the next valid record in the chunk, or to the chunk's end."""
    with core.lock:  # the segment list: retention may drop the segment meanwhile
        core.check_open()
        offset = max(offset, core.min_offset)
        stable = min(core.offsets.flushed, core.offsets.confirm)
        if offset >= stable:
            return offset, None
        seg = core.segments.at(offset)
        seg_end = seg.base + core.segment_bytes
        # at least a header: a record's length says how much more to read
        want = min(max(max_bytes, rec.BLANK_SIZE), stable - offset, seg_end - offset)
        data = os.pread(seg.fd, want, offset - seg.base)
    # where this read stopped short of what is settled: a header cut there is the chunk's end,
    # not damage (the next chunk starts at that record)
    cut_short = offset + len(data) < min(stable, seg_end)
    pos = _whole_and_sound(data)
    while pos < len(data):
        if len(data) - pos < rec.HEADER_SIZE and cut_short and pos:
            break
        if len(data) - pos >= 8:
            size, magic = rec.BLANK.unpack_from(data, pos)
            if magic == rec.BLANK_MAGIC:
                return seg_end, None  # the rest of the segment is its blank tail
            if magic == rec.MAGIC and pos + size > len(data) and size <= seg_end - (offset + pos):
                if pos:
                    break  # the next chunk starts at this record
                with core.lock:
                    data = os.pread(seg.fd, size, offset - seg.base)  # one record over max_bytes
                continue
        kind, rsize, reason = rec.check_at(data, pos)
        if kind == rec.VALID:
            pos += rsize
            continue
        why = reason or ("no record below the flushed offset" if kind == rec.END else "misplaced blank")
        size, magic = rec.BLANK.unpack_from(data, pos) if len(data) - pos >= 8 else (0, 0)
        if magic == rec.MAGIC and 0 < size <= len(data) - pos:
            end = pos + size
        else:
            end = _resync(data, pos, offset) if len(data) - pos >= 8 else len(data)
        return offset + end, Damage(seg.path, offset + pos, offset + end, why)
    return offset + pos, None


def _whole_and_sound(data: bytes) -> int:
    """How much of `data`, from its start, is whole records that pass their checks: the fast path
    of `scrub_chunk` (headers stepped over here, CRCs checked by `batch.walk`, natively when the
    extension is built); 0 when any of them fails (the record-by-record path then finds where)."""
    pos, n = 0, len(data)
    while pos + rec.HEADER_SIZE <= n:
        size, magic = rec.BLANK.unpack_from(data, pos)
        if magic != rec.MAGIC or size < rec.HEADER_SIZE or pos + size > n:
            break
        pos += size
    if pos:
        try:
            batch.walk(memoryview(data)[:pos], "scrub", 0)
        except CorruptRecordError:
            return 0
    return pos
