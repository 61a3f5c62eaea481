"""The segment files of the commit log: naming, opening, positional reads and writes, cutting.

A physical offset is a byte position in the run of fixed-size segment files named by their start
offset (commitlog/FORMAT.md "Segments"). `SegmentFiles` owns the open file descriptors and the
segment list; callers hold the log's lock around anything that changes the list.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from tidelog.commitlog.epochs import fsync_dir
from tidelog.commitlog.fileio import pwrite_all
from tidelog.errors import ConfigError, CorruptRecordError, DataUnavailableError
from tidelog.invariants import require
from tidelog.private import open_private, private_dir


class Segment:
    __slots__ = ("base", "path", "fd", "size")

    def __init__(self, base: int, path: str, fd: int, size: int) -> None:
        self.base = base
        self.path = path
        self.fd = fd
        self.size = size  # bytes of the segment in use (segment_bytes once closed by a blank)


#: A run of bytes for one segment: (segment base, physical offset of its first byte, start and end
#: in the caller's buffer, whether it ends with the blank marker that closes the segment).
Span = tuple[int, int, int, int, bool]


def segment_name(base: int) -> str:
    return f"{base:020d}"


class SegmentFiles:
    """The open segments of one log, oldest first, and the file operations on them."""

    def __init__(self, directory: str, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.list: list[Segment] = []

    def __len__(self) -> int:
        return len(self.list)

    def open_existing(self) -> None:
        """Open every segment file in the directory, refusing misaligned or missing segments."""
        private_dir(self.directory)
        names = sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 20)
        for name in names:
            base = int(name)
            path = os.path.join(self.directory, name)
            if base % self.segment_bytes:
                raise ConfigError(
                    f"segment {path} does not start at a multiple of segment_bytes="
                    f"{self.segment_bytes}; was the segment size changed?"
                )
            if self.list and base != self.list[-1].base + self.segment_bytes:
                raise CorruptRecordError(
                    path, self.list[-1].base + self.segment_bytes, "a segment is missing before this one"
                )
            fd = os.open(path, os.O_RDWR)
            self.list.append(Segment(base, path, fd, os.fstat(fd).st_size))

    def close_all(self) -> None:
        for seg in self.list:
            os.close(seg.fd)
        self.list.clear()

    # ------------------------------------------------------------------ lookup

    def min_offset(self, if_empty: int) -> int:
        return self.list[0].base if self.list else if_empty

    def index(self, offset: int) -> int:
        return (offset - self.list[0].base) // self.segment_bytes

    def at(self, offset: int) -> Segment:
        """The segment holding `offset` (which must be at or above the first segment's base)."""
        return self.list[self.index(offset)]

    def pread(self, offset: int, n: int) -> tuple[bytes, Segment]:
        """Exactly `n` bytes at `offset` (within one segment), or DataUnavailableError."""
        seg = self.at(offset)
        data = os.pread(seg.fd, n, offset - seg.base)
        if len(data) != n:
            raise DataUnavailableError(f"{seg.path} holds {len(data)} of {n} bytes at offset {offset}")
        return data, seg

    def unflushed(self, flushed: int) -> list[Segment]:
        """The segments holding bytes at or above `flushed`."""
        return [s for s in self.list if s.base + s.size > flushed]

    # ------------------------------------------------------------------ writes

    def write_chunk(self, base: int, start: int, data: bytes | memoryview, closes: bool) -> None:
        """Write bytes at `start` of segment `base`; a chunk that ends with a blank marker closes
        the segment, whose file is then extended to its full size (a hole after the marker)."""
        seg = self._for_write(base)
        if data:
            pwrite_all(seg.fd, data, start - base)
        seg.size = start - base + len(data)
        if closes:
            os.ftruncate(seg.fd, self.segment_bytes)
            seg.size = self.segment_bytes

    def write_spans(self, spans: Iterable[Span], data: bytes) -> None:
        """Write each span's bytes `data[buf_from:buf_to]` at its place (see `Span`)."""
        with memoryview(data) as mv:
            for base, start, buf_from, buf_to, closes in spans:
                self.write_chunk(base, start, mv[buf_from:buf_to], closes)

    def _for_write(self, base: int) -> Segment:
        if self.list and self.list[-1].base == base:
            return self.list[-1]
        require(
            not self.list or base == self.list[-1].base + self.segment_bytes,
            f"{self.directory}: a new segment at {base} does not follow the last one",
        )
        path = os.path.join(self.directory, segment_name(base))
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        seg = Segment(base, path, fd, 0)
        self.list.append(seg)
        fsync_dir(self.directory)  # the new file's name must survive a crash
        return seg

    def start_empty(self, base: int) -> None:
        """Replace the (empty) segment files by one empty segment at `base`: an empty log that
        begins there (a replica joining a master whose retention deleted its start)."""
        for seg in self.list:
            os.close(seg.fd)
            os.unlink(seg.path)
        self.list.clear()
        self._for_write(base)

    @staticmethod
    def sync(segs: Iterable[Segment]) -> None:
        for seg in segs:
            os.fdatasync(seg.fd)

    # ------------------------------------------------------------------ cutting

    def cut_at(self, end: int) -> None:
        """Make the files end exactly at `end` (recovery: drop a torn tail and any later segment)."""
        removed = False
        while self.list and self.list[-1].base > end:
            seg = self.list.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
            removed = True
        if self.list and self.list[-1].base + self.segment_bytes > end:
            seg = self.list[-1]
            keep = end - seg.base
            if seg.size != keep:
                os.ftruncate(seg.fd, keep)
                os.fsync(seg.fd)
                seg.size = keep
        if removed:
            fsync_dir(self.directory)

    def truncate_at(self, offset: int) -> None:
        """Durably drop every byte at and beyond `offset` (which lies in an existing segment)."""
        idx = self.index(offset)
        while len(self.list) > idx + 1:
            seg = self.list.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
        seg = self.list[idx]
        os.ftruncate(seg.fd, offset - seg.base)
        os.fsync(seg.fd)
        seg.size = offset - seg.base
        fsync_dir(self.directory)

    def delete_first(self, count: int) -> list[Segment]:
        """Close and delete the `count` oldest segments; returns them (their files are gone)."""
        doomed = self.list[:count]
        for seg in doomed:
            os.close(seg.fd)
            os.unlink(seg.path)
        del self.list[:count]
        fsync_dir(self.directory)
        return doomed
