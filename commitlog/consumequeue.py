"""Consume queues: the per-(topic, queue) index from queue offset to commit-log position.

A consume queue is a directory `consumequeue/<topic>/<queue id>/` of files named by the queue
offset of their first unit (20 digits). A unit is 20 bytes, little-endian: physical offset (u64),
record size (u32), tags hash (u64). Unit i of a queue is queue offset `base + i`.

The units also live in memory (three arrays), so reads and "how far is confirmed" are array
look-ups and binary searches; the files are the durable copy. Files are written with plain
writes after each batch and fsync'ed only at checkpoints: a consume queue can always be rebuilt
from the commit log, and recovery re-dispatches everything past the checkpointed offset.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import struct
from array import array

from tidelog.commitlog.fileio import write_all
from tidelog.errors import CorruptRecordError, InvalidArgumentError, OffsetBelowRetentionError

UNIT = struct.Struct("<QIQ")
UNIT_SIZE = UNIT.size  # 20
TOPIC_RE = re.compile(r"^[A-Za-z0-9_.%\-]{1,127}$")
MAX_QUEUE_ID = 65535


@functools.lru_cache(maxsize=64)
def _units_struct(n: int) -> struct.Struct:
    return struct.Struct("<" + "QIQ" * n)


INTERNAL_TOPIC_PREFIX = "%"  # group offsets, topic markers, ledgers: never a user's topic


def user_topic_problem(name: object) -> str | None:
    """Why `name` cannot be a user's topic, or None: the one rule the controller (creating it) and
    the brokers (serving it) share, so no topic is created that brokers would then refuse."""
    if not isinstance(name, str) or not TOPIC_RE.match(name) or name in (".", ".."):
        return f"invalid topic name {name!r}: use 1-127 of A-Z a-z 0-9 _ . % - (not '.' or '..')"
    if name.startswith(INTERNAL_TOPIC_PREFIX):
        return f"invalid topic name {name!r}: names starting with {INTERNAL_TOPIC_PREFIX} are tidelog's own"
    return None


def check_topic_queue(topic: str, queue_id: int) -> None:
    if not isinstance(topic, str) or not TOPIC_RE.match(topic) or topic in (".", ".."):
        raise InvalidArgumentError(f"invalid topic name {topic!r}: use 1-127 of A-Z a-z 0-9 _ . % -")
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id <= MAX_QUEUE_ID:
        raise InvalidArgumentError(f"invalid queue id {queue_id!r}: must be 0..{MAX_QUEUE_ID}")


class ConsumeQueue:
    def __init__(self, directory: str, topic: str, queue_id: int, units_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        self._per_file = units_per_file
        self.base = 0  # queue offset of phys[0]
        self.phys = array("Q")
        self.sizes = array("I")
        self.tags = array("Q")
        self._files: list[int] = []  # first queue offset of each file, ascending
        self._fd: int | None = None  # the last file, open for appends
        self._written = 0  # units [0, _written) are in files
        self._dirty: set[int] = set()
        self._load()

    # --- load ---

    def _load(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        names = sorted(n for n in os.listdir(self.dir) if n.isdigit() and len(n) == 20)
        for i, name in enumerate(names):
            start = int(name)
            if self._files and start != self.base + len(self.phys):
                # A gap between files means units were lost: drop this file and later ones;
                # the commit log re-dispatches their records.
                self._unlink_names(names[i:])
                break
            if not self._files:
                self.base = start
            self._files.append(start)
            with open(os.path.join(self.dir, name), "rb") as f:
                raw = f.read()
            usable = len(raw) - len(raw) % UNIT_SIZE
            complete = usable == len(raw)
            for phys, size, tag in UNIT.iter_unpack(raw[:usable]):
                if size == 0:
                    complete = False  # unwritten tail
                    break
                self.phys.append(phys)
                self.sizes.append(size)
                self.tags.append(tag)
            if not complete:
                self._unlink_names(names[i + 1 :])
                break
        self._written = len(self.phys)
        self._trim_files_to(self._written)

    def _unlink_names(self, names: list[str]) -> None:
        for name in names:
            os.unlink(os.path.join(self.dir, name))

    # --- offsets ---

    @property
    def next_offset(self) -> int:
        return self.base + len(self.phys)

    @property
    def min_offset(self) -> int:
        return self.base

    def confirmed_end(self, confirm_offset: int) -> int:
        """The queue offset just past the last unit whose record ends at or below `confirm_offset`."""
        i = bisect.bisect_left(self.phys, confirm_offset)
        # unit i-1 starts below confirm; it counts only if it also ends at or below it
        while i > 0 and self.phys[i - 1] + self.sizes[i - 1] > confirm_offset:
            i -= 1
        return self.base + i

    def unit_at(self, phys_offset: int) -> tuple[int, int | None]:
        """(queue offset, physical offset) of the first unit whose record starts at or after
        `phys_offset`; (next offset, None) when none does. Units are in physical order."""
        i = bisect.bisect_left(self.phys, phys_offset)
        if i == len(self.phys):
            return self.next_offset, None
        return self.base + i, self.phys[i]

    def unit(self, queue_offset: int) -> tuple[int, int, int]:
        i = queue_offset - self.base
        return self.phys[i], self.sizes[i], self.tags[i]

    # --- dispatch ---

    def put(self, queue_offset: int, phys_offset: int, size: int, tag: int, where: str) -> None:
        """Index one record. Re-dispatching an indexed record is a no-op (rebuilds are idempotent)."""
        nxt = self.base + len(self.phys)
        if queue_offset < self.base:
            # below the queue's start (cut or retention): recovery skips those; anything else
            # sending one here disagrees with this index
            raise CorruptRecordError(
                where,
                phys_offset,
                f"queue offset {queue_offset} of {self.topic}/"
                f"{self.queue_id} is below the queue's start {self.base}",
            )
        if queue_offset < nxt:
            i = queue_offset - self.base
            if i >= 0 and self.phys[i] == phys_offset:
                return
            raise CorruptRecordError(
                where,
                phys_offset,
                f"queue offset {queue_offset} of {self.topic}/"
                f"{self.queue_id} is already taken by another record",
            )
        if queue_offset > nxt:
            if self.phys:
                raise CorruptRecordError(
                    where,
                    phys_offset,
                    f"queue offset {queue_offset} of {self.topic}/{self.queue_id} skips ahead of {nxt}",
                )
            # a replica that starts mid-stream, or a queue emptied by retention
            self._trim_files_to(0)
            self._unlink_names([f"{start:020d}" for start in self._files])
            self._files.clear()
            if self._fd is not None:
                self._dirty.discard(self._fd)
                os.close(self._fd)
                self._fd = None
            self.base = queue_offset
            self._written = 0
        self.phys.append(phys_offset)
        self.sizes.append(size)
        self.tags.append(tag)

    def extend(self, phys: list[int], sizes: list[int], tags: list[int]) -> None:
        """Index a run of records appended just now, in queue order (the append fast path)."""
        self.phys.extend(phys)
        self.sizes.extend(sizes)
        self.tags.extend(tags)

    def write_pending(self) -> None:
        """Write units not yet in files (one write per file touched)."""
        while self._written < len(self.phys):
            qoff = self.base + self._written
            if not self._files or qoff - self._files[-1] >= self._per_file:
                self._open_file(qoff)
            room = self._per_file - (qoff - self._files[-1])
            n = min(room, len(self.phys) - self._written, 4096)
            lo, hi = self._written, self._written + n
            flat = [
                v
                for unit in zip(self.phys[lo:hi], self.sizes[lo:hi], self.tags[lo:hi], strict=True)
                for v in unit
            ]
            buf = _units_struct(n).pack(*flat)
            if self._fd is None:
                raise RuntimeError(f"consume queue {self.dir}: no open file to write units to")
            try:
                write_all(self._fd, buf)
            except OSError:
                # A partial unit would shift every later one: cut the file back to whole units.
                os.ftruncate(self._fd, (qoff - self._files[-1]) * UNIT.size)
                raise
            self._dirty.add(self._fd)
            self._written += n

    def _open_file(self, start: int) -> None:
        if self._fd is not None:
            self._dirty.discard(self._fd)
            os.fsync(self._fd)
            os.close(self._fd)
        path = os.path.join(self.dir, f"{start:020d}")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._files.append(start)

    def sync(self) -> None:
        for fd in list(self._dirty):
            os.fdatasync(fd)
        self._dirty.clear()

    # --- truncation, retention and cuts ---

    def cut(self, queue_offset: int) -> None:
        """Forget every unit below `queue_offset` for good (a deleted topic's records): files that
        held only such units go now. The queue continues at its next offset; when no unit is left
        an empty file named `queue_offset` keeps that start across a restart."""
        if queue_offset <= self.base:
            return
        nxt = self.next_offset
        drop = min(queue_offset, nxt) - self.base
        del self.phys[:drop]
        del self.sizes[:drop]
        del self.tags[:drop]
        self._written = max(0, self._written - drop)
        if queue_offset >= nxt:
            if self._fd is not None:
                self._dirty.discard(self._fd)
                os.close(self._fd)
                self._fd = None
            self._unlink_names([f"{start:020d}" for start in self._files])
            self._files.clear()
            self.base = queue_offset
            self._written = 0
            self._open_file(queue_offset)  # the anchor: an empty file named by the queue's start
            return
        self.base = queue_offset
        # whole files below the cut go; the first kept one may still start below it (units the
        # owner cuts again after a restart, see broker.topics)
        while len(self._files) > 1 and self._files[1] <= queue_offset:
            os.unlink(os.path.join(self.dir, f"{self._files.pop(0):020d}"))

    def truncate_phys(self, phys_offset: int) -> None:
        """Drop units whose record starts at or after `phys_offset` (commit-log truncation)."""
        keep = bisect.bisect_left(self.phys, phys_offset)
        if keep == len(self.phys):
            return
        del self.phys[keep:]
        del self.sizes[keep:]
        del self.tags[keep:]
        self._written = min(self._written, keep)
        self._trim_files_to(keep)

    def _trim_files_to(self, count: int) -> None:
        """Make the files hold exactly units [0, count)."""
        end_qoff = self.base + count
        if self._fd is not None:
            os.close(self._fd)
            self._dirty.discard(self._fd)
            self._fd = None
        # a file starting exactly at the end stays, empty: it may be the one that records where
        # a cut queue starts
        while self._files and self._files[-1] > end_qoff:
            os.unlink(os.path.join(self.dir, f"{self._files.pop():020d}"))
        if not self._files:
            return
        last = self._files[-1]
        path = os.path.join(self.dir, f"{last:020d}")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.ftruncate(self._fd, (end_qoff - last) * UNIT_SIZE)
        self._dirty.add(self._fd)

    def trim_below(self, min_phys: int) -> None:
        """Forget units whose record lies below the log's new min offset (retention)."""
        drop = bisect.bisect_left(self.phys, min_phys)
        if drop == 0:
            return
        new_base = self.base + drop
        del self.phys[:drop]
        del self.sizes[:drop]
        del self.tags[:drop]
        self._written = max(0, self._written - drop)
        self.base = new_base
        # whole files below the new base go; the first kept file may start below it
        while len(self._files) > 1 and self._files[1] <= new_base:
            os.unlink(os.path.join(self.dir, f"{self._files.pop(0):020d}"))

    def check_readable(self, queue_offset: int) -> None:
        if queue_offset < self.base:
            raise OffsetBelowRetentionError(
                queue_offset, self.base, what=f"queue offset of {self.topic}/{self.queue_id}"
            )

    def close(self) -> None:
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
