"""Offline scan of a replica's commit log: every record's length, magic and CRC (`tide broker verify`).

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

from tidelog.commitlog import record as rec


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


def _resync(mm: mmap.mmap, pos: int, base: int) -> int:
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
