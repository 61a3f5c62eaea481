"""The commit log: one broker's physical log of records, its consume queues, epochs and recovery.

Theory of operation
-------------------
- Bytes. The log is a run of fixed-size segment files named by their start offset; a physical
  offset is a byte position in that run, so the same record sits at the same offset on every
  replica. A record never spans segments: when the next record (plus room for a blank marker)
  does not fit, the segment is closed with a blank marker and the file is extended to its full
  size (a sparse hole), so the next segment starts exactly at `base + segment_bytes`.
- Threads. Appends, reads, truncation and retention run on the owner's thread (the broker's
  event loop). One flusher thread does every fdatasync: in `sync` mode it wakes when someone
  awaits `flushed(offset)` and flushes everything appended so far, so all appenders that arrived
  during one fdatasync share the next one (group commit); in `async` mode it flushes every
  `flush_interval_ms`. `_flush_lock` keeps truncation and retention from closing a file under a
  running fdatasync; `_lock` guards the segment list.
- Visibility. Appended bytes are visible to `read_raw` at once (replication streams them);
  `read` by queue offset never returns a record that ends past `confirm_offset`, which the owner
  (the HA layer) sets. Consume-queue units are written for every record at append time; readers
  are clamped, and truncation cuts the units together with the records.
- Durability. The checkpoint records the flushed offset after every flush. Recovery scans from
  the segment holding min(checkpointed flushed offset, durable consume-queue offset): damage at
  or above the flushed offset is a torn tail and is cut; damage below it is corruption and stops
  the open with the file and offset named. Reads verify every record's CRC, so damage in an
  older segment that recovery did not scan is still an error, never a silent gap.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

from tidelog.commitlog import record as rec
from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.commitlog.consumequeue import ConsumeQueue, check_topic_queue
from tidelog.commitlog.epochs import EpochFile, fsync_dir
from tidelog.commitlog.fileio import pwrite_all, store_error
from tidelog.commitlog.waiters import OffsetWaiters
from tidelog.errors import (
    ConfigError,
    CorruptRecordError,
    DataUnavailableError,
    InvalidArgumentError,
    MessageTooLargeError,
    OffsetBelowRetentionError,
    OffsetMismatchError,
    StoreClosedError,
    TidelogError,
)
from tidelog.invariants import require, stop_if_violated

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 1 << 30
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
MIN_SEGMENT_BYTES = 4096


class Placement(NamedTuple):
    """Where one appended record landed."""

    phys_offset: int
    queue_offset: int
    size: int


class QueueOffsets(NamedTuple):
    min: int  # lowest readable queue offset (retention)
    max: int  # next queue offset to be written
    confirmed: int  # readers see queue offsets below this


class _Segment:
    __slots__ = ("base", "path", "fd", "size")

    def __init__(self, base: int, path: str, fd: int, size: int) -> None:
        self.base = base
        self.path = path
        self.fd = fd
        self.size = size  # bytes of the segment in use (segment_bytes once closed by a blank)


def _segment_name(base: int) -> str:
    return f"{base:020d}"


class CommitLog:
    """A broker's commit log. Create with `CommitLog.open(directory, ...)`."""

    def __init__(self, directory: str, *, segment_bytes: int, flush: str, flush_interval_ms: int,
                 max_message_bytes: int, cq_units_per_file: int, checkpoint_interval_ms: int,
                 clock: Callable[[], float]) -> None:
        if flush not in ("sync", "async"):
            raise ConfigError(f"flush must be 'sync' or 'async', not {flush!r}")
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
        if max_message_bytes + rec.BLANK_SIZE > segment_bytes:
            max_message_bytes = segment_bytes - rec.BLANK_SIZE
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.flush_mode = flush
        self.flush_interval_ms = flush_interval_ms
        self.max_message_bytes = max_message_bytes
        self._cq_units_per_file = cq_units_per_file
        self._checkpoint_interval = checkpoint_interval_ms / 1000.0
        self._clock = clock
        self._cl_dir = os.path.join(directory, "commitlog")
        self._cq_dir = os.path.join(directory, "consumequeue")
        self._segments: list[_Segment] = []
        self._max = 0
        self._flushed = 0
        self._confirm = 0
        self._cq_durable = 0
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        # called with the cut offset at the start of every truncate(), before anything is removed
        self.truncate_listeners: list[Callable[[int], None]] = []
        # queues with units not yet in their files; the flusher writes them at checkpoints
        self._cq_dirty: set[ConsumeQueue] = set()
        self._valid_names: dict[tuple[str, int], bytes] = {}
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._cond = threading.Condition()
        self._flush_requested = 0
        self._closed = False
        self._failed: str | None = None
        self._failure: TidelogError | None = None
        # called (from any thread) with the typed error when a write or sync fails
        self.failure_listeners: list[Callable[[TidelogError], None]] = []
        self._waiters = OffsetWaiters(self._request_flush)
        self._checkpoint: CheckpointFile
        self.epochs: EpochFile
        self._flusher: threading.Thread | None = None
        self._last_cp_state: tuple[int, int, int] = (-1, -1, -1)
        self._last_cq_sync = 0.0

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(cls, directory: str | os.PathLike[str], *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
             flush: str = "async", flush_interval_ms: int = 500,
             max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, cq_units_per_file: int = 300_000,
             checkpoint_interval_ms: int = 1000, full_scan: bool = False,
             clock: Callable[[], float] = time.time) -> CommitLog:
        """Open (creating if needed) and recover the log in `directory`."""
        self = cls(os.fspath(directory), segment_bytes=segment_bytes, flush=flush,
                   flush_interval_ms=flush_interval_ms, max_message_bytes=max_message_bytes,
                   cq_units_per_file=cq_units_per_file, checkpoint_interval_ms=checkpoint_interval_ms,
                   clock=clock)
        try:
            self._recover(full_scan)
        except BaseException:
            self._close_files()
            raise
        self._flusher = threading.Thread(target=self._flush_loop, name=f"flush:{self.directory}", daemon=True)
        self._flusher.start()
        return self

    def close(self) -> None:
        """Flush everything, record a clean shutdown and release the files."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        try:
            if not self._failed:
                self._flush_once(sync_cqs=True, clean=True)
        finally:
            self._waiters.fail_all(StoreClosedError("the commit log was closed"))
            self._close_files()

    def _close_files(self) -> None:
        for seg in self._segments:
            os.close(seg.fd)
        self._segments.clear()
        for cq in self._cqs.values():
            cq.close()
        self._cqs.clear()
        if hasattr(self, "_checkpoint"):
            self._checkpoint.close()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the commit log is closed")
        if self._failure is not None:
            raise self._failure

    # ------------------------------------------------------------------ offsets

    @property
    def min_offset(self) -> int:
        return self._segments[0].base if self._segments else self._max

    @property
    def max_offset(self) -> int:
        return self._max

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def confirm_offset(self) -> int:
        return self._confirm

    @confirm_offset.setter
    def confirm_offset(self, value: int) -> None:
        if not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"confirm offset must be a non-negative integer, not {value!r}")
        # The owner derives it from replica acks, which never exceed what this log holds, and it
        # only grows: truncation and retention move it themselves, not through here.
        require(value <= self._max, f"{self.directory}: confirm offset {value} would pass the max offset {self._max}")
        require(value >= self._confirm, f"{self.directory}: confirm offset would go back from {self._confirm} to {value}")
        self._confirm = value

    @property
    def last_epoch(self) -> int:
        return self.epochs.last_epoch

    # ------------------------------------------------------------------ recovery

    def _recover(self, full_scan: bool) -> None:
        os.makedirs(self._cl_dir, exist_ok=True)
        self._checkpoint = CheckpointFile(self.directory)
        cp = self._checkpoint.loaded
        names = sorted(n for n in os.listdir(self._cl_dir) if n.isdigit() and len(n) == 20)
        for i, name in enumerate(names):
            base = int(name)
            path = os.path.join(self._cl_dir, name)
            if base % self.segment_bytes:
                raise ConfigError(f"segment {path} does not start at a multiple of segment_bytes="
                                  f"{self.segment_bytes}; was the segment size changed?")
            if i and base != self._segments[-1].base + self.segment_bytes:
                raise CorruptRecordError(path, self._segments[-1].base + self.segment_bytes,
                                         "a segment is missing before this one")
            fd = os.open(path, os.O_RDWR)
            self._segments.append(_Segment(base, path, fd, os.fstat(fd).st_size))
        if cp is None and self._segments:
            # Without a checkpoint only rolled segments are known to be complete.
            log.warning("no checkpoint in %s: trusting rolled segments, rebuilding consume queues",
                        self.directory)
        flushed_cp = cp.flushed_offset if cp else (self._segments[-1].base if self._segments else 0)
        rebuild_cqs = cp is None or not os.path.isdir(self._cq_dir)
        if rebuild_cqs and os.path.isdir(self._cq_dir):
            shutil.rmtree(self._cq_dir)
        if not self._segments:
            if cp is not None and cp.flushed_offset > 0:
                raise CorruptRecordError(self._cl_dir, cp.flushed_offset,
                                         "the checkpoint records flushed data but no segment exists")
            self._max = self._flushed = self._confirm = self._cq_durable = 0
            self.epochs = EpochFile(self.directory, lambda: self._max)
            self._checkpoint.write(0, 0, 0, clean=False)
            return
        min_off = self._segments[0].base
        cq_cp = min_off if rebuild_cqs else max(min_off, cp.cq_offset if cp else 0)
        self._load_cqs(cq_cp)
        scan_from = min_off if full_scan else max(min_off, min(flushed_cp, cq_cp))
        end = self._scan(scan_from, flushed_cp, cq_cp)
        self._cut_files_at(end)
        self._max = end
        for cq in self._cqs.values():
            cq.truncate_phys(end)
            cq.trim_below(min_off)
            cq.write_pending()
            cq.sync()
        self._sync_segments(self._segments)
        self._flushed = end
        self._cq_durable = end
        confirm = cp.confirm_offset if cp else min_off
        self._confirm = min(max(confirm, min_off), end)
        self.epochs = EpochFile(self.directory, lambda: self._max)
        self.epochs.truncate_after(end)
        self._write_checkpoint(clean=False)
        log.info("recovered %s: offsets [%d, %d), confirm %d, last epoch %d, %d queues",
                 self.directory, min_off, end, self._confirm, self.epochs.last_epoch, len(self._cqs))

    def _load_cqs(self, durable_phys: int) -> None:
        if not os.path.isdir(self._cq_dir):
            return
        for topic in sorted(os.listdir(self._cq_dir)):
            tdir = os.path.join(self._cq_dir, topic)
            for qname in sorted(os.listdir(tdir)):
                if not qname.isdigit():
                    continue
                cq = ConsumeQueue(os.path.join(tdir, qname), topic, int(qname), self._cq_units_per_file)
                cq.truncate_phys(durable_phys)
                self._cqs[(topic, int(qname))] = cq

    def _scan(self, scan_from: int, flushed_cp: int, dispatch_from: int) -> int:
        """Validate records from the segment holding `scan_from`; returns the recovered end."""
        first = min(self._segment_index(scan_from), len(self._segments) - 1)
        for seg in self._segments[first:]:
            if seg.size == 0:
                if seg.base < flushed_cp:
                    raise CorruptRecordError(seg.path, seg.base, f"the segment is empty but data up to {flushed_cp} "
                                             "was flushed")
                return seg.base
            with mmap.mmap(seg.fd, seg.size, prot=mmap.PROT_READ) as mm:
                pos = 0
                while True:
                    offset = seg.base + pos
                    kind, size, reason = rec.check_at(mm, pos)
                    if kind == rec.VALID:
                        if offset >= dispatch_from:
                            self._dispatch_header(rec.decode_header(mm, pos), seg.path)
                        pos += size
                        continue
                    if kind == rec.IS_BLANK and size == self.segment_bytes - pos:
                        break  # segment complete; continue with the next one
                    if kind == rec.IS_BLANK:
                        kind, reason = rec.DAMAGED, f"blank marker declares {size} bytes, {self.segment_bytes - pos} left"
                    if offset < flushed_cp:
                        why = reason if kind == rec.DAMAGED else "data missing below the flushed offset"
                        raise CorruptRecordError(seg.path, offset, f"{why} (flushed up to {flushed_cp})")
                    if kind == rec.DAMAGED:
                        log.warning("torn tail in %s at offset %d (%s): truncating", seg.path, offset, reason)
                    return offset
        return self._segments[-1].base + self.segment_bytes

    def _cut_files_at(self, end: int) -> None:
        """Make the files end exactly at `end` (drop a torn tail and any later segment)."""
        removed = False
        while self._segments and self._segments[-1].base > end:
            seg = self._segments.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
            removed = True
        if self._segments and self._segments[-1].base + self.segment_bytes > end:
            seg = self._segments[-1]
            keep = end - seg.base
            if seg.size != keep:
                os.ftruncate(seg.fd, keep)
                os.fsync(seg.fd)
                seg.size = keep
        if removed:
            fsync_dir(self._cl_dir)

    # ------------------------------------------------------------------ append

    def _check_name(self, topic: str, queue_id: int) -> bytes:
        key = (topic, queue_id)
        name = self._valid_names.get(key)
        if name is None:
            check_topic_queue(topic, queue_id)
            name = topic.encode()
            self._valid_names[key] = name
        return name

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            check_topic_queue(topic, queue_id)
            cq = ConsumeQueue(os.path.join(self._cq_dir, topic, str(queue_id)), topic, queue_id,
                              self._cq_units_per_file)
            self._cqs[(topic, queue_id)] = cq
        return cq

    def append(self, messages: Sequence[rec.Message], *, now_ms: int | None = None) -> list[Placement]:
        """Append a batch; returns where each record landed, in order.

        The batch is validated whole before anything is written. The records are visible to
        `read_raw` on return; `await flushed(end of the last record)` waits for durability.
        """
        self._check_open()
        if not messages:
            return []
        store_ts = int(self._clock() * 1000) if now_ms is None else now_ms
        with self._lock:
            return self._append_locked(messages, store_ts)

    def _append_locked(self, messages: Sequence[rec.Message], store_ts: int) -> list[Placement]:
        # One pass builds every record as (head, header tail + names, body) parts; nothing is
        # written until the whole batch is valid. This loop is the hot path: locals only.
        epoch = self.epochs.last_epoch
        limit = self.max_message_bytes
        seg_bytes = self.segment_bytes
        head_pack = rec.HEAD.pack
        tail_pack = rec.HEADER_TAIL.pack
        magic = rec.MAGIC
        header_size = rec.HEADER_SIZE
        blank_size = rec.BLANK_SIZE
        make = tuple.__new__
        start = self._max
        pos = start
        seg_base = pos - pos % seg_bytes
        chunk_start = pos
        parts: list[bytes] = []
        chunks: list[tuple[int, int, list[bytes], int]] = []  # (segment base, start, parts, blank)
        placements: list[Placement] = []
        # per queue: [cq, name, next queue offset, phys[], sizes[], tags[], header + name size, name length]
        queues: dict[tuple[str, int], list] = {}
        message_type = rec.Message
        for m in messages:
            if m.__class__ is not message_type:
                raise InvalidArgumentError(f"append takes Message objects, not {type(m).__name__}")
            qid = m.queue_id
            q = queues.get((m.topic, qid))
            if q is None:
                name = self._check_name(m.topic, qid)
                cq = self._cq(m.topic, qid)
                q = queues[(m.topic, qid)] = [cq, name, cq.next_offset, [], [], [], header_size + len(name),
                                              len(name)]
            body = m.body
            if body.__class__ is not bytes:
                if not isinstance(body, bytearray | memoryview):
                    raise InvalidArgumentError(f"message body must be bytes, not {type(body).__name__}")
                body = bytes(body)
            tags = m.tags
            if m.key is None and tags is None and not m.properties:
                props = b""
                tag = 0
            else:
                try:
                    props = rec.encode_properties(m.key, tags, m.properties)
                except (ValueError, UnicodeEncodeError, AttributeError) as exc:
                    raise InvalidArgumentError(f"bad message properties: {exc}") from exc
                if len(props) > rec.MAX_PROPERTIES_BYTES:
                    raise MessageTooLargeError(
                        f"properties of {len(props)} bytes exceed {rec.MAX_PROPERTIES_BYTES}")
                tag = rec.tags_hash(tags)
            plen = len(props)
            blen = len(body)
            size = q[6] + plen + blen
            if size > limit:
                raise MessageTooLargeError(f"a record of {size} bytes exceeds max_message_bytes={limit}")
            if pos - seg_base + size + blank_size > seg_bytes:
                chunks.append((seg_base, chunk_start, parts, seg_bytes - (pos - seg_base)))
                seg_base += seg_bytes
                pos = chunk_start = seg_base
                parts = []
            qoff = q[2]
            q[2] = qoff + 1
            born = m.born_ts
            try:
                pre = tail_pack(m.flags, q[7], qid, epoch, qoff, pos, store_ts if born is None else born,
                                store_ts, plen, blen) + q[1] + props
            except struct.error as exc:
                raise InvalidArgumentError(f"message field out of range: {exc}") from exc
            parts += (head_pack(size, magic, crc32c(body, crc32c(pre))), pre, body)
            placements.append(make(Placement, (pos, qoff, size)))
            q[3].append(pos)
            q[4].append(size)
            q[5].append(tag)
            pos += size
        chunks.append((seg_base, chunk_start, parts, 0))
        try:
            for base, cstart, cparts, blank in chunks:
                if blank:
                    cparts.append(rec.blank_marker(blank))
                self._write_chunk(base, cstart, b"".join(cparts), closes=bool(blank))
        except OSError as exc:
            raise self._fail(f"append at {start} failed: {exc}", exc) from exc
        dirty = self._cq_dirty
        for cq, _, _, phys, sizes, tagcodes, _, _ in queues.values():
            cq.extend(phys, sizes, tagcodes)
            dirty.add(cq)
        self._max = pos
        return placements

    def _write_chunk(self, base: int, start: int, data: bytes, closes: bool) -> None:
        """Write bytes at `start` of segment `base`; a chunk that ends with a blank marker closes
        the segment, whose file is then extended to its full size (a hole after the marker)."""
        seg = self._segment_for_write(base)
        if data:
            pwrite_all(seg.fd, data, start - base)
        seg.size = start - base + len(data)
        if closes:
            os.ftruncate(seg.fd, self.segment_bytes)
            seg.size = self.segment_bytes

    def _segment_for_write(self, base: int) -> _Segment:
        if self._segments and self._segments[-1].base == base:
            return self._segments[-1]
        require(not self._segments or base == self._segments[-1].base + self.segment_bytes,
                f"{self.directory}: a new segment at {base} does not follow the last one")
        path = os.path.join(self._cl_dir, _segment_name(base))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        seg = _Segment(base, path, fd, 0)
        self._segments.append(seg)
        fsync_dir(self._cl_dir)  # the new file's name must survive a crash
        return seg

    def _fail(self, why: str, exc: BaseException | None = None) -> TidelogError:
        """Stop serving after a failed write or sync: the files may hold a partial batch, which only
        recovery (a reopen) may judge. Nothing is acknowledged past the flushed offset meanwhile:
        every waiter fails, and every later call raises the same typed error. Returns it."""
        if self._failure is None:
            log.error("commit log %s stops: %s; reopen it to recover", self.directory, why)
            self._failed = why
            self._failure = store_error(f"the commit log stopped after a failed write ({why})", exc)
            self._waiters.fail_all(self._failure)
            for listener in list(self.failure_listeners):
                try:
                    listener(self._failure)
                except Exception:  # a listener must not hide the failure
                    log.exception("commit log failure listener failed")
        return self._failure

    @property
    def failure(self) -> TidelogError | None:
        """The typed error this log stopped with (DISK_FULL, STORE_ERROR), or None while it serves."""
        return self._failure

    # ------------------------------------------------------------------ dispatch

    def _dispatch_header(self, h: rec.Header, where: str) -> None:
        cq = self._cq(h.topic, h.queue_id)
        if h.queue_offset < cq.min_offset:
            return  # a record of a cut queue (deleted topic): never indexed again
        cq.put(h.queue_offset, h.phys_offset, h.size, rec.tags_hash(rec.tags_of(h.props)), where)

    # ------------------------------------------------------------------ flushing

    def _request_flush(self, offset: int, *, force: bool = False) -> None:
        if force or self.flush_mode == "sync":
            with self._cond:
                if offset > self._flush_requested:
                    self._flush_requested = offset
                    self._cond.notify()

    async def flushed(self, offset: int, *, now: bool = False, timeout: float | None = None) -> int:
        """Wait until fdatasync covers every byte below `offset`; returns the flushed offset.

        `now` asks the flusher to flush at once even in async mode (a write that must be durable
        before it is acknowledged, whatever the log's flush setting: ledger entries). `timeout`
        raises TimeoutError (pass it here, not through asyncio.wait_for: see OffsetWaiters.wait)."""
        if offset <= self._flushed:
            return self._flushed
        self._check_open()
        if offset > self._max:
            raise InvalidArgumentError(f"offset {offset} is beyond the max offset {self._max}")
        if now:
            self._request_flush(offset, force=True)
        # The flusher thread may finish a flush covering `offset` between the check above and
        # the registration: `reached` re-reads the flushed offset once the waiter is in place.
        return await self._waiters.wait(offset, timeout, reached=lambda: self._flushed)

    def flush(self) -> int:
        """Flush now, in the caller's thread; returns the flushed offset."""
        self._check_open()
        self._flush_once(sync_cqs=False)
        return self._flushed

    def _flush_loop(self) -> None:
        interval = self.flush_interval_ms / 1000.0 if self.flush_mode == "async" else self._checkpoint_interval
        next_periodic = time.monotonic() + interval
        while True:
            with self._cond:
                while not self._closed and self._flush_requested <= self._flushed:
                    wait = next_periodic - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
            if self._closed:
                return
            now = time.monotonic()
            periodic = now >= next_periodic
            if periodic:
                next_periodic = now + interval
            if self._failure is not None:
                time.sleep(0.05)
                continue
            try:
                self._flush_once(sync_cqs=now - self._last_cq_sync >= self._checkpoint_interval)
            except OSError as exc:
                # After a failed fdatasync the kernel may have dropped the dirty pages: what they
                # held is not known to be on disk, and retrying could report it durable. Stop.
                self._fail(f"flush failed: {exc}", exc)
            except Exception as exc:  # a bug: keep flushing; waiters stay pending and the next round retries
                stop_if_violated(exc)
                log.exception("flush of %s failed", self.directory)
                time.sleep(0.05)

    def _flush_once(self, *, sync_cqs: bool, clean: bool = False) -> None:
        with self._flush_lock:
            with self._lock:
                target = self._max
                segs = [s for s in self._segments if s.base + s.size > self._flushed]
                cq_target = self._max
                cqs: list[ConsumeQueue] = []
                if sync_cqs or clean:
                    # consume-queue files are written here, not on every append: they are
                    # derived data, rebuilt from the commit log past the durable offset, which
                    # only moves once every queue's units are written and synced
                    for cq in list(self._cq_dirty):
                        cq.write_pending()
                        self._cq_dirty.discard(cq)
                    cqs = list(self._cqs.values())
            if target > self._flushed:
                self._sync_segments(segs)
                require(target <= self._max, f"{self.directory}: flushed offset {target} would pass the max {self._max}")
                self._flushed = target
            if cqs or clean:
                for cq in cqs:
                    cq.sync()
                self._cq_durable = cq_target
                self._last_cq_sync = time.monotonic()
            self._write_checkpoint(clean=clean)
        self._waiters.release(self._flushed)

    def _sync_segments(self, segs: Iterable[_Segment]) -> None:
        for seg in segs:
            os.fdatasync(seg.fd)

    def _write_checkpoint(self, *, clean: bool) -> None:
        state = (self._flushed, self._confirm, self._cq_durable)
        if state == self._last_cp_state and not clean:
            return
        self._checkpoint.write(*state, clean=clean)
        self._last_cp_state = state

    # ------------------------------------------------------------------ reads

    def _segment_index(self, offset: int) -> int:
        return (offset - self._segments[0].base) // self.segment_bytes

    def _pread(self, offset: int, n: int) -> tuple[bytes, _Segment]:
        seg = self._segments[self._segment_index(offset)]
        data = os.pread(seg.fd, n, offset - seg.base)
        if len(data) != n:
            raise DataUnavailableError(f"{seg.path} holds {len(data)} of {n} bytes at offset {offset}")
        return data, seg

    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int | None = None, *, confirmed_only: bool = True) -> list[rec.StoredMessage]:
        """Messages of (topic, queue) from `queue_offset`, in order, never past the confirm offset.

        An empty list means "not yet written or not yet confirmed"; an offset below retention,
        or a record that cannot be read back intact, raises instead. `confirmed_only=False`
        reads to the end of the log: for the broker's own indexes (ledger recovery must see what
        a replica holds, confirmed or not), never for client reads.
        """
        self._check_open()
        check_topic_queue(topic, queue_id)
        if not isinstance(queue_offset, int) or queue_offset < 0:
            raise InvalidArgumentError(f"queue offset must be a non-negative integer, not {queue_offset!r}")
        if not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgumentError(f"max_count must be a positive integer, not {max_count!r}")
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return []
        cq.check_readable(queue_offset)
        end = min(cq.confirmed_end(self._confirm) if confirmed_only else cq.next_offset,
                  queue_offset + max_count)
        if queue_offset >= end:
            return []
        budget = max_bytes if max_bytes is not None else 1 << 62
        out: list[rec.StoredMessage] = []
        i = queue_offset
        while i < end:
            phys, size, _ = cq.unit(i)
            if phys < self.min_offset:
                raise OffsetBelowRetentionError(i, cq.min_offset, what=f"queue offset of {topic}/{queue_id}")
            # coalesce records that are contiguous in the log into one read
            run_end = i + 1
            span = size
            seg_end = phys - phys % self.segment_bytes + self.segment_bytes
            while run_end < end and span < budget:
                nphys, nsize, _ = cq.unit(run_end)
                if nphys != phys + span or nphys + nsize > seg_end:
                    break
                span += nsize
                run_end += 1
            data, seg = self._pread(phys, span)
            pos = 0
            while pos < span:
                kind, rsize, reason = rec.check_at(data, pos)
                if kind != rec.VALID:
                    raise CorruptRecordError(seg.path, phys + pos, reason or "no record where the index points",
                                             size=cq.unit(i)[1])
                m = rec.decode(data, pos)
                if m.topic != topic or m.queue_id != queue_id or m.queue_offset != i:
                    raise CorruptRecordError(seg.path, phys + pos, "index points at another queue's record")
                if out and budget - m.size < 0:
                    return out
                budget -= m.size
                out.append(m)
                pos += rsize
                i += 1
        return out

    def tail(self, topic: str, queue_id: int, start: int, batch: int = 256) -> Iterator[rec.StoredMessage]:
        """Every record of (topic, queue) from queue offset `start` to the end of the log, confirmed
        or not (for the broker's own indexes folded from internal topics); records that retention
        removed are skipped."""
        while True:
            try:
                msgs = self.read(topic, queue_id, start, batch, confirmed_only=False)
            except OffsetBelowRetentionError as exc:
                start = max(exc.min_offset, start + 1)
                continue
            if not msgs:
                return
            yield from msgs
            start = msgs[-1].queue_offset + 1

    def read_at(self, phys_offset: int) -> rec.StoredMessage:
        """The record at a physical offset (any record kind), CRC-checked."""
        self._check_open()
        if phys_offset < self.min_offset:
            raise OffsetBelowRetentionError(phys_offset, self.min_offset)
        if phys_offset >= self._max:
            raise InvalidArgumentError(f"offset {phys_offset} is at or beyond the max offset {self._max}")
        head, seg = self._pread(phys_offset, 8)
        size, magic = rec.BLANK.unpack(head)
        if magic != rec.MAGIC:
            raise InvalidArgumentError(f"offset {phys_offset} is not the start of a record")
        data, seg = self._pread(phys_offset, size)
        kind, _, reason = rec.check_at(data, 0)
        if kind != rec.VALID:
            raise CorruptRecordError(seg.path, phys_offset, reason)
        return rec.decode(data)

    def queue_offsets(self, topic: str, queue_id: int) -> QueueOffsets:
        check_topic_queue(topic, queue_id)
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return QueueOffsets(0, 0, 0)
        return QueueOffsets(cq.min_offset, cq.next_offset, cq.confirmed_end(self._confirm))

    def queues(self) -> list[tuple[str, int]]:
        return sorted(self._cqs)

    # ------------------------------------------------------------------ raw replication

    def read_raw(self, phys_offset: int, max_bytes: int) -> bytes:
        """Whole records from `phys_offset`, at most `max_bytes` (at least one record).

        Never crosses a segment: at a segment's end it returns the 8-byte blank marker (whose
        declared size covers the rest of the segment) and the next call starts at the next
        segment. Returns b"" at or beyond the max offset ("not yet written").
        """
        return self.read_raw_chunk(phys_offset, max_bytes)[0]

    def read_raw_chunk(self, phys_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """`read_raw`, plus the offset where the next chunk starts."""
        self._check_open()
        if not isinstance(phys_offset, int) or phys_offset < 0 or max_bytes < 1:
            raise InvalidArgumentError("read_raw takes a non-negative offset and a positive size")
        if phys_offset >= self._max:
            return b"", phys_offset
        if phys_offset < self.min_offset:
            raise OffsetBelowRetentionError(phys_offset, self.min_offset)
        seg = self._segments[self._segment_index(phys_offset)]
        in_seg = phys_offset - seg.base
        avail = min(seg.size, self._max - seg.base) - in_seg
        want = min(max(max_bytes, rec.HEADER_SIZE), avail)
        data = os.pread(seg.fd, want, in_seg)
        pos = 0
        while pos + 8 <= len(data):
            size, magic = rec.BLANK.unpack_from(data, pos)
            if magic == rec.BLANK_MAGIC:
                return data[: pos + rec.BLANK_SIZE], seg.base + self.segment_bytes
            if magic != rec.MAGIC:
                raise CorruptRecordError(seg.path, phys_offset + pos, f"bad magic 0x{magic:08x}"
                                         + (" (not a record boundary?)" if pos == 0 else ""))
            if pos + size > len(data):
                if pos == 0:  # a single record larger than max_bytes: return it whole
                    data = os.pread(seg.fd, size, in_seg)
                    if len(data) != size:
                        raise DataUnavailableError(f"{seg.path} is short at offset {phys_offset}")
                    return data, phys_offset + size
                break
            pos += size
        return data[:pos], phys_offset + pos

    def append_raw(self, phys_offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append bytes copied from a master, at exactly the current max offset.

        Every record is validated (length, magic, CRC, its own physical offset, segment fit)
        before any byte is written; a blank marker must close the segment exactly. Returns the new
        max offset.
        """
        self._check_open()
        if phys_offset != self._max:
            raise OffsetMismatchError(f"raw append at {phys_offset}, but the max offset is {self._max}",
                                      expected=self._max)
        data = bytes(data)
        seg_bytes = self.segment_bytes
        # (segment base, offset of the chunk's first byte, data from, data to, closes segment)
        chunks: list[tuple[int, int, int, int, bool]] = []
        units: list[tuple[bytes, int, int, int, int, bytes]] = []  # topic, queue, qoff, phys, size, props
        mv = memoryview(data)
        n = len(data)
        header, size_magic, magic_ok, blank_magic = rec.HEADER, rec.BLANK, rec.MAGIC, rec.BLANK_MAGIC
        hsize = rec.HEADER_SIZE
        pos = 0
        at = phys_offset  # where data[pos] lands
        chunk_from, chunk_at = 0, at
        # One header unpack and one CRC per record: this loop is the slave's hot path.
        while pos < n:
            in_seg = at % seg_bytes
            size, magic = size_magic.unpack_from(data, pos) if n - pos >= 8 else (0, 0)
            if magic == blank_magic:
                if size != seg_bytes - in_seg:
                    raise CorruptRecordError("<replicated data>", at,
                                             f"blank marker declares {size} bytes, {seg_bytes - in_seg} left")
                pos += rec.BLANK_SIZE
                chunks.append((at - in_seg, chunk_at, chunk_from, pos, True))
                at = at - in_seg + seg_bytes
                chunk_from, chunk_at = pos, at
                continue
            if magic != magic_ok or size < hsize or pos + size > n:
                raise CorruptRecordError("<replicated data>", at, rec.check_at(data, pos)[2] or "truncated record")
            (_, _, crc, _, tlen, qid, _, qoff, phys, _, _, plen, blen) = header.unpack_from(data, pos)
            if hsize + tlen + plen + blen != size or crc32c(mv[pos + 12 : pos + size]) != crc:
                raise CorruptRecordError("<replicated data>", at, rec.check_at(data, pos)[2] or "damaged record")
            if phys != at:
                raise OffsetMismatchError(f"record at {at} says it belongs at {phys}")
            if in_seg + size + rec.BLANK_SIZE > seg_bytes:
                raise CorruptRecordError("<replicated data>", at, "record does not fit in its segment")
            t = pos + hsize
            units.append((data[t : t + tlen], qid, qoff, phys, size, data[t + tlen : t + tlen + plen] if plen else b""))
            pos += size
            at += size
        mv.release()
        if chunk_from < n:
            chunks.append((chunk_at - chunk_at % seg_bytes, chunk_at, chunk_from, n, False))
        with self._lock:
            try:
                for base, start, dfrom, dto, closes in chunks:
                    self._write_chunk(base, start, data[dfrom:dto], closes)
            except OSError as exc:
                raise self._fail(f"raw append at {phys_offset} failed: {exc}", exc) from exc
            where = self._cl_dir
            names: dict[bytes, str] = {}
            for tbytes, qid, qoff, phys, size, props in units:
                topic = names.get(tbytes)
                if topic is None:
                    topic = names[tbytes] = tbytes.decode()
                cq = self._cq(topic, qid)
                cq.put(qoff, phys, size, rec.tags_hash(rec.tags_of(props)) if props else 0, where)
                self._cq_dirty.add(cq)
            self._max = at
        return self._max

    # ------------------------------------------------------------------ repair

    def repair_range(self, offset: int, data: bytes) -> None:
        """Overwrite damaged bytes in place with a copy from another replica, and fsync them.

        Replicas are byte-identical below the confirm offset, so the copy must be whole valid
        records whose physical offsets are exactly where they land, inside one segment and below
        this log's confirm offset; anything else is refused without writing a byte.
        """
        self._check_open()
        end = offset + len(data)
        if not data or offset < self.min_offset or end > self._confirm:
            raise InvalidArgumentError(f"repair [{offset}, {end}) is outside [{self.min_offset}, confirm "
                                       f"{self._confirm})")
        if offset // self.segment_bytes != (end - 1) // self.segment_bytes:
            raise InvalidArgumentError(f"repair [{offset}, {end}) crosses a segment boundary")
        pos = 0
        while pos < len(data):
            kind, size, reason = rec.check_at(data, pos)
            if kind != rec.VALID:
                raise CorruptRecordError("<repair data>", offset + pos, reason or "not a record")
            if rec.decode_header(data, pos).phys_offset != offset + pos:
                raise OffsetMismatchError(f"repair data at {offset + pos} holds the record of another offset")
            pos += size
        with self._flush_lock, self._lock:
            seg = self._segments[self._segment_index(offset)]
            try:
                pwrite_all(seg.fd, data, offset - seg.base)
                os.fdatasync(seg.fd)
            except OSError as exc:
                raise self._fail(f"repair at {offset} failed: {exc}", exc) from exc
        log.warning("repaired %s bytes [%d, %d) from another replica", seg.path, offset, end)

    # ------------------------------------------------------------------ truncation

    def truncate(self, phys_offset: int) -> None:
        """Durably drop every record at and beyond `phys_offset` (fork repair).

        Consume-queue units and epoch entries go with them; the confirm and flushed offsets are
        lowered to the cut. The offset must be a record boundary. Truncate listeners run first,
        so state derived from the log (ledger fences) is made safe before records disappear.
        """
        self._check_open()
        if phys_offset >= self._max:
            return
        for listener in list(self.truncate_listeners):
            listener(phys_offset)
        if phys_offset < self.min_offset:
            raise OffsetBelowRetentionError(phys_offset, self.min_offset, what="truncation offset")
        if phys_offset % self.segment_bytes:
            head, seg = self._pread(phys_offset, 8)
            _, magic = rec.BLANK.unpack(head)
            if magic not in (rec.MAGIC, rec.BLANK_MAGIC):
                raise OffsetMismatchError(f"truncation offset {phys_offset} is not a record boundary")
        with self._flush_lock, self._lock:
            log.warning("truncating %s at offset %d (max was %d)", self.directory, phys_offset, self._max)
            idx = self._segment_index(phys_offset)
            while len(self._segments) > idx + 1:
                seg = self._segments.pop()
                os.close(seg.fd)
                os.unlink(seg.path)
            seg = self._segments[idx]
            os.ftruncate(seg.fd, phys_offset - seg.base)
            os.fsync(seg.fd)
            seg.size = phys_offset - seg.base
            fsync_dir(self._cl_dir)
            for cq in self._cqs.values():
                cq.truncate_phys(phys_offset)
                cq.write_pending()
                cq.sync()
            self._cq_dirty.clear()
            self.epochs.truncate_suffix(phys_offset)
            self._max = phys_offset
            self._confirm = min(self._confirm, phys_offset)
            self._flushed = min(self._flushed, phys_offset)
            self._cq_durable = min(self._cq_durable, phys_offset)
            self._write_checkpoint(clean=False)

    # ------------------------------------------------------------------ cut queues (deleted topics)

    def cut_queue(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """Make the queue offsets of (topic, queue) below `queue_offset` unreadable for good: their
        consume-queue units go now, with every file that held only them (an empty file keeps
        the queue's start); the records stay in their segments until retention deletes those.
        The queue continues at its next offset. Idempotent; a queue absent here is left alone."""
        self._check_open()
        check_topic_queue(topic, queue_id)
        cq = self._cqs.get((topic, queue_id))
        if cq is None or queue_offset <= cq.min_offset:
            return  # decided without the locks: only the owner's thread changes queues' starts
        with self._flush_lock, self._lock:
            cq.cut(queue_offset)
            fsync_dir(cq.dir)
        log.info("cut %s/%d below queue offset %d in %s", topic, queue_id, queue_offset, self.directory)

    def drop_queues(self, topic: str) -> None:
        """Forget every consume queue of `topic`, files included; each starts again at the queue
        offset of the next record of the topic appended or dispatched. For when the record that
        cut them is about to be truncated away: where they start is no longer known."""
        self._check_open()
        with self._flush_lock, self._lock:
            for key in [k for k in self._cqs if k[0] == topic]:
                cq = self._cqs.pop(key)
                self._cq_dirty.discard(cq)
                cq.close()
                shutil.rmtree(cq.dir, ignore_errors=True)
            if os.path.isdir(self._cq_dir):
                fsync_dir(self._cq_dir)
        log.warning("dropped the consume queues of %s in %s", topic, self.directory)

    # ------------------------------------------------------------------ retention

    def delete_expired(self, *, now_ms: int | None = None, max_age_ms: int | None = None,
                       max_total_bytes: int | None = None, keep_from: int | None = None) -> int:
        """Delete whole segments older than `max_age_ms` or beyond `max_total_bytes`.

        The active (last) segment is never deleted, nor a segment holding any byte at or above
        `keep_from` (an offset a replica or consumer still needs). Returns the new min offset.
        """
        self._check_open()
        now = int(self._clock() * 1000) if now_ms is None else now_ms
        with self._flush_lock, self._lock:
            doomed = 0
            total = sum(s.size for s in self._segments)
            for seg in self._segments[:-1]:
                seg_end = seg.base + self.segment_bytes
                if keep_from is not None and seg_end > keep_from:
                    break
                old = max_age_ms is not None and now - int(os.fstat(seg.fd).st_mtime * 1000) > max_age_ms
                big = max_total_bytes is not None and total > max_total_bytes
                if not (old or big):
                    break
                doomed += 1
                total -= seg.size
            if not doomed:
                return self.min_offset
            for seg in self._segments[:doomed]:
                os.close(seg.fd)
                os.unlink(seg.path)
                log.info("retention deleted %s", seg.path)
            del self._segments[:doomed]
            fsync_dir(self._cl_dir)
            new_min = self._segments[0].base
            for cq in self._cqs.values():
                cq.trim_below(new_min)
            self.epochs.truncate_prefix(new_min)
            self._confirm = max(self._confirm, min(new_min, self._max))
            require(self.min_offset <= self._confirm <= self._max,
                    f"{self.directory}: after retention min {self.min_offset}, confirm {self._confirm}, max {self._max}")
            return new_min
