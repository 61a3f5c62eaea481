"""Consume queues: the per-(topic, queue) index from queue offset to commit-log position.

A consume queue is a directory `consumequeue/<topic>/<queue id>/` of files named by the queue
offset of their first unit (20 digits). A unit is 20 bytes, little-endian: physical offset (u64),
record size (u32), tags hash (u64). Unit i of a queue is queue offset `base + i`.

Units already in files are read from the files (`pread`); only units not yet written live in
memory, in a tail of three arrays that `write_pending` moves to the files at checkpoints. Memory
per queue is that tail plus a list of file names, whatever the queue holds, and opening a queue
reads no unit but the last of each file. Binary searches (confirmed end, unit at a physical
offset, truncation, retention) run over files and tail alike: units are in physical order.
Files are fsync'ed only at checkpoints: a consume queue can always be rebuilt from the commit
log, and recovery re-dispatches everything past the checkpointed offset.

A per-queue lock orders readers (which take no log lock) against the flusher moving the tail to
the files and against cuts, so a reader never sees a unit twice or a closed descriptor.

Every descriptor a queue opens (the append descriptor of its last file, the read descriptors of
sealed ones) is counted by the log's `DescriptorPool`: past its bound, the descriptors of the
least recently used queues are closed and opened again on their next use. With 10,000 active
queues a broker then holds a bounded number of descriptors, not 10,000+. A queue remembers which
of its files hold units not yet synced by the file, not by the descriptor, so a descriptor closes
at once, and a checkpoint's writes into a queue whose descriptor is closed while the bound is
reached go through a descriptor opened for that write alone: 10,000 active queues cost a
checkpoint 10,000 small writes, not 10,000 evictions of other queues. Syncing many queues' files
is one `syncfs` of their filesystem (`fileio.sync_filesystem`): 10,000 fdatasyncs took 1.1 s on 8
threads on the bench machine, one syncfs of the same files 0.06 s; a few are fdatasync'ed each,
together on a small thread pool (concurrent ones share the filesystem's journal commits).
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import re
import struct
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tidelog.commitlog.fileio import sync_filesystem, write_all
from tidelog.errors import CorruptRecordError, InvalidArgumentError, OffsetBelowRetentionError
from tidelog.invariants import require
from tidelog.private import open_private, private_dir

log = logging.getLogger(__name__)

UNIT = struct.Struct("<QIQ")
UNIT_SIZE = UNIT.size  # 20
TOPIC_RE = re.compile(r"^[A-Za-z0-9_.%\-]{1,127}$")
MAX_QUEUE_ID = 65535


@functools.lru_cache(maxsize=64)
def _units_struct(n: int) -> struct.Struct:
    return struct.Struct("<" + "QIQ" * n)


INTERNAL_TOPIC_PREFIX = "%"  # group offsets, topic markers, ledgers: never a user's topic
#: ... except a consumer group's dead-letter topic (shared mode: client/modes.py), `%DLQ%<group>`,
#: which its members create and read like any topic.
DEAD_LETTER_PREFIX: str = "%DLQ%"


def user_topic_problem(name: object) -> str | None:
    """Why `name` cannot be a user's topic, or None: the one rule the controller (creating it) and
    the brokers (serving it) share, so no topic is created that brokers would then refuse."""
    if not isinstance(name, str) or not TOPIC_RE.match(name) or name in (".", ".."):
        return f"invalid topic name {name!r}: use 1-127 of A-Z a-z 0-9 _ . % - (not '.' or '..')"
    if name.startswith(INTERNAL_TOPIC_PREFIX) and not (
        name.startswith(DEAD_LETTER_PREFIX) and len(name) > len(DEAD_LETTER_PREFIX)
    ):
        return f"invalid topic name {name!r}: names starting with {INTERNAL_TOPIC_PREFIX} are tidelog's own"
    return None


def check_topic_queue(topic: str, queue_id: int) -> None:
    if not isinstance(topic, str) or not TOPIC_RE.match(topic) or topic in (".", ".."):
        raise InvalidArgumentError(f"invalid topic name {topic!r}: use 1-127 of A-Z a-z 0-9 _ . % -")
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id <= MAX_QUEUE_ID:
        raise InvalidArgumentError(f"invalid queue id {queue_id!r}: must be 0..{MAX_QUEUE_ID}")


_READERS = 2  # sealed files kept open for reads, per queue: a reader scans one file at a time
_SEARCH_SPAN = 256  # a binary search reads its last span of units in one pread
_WRITE_UNITS = 4096  # units per write
# units read at least, per pread of a read: a reader walks a queue a few units per call (its
# records interleave with other queues'), and the block it keeps answers the next calls
_READ_AHEAD = 128


def phys_bisect(packed: bytes, x: int) -> int:
    """Index of the first packed unit whose physical offset is at or above `x`."""
    return bisect.bisect_left([u[0] for u in UNIT.iter_unpack(packed)], x)


def written_units(size_of: Callable[[int], int], n: int) -> int:
    """How many of a file's `n` whole units were written: the unwritten part of a file a crash
    left behind is a suffix of zeros, and a written unit's size is never 0. `size_of(i)` reads
    unit i's size field; a binary search reads O(log n) of them, only when the last is 0."""
    if n == 0 or size_of(n - 1) != 0:
        return n
    lo, hi = 0, n - 1  # unit hi is unwritten
    while lo < hi:
        mid = (lo + hi) // 2
        if size_of(mid) == 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


class DescriptorPool:
    """The descriptors the consume queues of one log hold open, together, and their bound.

    Queues report each descriptor they open and close; after an open, `make_room` closes the
    descriptors of the least recently used other queues until the count is back at the bound.
    A queue whose lock is taken (busy in another thread) is passed over rather than waited for:
    two queues evicting each other never wait on each other's lock."""

    def __init__(self, limit: int) -> None:
        require(limit > 0, f"a descriptor bound must be positive, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        # queue -> descriptors it holds open, least recently used first
        self._held: OrderedDict[ConsumeQueue, int] = OrderedDict()
        self.open_count = 0
        self.evictions = 0  # queues whose descriptors were closed to keep the bound

    def opened(self, cq: ConsumeQueue) -> None:
        with self._lock:
            self._held[cq] = self._held.get(cq, 0) + 1
            self._held.move_to_end(cq)
            self.open_count += 1

    def closed(self, cq: ConsumeQueue) -> None:
        with self._lock:
            left = self._held[cq] - 1
            if left:
                self._held[cq] = left
            else:
                del self._held[cq]
            self.open_count -= 1

    def touch(self, cq: ConsumeQueue) -> None:
        with self._lock:
            if cq in self._held:
                self._held.move_to_end(cq)

    def full(self) -> bool:
        """Whether the bound is reached: a descriptor opened now would close another queue's."""
        return self.open_count >= self.limit

    def make_room(self, keep: ConsumeQueue) -> None:
        """Past the bound, close other queues' descriptors, least recently used first, down to
        an eighth below it, so the next opens find room without evicting one by one. Nothing is
        synced here: a queue knows its unsynced files by name and the checkpoint syncs them.
        `keep` is the caller's queue, whose lock it holds; a queue whose lock is taken is passed
        over, and when none can give any up the bound is exceeded until the next open finds one."""
        passed = {keep}
        while True:
            picked = self._pick(passed)
            if not picked:
                return
            passed.update(picked)
            claimed = [q for q in picked if q.claim()]
            try:
                for q in claimed:
                    q.drop_descriptors()
            finally:
                for q in claimed:
                    q.unclaim()
            with self._lock:
                self.evictions += len(claimed)

    def _pick(self, passed: set[ConsumeQueue]) -> list[ConsumeQueue]:
        """The least recently used queues not in `passed` whose descriptors bring the count an
        eighth below the bound; none while it is within the bound."""
        with self._lock:
            if self.open_count <= self.limit:
                return []
            excess = self.open_count - (self.limit - self.limit // 8)
            picked = []
            for q, n in self._held.items():
                if q not in passed:
                    picked.append(q)
                    excess -= n
                    if excess <= 0:
                        break
            return picked


# fdatasyncs of a few queues' files, in parallel: on a journaling filesystem concurrent ones share
# journal commits (3,000 files: 10 s one by one, 0.35 s on 8 threads, on the bench machine)
_SYNC_THREADS = 8
_QUEUE_SYNCS = ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="cq-sync")
#: From this many queues with unsynced files on, a checkpoint syncs them with one syncfs of their
#: filesystem rather than an fdatasync of each file (10,000 files: 0.06 s against 1.1 s).
SYNCFS_MIN_QUEUES = 64


def sync_queues(queues: list[ConsumeQueue], fs_fd: int | None, *, prefer_fs: bool = False) -> None:
    """Make every unit `queues` wrote durable: with many queues (or `prefer_fs`: while the
    descriptor bound closes files before they are synced, whose writeback errors only syncfs
    still sees) one syncfs of the filesystem that holds them (`fs_fd`, a descriptor on it opened
    before their writes, so that a writeback error since is reported), else `ConsumeQueue.sync`
    of each, in parallel. Raises the first error met, after every sync has ended (a failed one
    stays unsynced, and the next checkpoint meets it again)."""
    queues = [cq for cq in queues if cq.unsynced]
    many = len(queues) >= SYNCFS_MIN_QUEUES or (prefer_fs and len(queues) > 1)
    if many and fs_fd is not None and sync_filesystem(fs_fd):
        for cq in queues:
            cq.mark_synced()
        return
    if len(queues) <= 1:
        for cq in queues:
            cq.sync()
        return
    failures = [f.exception() for f in [_QUEUE_SYNCS.submit(cq.sync) for cq in queues]]
    for exc in failures:
        if exc is not None:
            raise exc


#: queues opened without a log's pool (tests, tools) share this one, in effect unbounded
UNBOUNDED = DescriptorPool(1 << 30)


class ConsumeQueue:
    """One (topic, queue)'s units: queue offsets [base, written end) in files, [written end, next
    offset) in the in-memory tail (`phys`, `sizes`, `tags`)."""

    def __init__(
        self,
        directory: str,
        topic: str,
        queue_id: int,
        units_per_file: int,
        pool: DescriptorPool = UNBOUNDED,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        self._per_file = units_per_file
        self.base = 0  # the queue's first readable offset; the first file may start below it
        self._written_end = 0  # units below this queue offset are in files
        self._next = 0
        self.phys = array("Q")  # the tail: units from _written_end on, not yet in files
        self.sizes = array("I")
        self.tags = array("Q")
        self._files: list[int] = []  # first queue offset of each file, ascending
        self._fd: int | None = None  # the last file, open for appends and reads
        self._readers: dict[int, int] = {}  # sealed file's first offset -> read fd, oldest first
        # first offsets of the files holding units written since their last sync: by file, not
        # by descriptor, so that an evicted queue's descriptor closes without a sync
        self._unsynced: set[int] = set()
        # the packed units last read from the files and the offset of the first: one attribute,
        # so a reader without the lock sees a consistent pair (units in files never change but
        # by truncation, which replaces it)
        self._block: tuple[int, bytes] = (0, b"")
        self._file_last: tuple[int, int] | None = None  # (phys, size) of the last unit in files
        self._lock = threading.Lock()
        self._pool = pool
        with self._lock:  # once a descriptor is open, the pool may ask for it back
            self._load()

    # --- load ---

    def _load(self) -> None:
        """Find each file's units from its size, reading only its last unit (and, when that one
        is unwritten, a binary search of the zero tail): opening costs O(files), not O(units)."""
        private_dir(self.dir)
        names = sorted(n for n in os.listdir(self.dir) if n.isdigit() and len(n) == 20)
        end: int | None = None
        for i, name in enumerate(names):
            start = int(name)
            if end is not None and start != end:
                # A gap between files means units were lost: drop this file and later ones;
                # the commit log re-dispatches their records.
                self._unlink_names(names[i:])
                break
            count, whole = self._count_units(name)
            self._files.append(start)
            end = start + count
            if not whole:
                self._unlink_names(names[i + 1 :])
                break
        self.base = self._files[0] if self._files else 0
        self._written_end = self._next = self.base if end is None else end
        self._trim_files_to(self._written_end)

    def _count_units(self, name: str) -> tuple[int, bool]:
        """(units written in file `name`, whether it holds nothing else: no partial unit and no
        unwritten zero tail)."""
        fd = os.open(os.path.join(self.dir, name), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            count = written_units(
                lambda i: UNIT.unpack(os.pread(fd, UNIT_SIZE, i * UNIT_SIZE))[1], size // UNIT_SIZE
            )
        finally:
            os.close(fd)
        return count, count * UNIT_SIZE == size

    def _unlink_names(self, names: list[str]) -> None:
        for name in names:
            os.unlink(os.path.join(self.dir, name))

    # --- offsets ---

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def pending(self) -> int:
        """Units held in memory: those not yet written to the files."""
        return len(self.phys)

    @property
    def file_count(self) -> int:
        return len(self._files)

    def confirmed_end(self, confirm_offset: int) -> int:
        """The queue offset just past the last unit whose record ends at or below `confirm_offset`."""
        with self._lock:
            nxt = self._next
            if nxt == self.base:
                return nxt
            phys, size = self._last_unit()
            if phys + size <= confirm_offset:
                return nxt  # the usual case: everything indexed is confirmed
            i = self._search(confirm_offset)
            # unit i-1 starts below confirm; it counts only if it also ends at or below it
            while i > self.base:
                phys, size, _ = self._units(i - 1, i)[0]
                if phys + size <= confirm_offset:
                    break
                i -= 1
            return i

    def unit_at(self, phys_offset: int) -> tuple[int, int | None]:
        """(queue offset, physical offset) of the first unit whose record starts at or after
        `phys_offset`; (next offset, None) when none does. Units are in physical order."""
        with self._lock:
            i = self._search(phys_offset)
            if i == self._next:
                return i, None
            return i, self._units(i, i + 1)[0][0]

    def unit(self, queue_offset: int) -> tuple[int, int, int]:
        """(physical offset, size, tags hash) of the unit at `queue_offset`."""
        lo, block = self._block  # the common case first: a unit of the block just read
        at = (queue_offset - lo) * UNIT_SIZE
        if queue_offset >= self.base and 0 <= at <= len(block) - UNIT_SIZE:
            return UNIT.unpack_from(block, at)
        return self.units(queue_offset, queue_offset + 1)[0]

    def units(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(physical offset, size, tags hash) of queue offsets [lo, hi): one pread per file
        touched, then the in-memory tail."""
        blo, block = self._block  # the common case first: units of the block just read
        if lo >= self.base and blo <= lo and (hi - blo) * UNIT_SIZE <= len(block):
            return list(UNIT.iter_unpack(block[(lo - blo) * UNIT_SIZE : (hi - blo) * UNIT_SIZE]))
        with self._lock:
            if lo < self.base:
                raise OffsetBelowRetentionError(
                    lo, self.base, what=f"queue offset of {self.topic}/{self.queue_id}"
                )
            if hi > self._next:
                raise InvalidArgumentError(
                    f"queue offsets up to {hi} of {self.topic}/{self.queue_id} are past its end {self._next}"
                )
            return self._units(lo, hi)

    # --- reading files and tail (callers hold the lock) ---

    def _last_unit(self) -> tuple[int, int]:
        """(phys, size) of the queue's last unit; the queue holds one."""
        if self.phys:
            return self.phys[-1], self.sizes[-1]
        require(self._file_last is not None, f"consume queue {self.dir}: no last unit in the files")
        return self._file_last  # type: ignore[return-value]

    def _units(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        w = self._written_end
        out = list(UNIT.iter_unpack(self._cached_bytes(lo, min(hi, w)))) if lo < w else []
        if hi > w:
            a, b = max(lo, w) - w, hi - w
            out.extend(zip(self.phys[a:b], self.sizes[a:b], self.tags[a:b], strict=True))
        return out

    def _cached_bytes(self, lo: int, hi: int) -> bytes:
        """The packed units [lo, hi) (below the written end), from the block last read when it
        holds them, else from a new block of at least `_READ_AHEAD` units."""
        blo, block = self._block
        if blo <= lo and (hi - blo) * UNIT_SIZE <= len(block):
            return block[(lo - blo) * UNIT_SIZE : (hi - blo) * UNIT_SIZE]
        block = self._file_bytes(lo, min(self._written_end, max(hi, lo + _READ_AHEAD)))
        self._block = (lo, block)
        return block[: (hi - lo) * UNIT_SIZE]

    def _files_changed(self) -> None:
        """Units in files changed other than by appending: forget what was read of them."""
        self._block = (0, b"")
        w = self._written_end
        has = bool(self._files) and w > self._files[0]
        self._file_last = UNIT.unpack(self._file_bytes(w - 1, w))[:2] if has else None

    def _file_bytes(self, lo: int, hi: int) -> bytes:
        """The packed units [lo, hi), all below the written end."""
        parts = []
        while lo < hi:
            k = bisect.bisect_right(self._files, lo) - 1
            start = self._files[k]
            stop = min(hi, self._files[k + 1] if k + 1 < len(self._files) else self._written_end)
            want = (stop - lo) * UNIT_SIZE
            raw = os.pread(self._read_fd(k), want, (lo - start) * UNIT_SIZE)
            if len(raw) != want:
                raise CorruptRecordError(
                    self._path(start),
                    (lo - start) * UNIT_SIZE,
                    f"consume queue file ends before queue offset {stop}",
                )
            parts.append(raw)
            lo = stop
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_fd(self, k: int) -> int:
        start = self._files[k]
        if k == len(self._files) - 1 and self._fd is not None:
            self._pool.touch(self)
            return self._fd
        fd = self._readers.pop(start, None)
        if fd is None:
            if len(self._readers) >= _READERS:
                self._close_fd(self._readers.pop(next(iter(self._readers))))
            fd = self._open_fd(start, os.O_RDONLY)
        else:
            self._pool.touch(self)
        self._readers[start] = fd  # most recently used last
        return fd

    def _close_readers(self, at_or_above: int = 0) -> None:
        for start in [s for s in self._readers if s >= at_or_above]:
            self._close_fd(self._readers.pop(start))

    def _search(self, x: int) -> int:
        """The first queue offset in [base, next) whose record starts at or after `x`; next if none."""
        w = self._written_end
        if self.phys and self.phys[0] < x:
            return w + bisect.bisect_left(self.phys, x)
        lo, hi = self.base, w  # the answer is in [lo, hi]: hi is the tail's first unit or the end
        while hi - lo > _SEARCH_SPAN:
            mid = (lo + hi) // 2
            if UNIT.unpack(self._file_bytes(mid, mid + 1))[0] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo + phys_bisect(self._file_bytes(lo, hi), x)

    def _path(self, start: int) -> str:
        return os.path.join(self.dir, f"{start:020d}")

    # --- descriptors (callers hold the lock) ---

    def _open_fd(self, start: int, flags: int) -> int:
        """Open file `start` with `flags`, counted by the pool, which may close other queues'."""
        fd = open_private(self._path(start), flags)
        self._pool.opened(self)
        self._pool.make_room(self)
        return fd

    def _close_fd(self, fd: int) -> None:
        try:
            os.close(fd)
        finally:
            self._pool.closed(self)

    def _append_fd(self) -> int:
        """The last file's append descriptor, opened again if the pool closed it."""
        if self._fd is None:
            last = self._files[-1]
            self._close_readers_of(last)  # the last file is read through its append descriptor
            self._fd = self._open_fd(last, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        else:
            self._pool.touch(self)
        return self._fd

    def release_descriptors(self) -> bool:
        """Close every descriptor this queue holds (what the pool does to the least recently
        used); False when the queue is busy (its lock taken) and nothing was closed. Unsynced
        files stay unsynced: the next sync opens them by name."""
        if not self.claim():
            return False
        try:
            self.drop_descriptors()
            return True
        finally:
            self.unclaim()

    def claim(self) -> bool:
        """Take this queue's lock if it is free, never waiting (the pool's eviction)."""
        return self._lock.acquire(blocking=False)

    def unclaim(self) -> None:
        self._lock.release()

    def drop_descriptors(self) -> None:
        """Close the read descriptors and the append one. The caller holds the lock (`claim`)."""
        self._close_readers()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._close_fd(fd)

    # --- dispatch ---

    def put(self, queue_offset: int, phys_offset: int, size: int, tag: int, where: str) -> None:
        """Index one record. Re-dispatching an indexed record is a no-op (rebuilds are idempotent)."""
        with self._lock:
            nxt = self._next
            name = f"{self.topic}/{self.queue_id}"
            if queue_offset < self.base:
                # below the queue's start (cut or retention): recovery skips those; anything else
                # sending one here disagrees with this index
                raise CorruptRecordError(
                    where,
                    phys_offset,
                    f"queue offset {queue_offset} of {name} is below the queue's start {self.base}",
                )
            if queue_offset < nxt:
                if self._units(queue_offset, queue_offset + 1)[0][0] == phys_offset:
                    return
                raise CorruptRecordError(
                    where,
                    phys_offset,
                    f"queue offset {queue_offset} of {name} is already taken by another record",
                )
            if queue_offset > nxt:
                if nxt > self.base:
                    raise CorruptRecordError(
                        where, phys_offset, f"queue offset {queue_offset} of {name} skips ahead of {nxt}"
                    )
                self._restart_at(
                    queue_offset
                )  # a replica that starts mid-stream, or a queue emptied by retention
            self.phys.append(phys_offset)
            self.sizes.append(size)
            self.tags.append(tag)
            self._next += 1

    def extend(self, phys: list[int], sizes: list[int], tags: list[int]) -> None:
        """Index a run of records appended just now, in queue order (the append fast path)."""
        with self._lock:
            self.phys.extend(phys)
            self.sizes.extend(sizes)
            self.tags.extend(tags)
            self._next += len(phys)

    def write_pending(self) -> None:
        """Move the tail to the files (one write per file touched, at most `_WRITE_UNITS` units
        each); whatever was written leaves memory even if a later write fails."""
        with self._lock:
            done = 0
            try:
                while done < len(self.phys):
                    done += self._write_some(done)
            finally:
                if done:
                    self._file_last = self.phys[done - 1], self.sizes[done - 1]
                del self.phys[:done]
                del self.sizes[:done]
                del self.tags[:done]

    def _write_some(self, lo: int) -> int:
        """Write tail units from index `lo` (queue offset `_written_end`) to the file they go to."""
        qoff = self._written_end
        if not self._files or qoff - self._files[-1] >= self._per_file:
            self._open_file(qoff)
        start = self._files[-1]
        n = min(self._per_file - (qoff - start), len(self.phys) - lo, _WRITE_UNITS)
        hi = lo + n
        flat = [
            v
            for unit in zip(self.phys[lo:hi], self.sizes[lo:hi], self.tags[lo:hi], strict=True)
            for v in unit
        ]
        # With the pool's bound reached, a queue whose descriptor was closed writes through one
        # of its own for this write: opening its append descriptor again would close another's.
        once = self._fd is None and self._pool.full()
        fd = os.open(self._path(start), os.O_WRONLY | os.O_APPEND) if once else self._append_fd()
        try:
            write_all(fd, _units_struct(n).pack(*flat))
        except OSError:
            # A partial unit would shift every later one: cut the file back to whole units.
            os.ftruncate(fd, (qoff - start) * UNIT_SIZE)
            raise
        finally:
            if once:
                os.close(fd)
        self._unsynced.add(start)
        self._written_end += n
        return n

    def _open_file(self, start: int) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            # Forgotten before the open: if it fails, close() must not close this number again,
            # which by then may be another file's.
            os.fsync(fd)
            self._unsynced.discard(self._files[-1])
            self._close_fd(fd)
        self._fd = self._open_fd(start, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        self._files.append(start)

    @property
    def unsynced(self) -> bool:
        """Whether a file holds units written since the last sync. Read without the lock: only
        the flusher adds to it, and it asks after its own writes."""
        return bool(self._unsynced)

    def sync(self) -> None:
        # under the lock: the pool may otherwise close (and the number be reused) mid-sync
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        for start in sorted(self._unsynced):
            if self._fd is not None and start == self._files[-1]:
                os.fdatasync(self._fd)
            else:  # a sealed file, or one whose descriptor the pool closed: by name
                try:
                    fd = os.open(self._path(start), os.O_RDONLY)
                except FileNotFoundError:  # cut or truncated away since: nothing left to sync
                    self._unsynced.discard(start)
                    continue
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            self._unsynced.discard(start)

    def mark_synced(self) -> None:
        """Every file of this queue was synced by other means (a syncfs of its filesystem, after
        the last write into it)."""
        with self._lock:
            self._unsynced.clear()

    # --- truncation, retention and cuts ---

    def cut(self, queue_offset: int) -> None:
        """Forget every unit below `queue_offset` for good (a deleted topic's records): files that
        held only such units go now. The queue continues at its next offset; when no unit is left
        an empty file named `queue_offset` keeps that start across a restart."""
        with self._lock:
            if queue_offset <= self.base:
                return
            if queue_offset >= self._next or queue_offset > self._written_end:
                self._restart_at(queue_offset)
                return
            self.base = queue_offset
            # whole files below the cut go; the first kept one may still start below it (units the
            # owner cuts again after a restart, see broker.topics)
            self._drop_files_below(queue_offset)

    def _restart_at(self, queue_offset: int) -> None:
        """Start the files again at `queue_offset` (every unit in files lies below it): delete
        them, keep the tail's units at or above it, and leave an empty file named by it."""
        drop = min(max(0, queue_offset - self._written_end), len(self.phys))
        del self.phys[:drop]
        del self.sizes[:drop]
        del self.tags[:drop]
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._close_fd(fd)
        self._close_readers()
        self._unlink_names([f"{start:020d}" for start in self._files])
        self._files.clear()
        self.base = self._written_end = queue_offset
        self._next = max(self._next, queue_offset)
        self._open_file(queue_offset)  # the anchor: an empty file named by the queue's start
        self._files_changed()

    def _drop_files_below(self, queue_offset: int) -> None:
        while len(self._files) > 1 and self._files[1] <= queue_offset:
            start = self._files.pop(0)
            self._close_readers_of(start)
            os.unlink(self._path(start))

    def _close_readers_of(self, start: int) -> None:
        fd = self._readers.pop(start, None)
        if fd is not None:
            self._close_fd(fd)

    def truncate_phys(self, phys_offset: int) -> None:
        """Drop units whose record starts at or after `phys_offset` (commit-log truncation)."""
        with self._lock:
            keep = self._search(phys_offset)
            if keep == self._next:
                return
            tail_keep = max(0, keep - self._written_end)
            del self.phys[tail_keep:]
            del self.sizes[tail_keep:]
            del self.tags[tail_keep:]
            self._next = keep
            if keep < self._written_end:
                self._written_end = keep
                self._trim_files_to(keep)

    def _trim_files_to(self, end_qoff: int) -> None:
        """Make the files hold exactly the units below `end_qoff`."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            self._close_fd(fd)
        # a file starting exactly at the end stays, empty: it may be the one that records where
        # a cut queue starts
        while self._files and self._files[-1] > end_qoff:
            start = self._files.pop()
            self._close_readers_of(start)
            os.unlink(self._path(start))
        if self._files:
            last = self._files[-1]
            self._close_readers_of(last)  # the last file is read through its append descriptor
            self._fd = self._open_fd(last, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            os.ftruncate(self._fd, (end_qoff - last) * UNIT_SIZE)
            self._unsynced.add(last)
        self._files_changed()

    def trim_below(self, min_phys: int) -> None:
        """Forget units whose record lies below the log's new min offset (retention)."""
        with self._lock:
            new_base = self._search(min_phys)
            if new_base == self.base:
                return
            if new_base > self._written_end:
                self._restart_at(new_base)
                return
            self.base = new_base
            # whole files below the new base go; the first kept file may start below it
            self._drop_files_below(new_base)

    def check_readable(self, queue_offset: int) -> None:
        if queue_offset < self.base:
            raise OffsetBelowRetentionError(
                queue_offset, self.base, what=f"queue offset of {self.topic}/{self.queue_id}"
            )

    def close(self) -> None:
        with self._lock:
            self._sync()
            if self._fd is not None:
                fd, self._fd = self._fd, None
                self._close_fd(fd)
            self._close_readers()
