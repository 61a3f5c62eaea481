"""The key index files: from the hash of (topic, key) to the physical offsets of its records.

Like RocketMQ's IndexFile: a directory `index/` of files named by the first physical offset each
may index (20 digits), each a header, a hash-slot table and a run of entries chained per slot
(format: `commitlog/keyformat.py`, commitlog/FORMAT.md "Key index"). Entries are added in
physical order, so a file covers a range of the log and, through its entries' store times, a
range of time; a full file is sealed and the next one starts at the record that did not fit.

Memory: the active (last) file's slot table (`slots` × 4 bytes) and each file's header, however
many messages are indexed; entries are written as they are added and read back with `pread`.

Durability: the index is derived data, like the consume queues. `sync` writes the slot table's
changed pages, fdatasyncs, then writes the header (count, covered end) and fdatasyncs again, so a
header on disk never counts an entry that is not on disk. A file is marked unclean on disk
before its first change after a sync; after a crash its slots naming entries past the header's
count are repaired from the entries below it, and the log is indexed again from the header's
end (`commitlog/lookups.py`). A file whose header is damaged is dropped with every later one, and
the log is indexed again from its start: the index never stops a broker from opening.

Locks: `lock` guards the files; the log's truncation and retention call in holding the log's
locks, the indexer holds only this one while it adds (see `commitlog/lookups.py`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from array import array

from tidelog.commitlog import keyformat as kf
from tidelog.commitlog.epochs import fsync_dir
from tidelog.commitlog.fileio import pwrite_all
from tidelog.private import open_private, private_dir

log = logging.getLogger(__name__)

DEFAULT_SLOTS = 1 << 20  # 4 MiB of slots in memory for the active file
DEFAULT_CAPACITY = 1 << 22  # entries per file (96 MiB of entries at most)
_PAGE_SLOTS = 1024  # the slot table is written back in pages of this many slots
_SCAN_ENTRIES = 4096  # entries read at once when repairing slots
_SWAP = sys.byteorder == "little"  # the file is big-endian

#: A cursor of a lookup: (the file's begin offset, the next entry to read in it; 0 = its slot's head).
Cursor = tuple[int, int]


def _name(begin: int) -> str:
    return f"{begin:020d}"


class IndexFile:
    """One key index file. Only the last file of the index is active (takes new entries): it keeps
    its slot table in memory; the others are read with `pread`."""

    def __init__(self, path: str, fd: int, header: kf.Header) -> None:
        self.path = path
        self.fd = fd
        self.header = header
        self.slots: array[int] | None = None  # the active file's slot table
        self.dirty_pages: set[int] = set()
        self.unclean_on_disk = not header.flags & kf.CLEAN

    @classmethod
    def create(cls, directory: str, begin: int, slots: int, capacity: int) -> IndexFile:
        path = os.path.join(directory, _name(begin))
        fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        f = cls(path, fd, kf.Header(slots, capacity, 0, begin, begin, 0, 0))
        os.ftruncate(fd, kf.slot_position(slots))  # a hole: slots read as 0 until written
        f.write_header()
        os.fdatasync(fd)
        fsync_dir(directory)
        f.slots = array("I", bytes(4 * slots))
        return f

    @classmethod
    def load(cls, path: str) -> IndexFile:
        """Open a file and read its header (HeaderDamaged if it has none)."""
        fd = os.open(path, os.O_RDWR)
        try:
            header = kf.decode_header(os.pread(fd, kf.HEADER_BYTES, 0))
            if header.begin_phys != int(os.path.basename(path)):
                raise kf.HeaderDamaged(f"begins at {header.begin_phys}, named {os.path.basename(path)}")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, header)

    # --- reading ---

    def slot(self, s: int) -> int:
        if self.slots is not None:
            return int(self.slots[s])
        raw = os.pread(self.fd, kf.SLOT_BYTES, kf.slot_position(s))
        return kf.SLOT.unpack(raw)[0] if len(raw) == kf.SLOT_BYTES else 0

    def entries(self, first: int, last: int) -> list[kf.Entry]:
        """Entries first..last (1-based, inclusive), read in one pread; missing bytes read as zeros."""
        if last < first:
            return []
        want = (last - first + 1) * kf.ENTRY_BYTES
        raw = os.pread(self.fd, want, kf.entry_position(self.header.slots, first))
        raw += bytes(want - len(raw))
        return [kf.decode_entry(raw, i * kf.ENTRY_BYTES) for i in range(last - first + 1)]

    def entry(self, n: int) -> kf.Entry:
        return self.entries(n, n)[0]

    def first_at_or_after(self, phys: int) -> int:
        """The number of the first entry whose record starts at or after `phys` (count + 1 if
        none): entries are in physical order."""
        lo, hi = 1, self.header.used + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid).phys < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- the active file ---

    def activate(self) -> None:
        """Load the slot table to take new entries (the index's last file)."""
        if self.slots is not None:
            return
        n = self.header.slots
        raw = os.pread(self.fd, 4 * n, kf.slot_position(0))
        table = array("I")
        table.frombytes(raw + bytes(4 * n - len(raw)))
        if _SWAP:
            table.byteswap()
        self.slots = table

    def deactivate(self) -> None:
        self.slots = None
        self.dirty_pages.clear()

    def mark_unclean(self) -> None:
        """Before the first change after a sync: a crash from here on leaves slots the header does
        not vouch for, and the next open must know to repair them."""
        if not self.unclean_on_disk:
            self.header = self.header._replace(flags=self.header.flags & ~kf.CLEAN)
            self.write_header()
            os.fdatasync(self.fd)
            self.unclean_on_disk = True

    def set_slot(self, s: int, n: int) -> None:
        if self.slots is None:
            raise RuntimeError(f"key index {self.path} is not active")
        self.slots[s] = n
        self.dirty_pages.add(s // _PAGE_SLOTS)

    def append(self, items: list[tuple[int, int, int]]) -> None:
        """Add entries (key hash, phys, store time), in physical order; the file has room. The
        slots change only once the entries are written: a failed write (a full disk) leaves the
        file as it was, and the same entries are added again later."""
        table = self.slots
        if table is None:
            raise RuntimeError(f"key index {self.path} is not active")
        h = self.header
        slots, first = h.slots, h.used + 1
        lo, hi = h.first_ts if h.used else items[0][2], h.last_ts
        heads: dict[int, int] = {}
        parts = []
        n = h.used
        for key_hash, phys, ts in items:
            n += 1
            s = key_hash % slots
            parts.append(kf.encode_entry(kf.Entry(key_hash, heads.get(s, int(table[s])), phys, ts)))
            heads[s] = n
            lo, hi = min(lo, ts), max(hi, ts)
        pwrite_all(self.fd, b"".join(parts), kf.entry_position(slots, first))
        for s, head in heads.items():
            self.set_slot(s, head)
        self.header = h._replace(used=n, first_ts=lo, last_ts=hi)

    def sync(self, *, clean: bool) -> None:
        """Slot pages, fdatasync, then the header, fdatasync: the header never counts an entry or
        slot that is not on disk."""
        table = self.slots
        if table is not None:
            for page in sorted(self.dirty_pages):
                part = table[page * _PAGE_SLOTS : (page + 1) * _PAGE_SLOTS]
                if _SWAP:
                    part.byteswap()
                pwrite_all(self.fd, part.tobytes(), kf.slot_position(page * _PAGE_SLOTS))
            self.dirty_pages.clear()
        os.fdatasync(self.fd)
        flags = (self.header.flags | kf.CLEAN) if clean else (self.header.flags & ~kf.CLEAN)
        self.header = self.header._replace(flags=flags)
        self.write_header()
        os.fdatasync(self.fd)
        self.unclean_on_disk = not clean

    def write_header(self) -> None:
        pwrite_all(self.fd, kf.encode_header(self.header), 0)

    # --- repairs ---

    def repair_after_crash(self) -> int:
        """Slots naming entries past the durable count are reset to the newest entry below it
        (a backward scan of the entries, which are durable up to the count). Returns how many."""
        table = self.slots
        if table is None:
            raise RuntimeError(f"key index {self.path} is not active")
        count = self.header.used
        bad = {s for s, v in enumerate(table) if v > count}
        fixed = len(bad)
        for s in bad:
            self.set_slot(s, 0)
        last = count
        while bad and last > 0:
            first = max(1, last - _SCAN_ENTRIES + 1)
            for i, e in zip(range(last, first - 1, -1), reversed(self.entries(first, last)), strict=True):
                s = e.key_hash % self.header.slots
                if s in bad:
                    self.set_slot(s, i)
                    bad.discard(s)
            last = first - 1
        return fixed

    def cut_to(self, count: int, end_phys: int) -> None:
        """Keep entries 1..count (all intact: the file was written by this process or vouched for
        by its header); slots past them follow their chains back below the cut."""
        table = self.slots
        if table is None:
            raise RuntimeError(f"key index {self.path} is not active")
        h = self.header
        for s, v in enumerate(table):
            if v > count:
                while v > count:
                    prev = self.entry(v).prev
                    v = prev if prev < v else 0  # a chain only runs down; anything else ends it
                self.set_slot(s, v)
        # the time range stays as wide as it was: it only lets lookups skip files, and reading
        # every kept entry to narrow it would cost a whole file's read
        first, last = (h.first_ts, h.last_ts) if count else (0, 0)
        self.header = h._replace(used=count, end_phys=min(h.end_phys, end_phys), first_ts=first, last_ts=last)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class KeyIndex:
    """Every key index file of one log, oldest first; the last one takes new entries."""

    def __init__(self, directory: str, slots: int = DEFAULT_SLOTS, capacity: int = DEFAULT_CAPACITY) -> None:
        if not (0 < slots <= kf.MAX_SLOTS and 0 < capacity <= kf.MAX_CAPACITY):
            raise ValueError(f"key index geometry out of range: {slots} slots, {capacity} entries")
        self.directory = directory
        self.slot_count = slots
        self.capacity = capacity
        self.files: list[IndexFile] = []
        self.lock = threading.RLock()
        self.catchup = threading.Lock()  # one indexer at a time: the thread, or a lookup
        # bumped by every cut and drop: an indexer that read the log before one must not add
        # what it read (lookups.py)
        self.generation = 0

    @property
    def end_phys(self) -> int:
        """Every record below this offset has been looked at."""
        return self.files[-1].header.end_phys if self.files else 0

    # --- open ---

    def open(self, log_end: int, log_min: int) -> None:
        """Load the files (recovery): damaged headers and crash leftovers are repaired, entries at
        or past `log_end` dropped, files wholly below `log_min` deleted."""
        with self.lock:
            private_dir(self.directory)
            names = sorted(n for n in os.listdir(self.directory) if n.isdigit() and len(n) == 20)
            for i, name in enumerate(names):
                path = os.path.join(self.directory, name)
                try:
                    f = IndexFile.load(path)
                    if self.files and f.header.begin_phys != self.files[-1].header.end_phys:
                        raise kf.HeaderDamaged(
                            f"begins at {f.header.begin_phys}, the file before ends at "
                            f"{self.files[-1].header.end_phys}"
                        )
                except (kf.HeaderDamaged, OSError, ValueError) as exc:
                    log.warning(
                        "key index file %s is damaged (%s): dropping it and %d later file(s); "
                        "the index is rebuilt from the log",
                        path,
                        exc,
                        len(names) - i - 1,
                    )
                    for later in names[i:]:
                        os.unlink(os.path.join(self.directory, later))
                    fsync_dir(self.directory)
                    break
                self.files.append(f)
            if self.files:
                last = self.files[-1]
                last.activate()
                if last.unclean_on_disk:
                    repaired = last.repair_after_crash()
                    log.info(
                        "key index %s was not closed cleanly: %d slot(s) repaired, indexing again from %d",
                        last.path,
                        repaired,
                        last.header.end_phys,
                    )
            self.truncate(log_end)
            self.drop_below(log_min)
            if not self.files:
                self.files.append(IndexFile.create(self.directory, log_min, self.slot_count, self.capacity))

    # --- adding ---

    def add(self, items: list[tuple[int, int, int]], end: int) -> None:
        """Index `items` (key hash, phys, store time: every keyed record from `end_phys` to `end`,
        in physical order) and note that everything below `end` was looked at."""
        with self.lock:
            active = self.files[-1]
            i = 0
            while i < len(items):
                h = active.header
                if h.used == h.capacity:
                    active = self._roll(items[i][1])
                    h = active.header
                take = items[i : i + h.capacity - h.used]
                active.mark_unclean()
                active.append(take)
                i += len(take)
            if end > active.header.end_phys:
                active.header = active.header._replace(end_phys=end)

    def restart_at(self, offset: int) -> None:
        """The log's records below `offset` are gone (retention, or a replica that starts there):
        continue indexing from `offset`."""
        with self.lock:
            active = self.files[-1]
            if active.header.end_phys < offset:
                active.header = active.header._replace(end_phys=offset)

    def _roll(self, begin: int) -> IndexFile:
        """Seal the full active file at `begin`, where the next file starts."""
        full = self.files[-1]
        full.header = full.header._replace(end_phys=begin)
        full.sync(clean=True)
        full.deactivate()
        f = IndexFile.create(self.directory, begin, self.slot_count, self.capacity)
        self.files.append(f)
        log.info("key index %s sealed with %d entries; next file %s", full.path, full.header.used, f.path)
        return f

    # --- cutting ---

    def truncate(self, cut: int) -> None:
        """Drop every entry of a record at or past `cut` (the log was truncated there)."""
        with self.lock:
            self.generation += 1
            if cut >= self.end_phys:
                return
            while self.files and self.files[-1].header.begin_phys > cut:
                gone = self.files.pop()
                gone.close()
                os.unlink(gone.path)
            if not self.files:
                self.files.append(IndexFile.create(self.directory, cut, self.slot_count, self.capacity))
                return
            last = self.files[-1]
            last.activate()
            last.mark_unclean()
            last.cut_to(last.first_at_or_after(cut) - 1, cut)
            last.sync(clean=False)
            fsync_dir(self.directory)

    def drop_below(self, log_min: int) -> None:
        """Delete the files whose entries all point below the log's min offset (retention)."""
        with self.lock:
            self.generation += 1
            dropped = 0
            while len(self.files) > 1 and self.files[1].header.begin_phys <= log_min:
                gone = self.files.pop(0)
                gone.close()
                os.unlink(gone.path)
                dropped += 1
            if dropped:
                fsync_dir(self.directory)
                log.info("retention dropped %d key index file(s) below offset %d", dropped, log_min)
            if self.files and self.files[-1].header.end_phys < log_min:
                self.restart_at(log_min)

    # --- sync and close ---

    def sync(self, *, clean: bool = False) -> None:
        with self.lock:
            if self.files:
                self.files[-1].sync(clean=clean)

    def close(self) -> None:
        with self.lock:
            for f in self.files:
                f.close()
            self.files.clear()

    # --- lookups ---

    def candidates(
        self, key_hash: int, begin_ts: int, end_ts: int, limit: int, cursor: Cursor | None = None
    ) -> tuple[list[tuple[int, int]], Cursor | None]:
        """Up to `limit` (phys, store time) of entries with `key_hash` stored within
        [begin_ts, end_ts], newest first, from `cursor` on (None: the newest entry); and the
        cursor to go on from (None when the chains are done). Callers check each record."""
        out: list[tuple[int, int]] = []
        with self.lock:
            files = list(reversed(self.files))
            if cursor is not None:
                files = [f for f in files if f.header.begin_phys <= cursor[0]]
                if not files or files[0].header.begin_phys != cursor[0]:
                    return out, None  # the file went (retention or truncation): nothing older
            for f in files:
                h = f.header
                resume = cursor is not None and h.begin_phys == cursor[0]
                if h.used == 0 or h.last_ts < begin_ts or h.first_ts > end_ts:
                    continue
                n = cursor[1] if resume and cursor is not None else f.slot(kf.slot_of(key_hash, h.slots))
                while 0 < n <= h.used:
                    if len(out) >= limit:
                        return out, (h.begin_phys, n)
                    e = f.entry(n)
                    if e.key_hash == key_hash and begin_ts <= e.store_ts <= end_ts:
                        out.append((e.phys, e.store_ts))
                    if e.prev >= n:
                        log.warning(
                            "key index %s: entry %d links forward to %d; chain cut", f.path, n, e.prev
                        )
                        break
                    n = e.prev
        return out, None
