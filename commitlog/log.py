"""The commit log: one broker's physical log of records, its consume queues, epochs and recovery.

`CommitLog` is the façade; each job lives in its own module, working on the shared `LogCore`
(commitlog/core.py):

    segments.py     segment files: naming, positional reads and writes, cutting
    offsets.py      max / flushed / confirm / consume-queue offsets and their invariants
    queues.py       the consume-queue index (one ConsumeQueue per topic and queue)
    recovery.py     the scan at open: torn tails cut, corruption below the flushed offset refused
    append.py       the append path: lay out, encode with record.py, write, index
    flusher.py      group commit: the flusher thread, fdatasync, checkpoints
    reads.py        reads by queue offset, by physical offset, by store time, raw chunks for replication
    replication.py  raw appends of bytes copied from a master
    truncation.py   truncation (fork repair)
    repair.py       in-place repair of damaged bytes from another replica
    retention.py    deletion of whole old segments
    keyindex.py     the key index files (hash of topic and key -> physical offsets)
    lookups.py      lookups by queue offset, message id and key; the key indexer thread

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
  `flush_interval_ms`. The core's `flush_lock` keeps truncation and retention from closing a file
  under a running fdatasync; its `lock` guards the segment list.
- Visibility. Appended bytes are visible to `read_raw` at once (replication streams them);
  `read` by queue offset never returns a record that ends past `confirm_offset`, which the owner
  (the HA layer) sets. Consume-queue units are written for every record at append time; readers
  are clamped, and truncation cuts the units together with the records.
- Durability. The checkpoint records the flushed offset after every flush. Recovery scans from
  the segment holding min(checkpointed flushed offset, durable consume-queue offset): damage at
  or above the flushed offset is a torn tail and is cut; damage below it is corruption and stops
  the open with the file and offset named. Reads verify every record's CRC, so damage in an
  older segment that recovery did not scan is still an error, never a silent gap.
- Keys. A thread of its own (`lookups.KeyIndexer`) reads what was written since the key index's
  end and indexes the keyed user messages; a lookup by key first brings the index up to the
  confirm offset. The index is derived data: recovery cuts it back to the log's end, and a
  damaged one is rebuilt from the log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence

from tidelog.commitlog import lookups, reads, recovery, repair, replication, retention, truncation, verify
from tidelog.commitlog import record as rec
from tidelog.commitlog.append import Placement, append_batch, append_encoded
from tidelog.commitlog.batch import check_batch
from tidelog.commitlog.consumequeue import check_topic_queue
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.epochs import EpochFile
from tidelog.commitlog.fileio import store_error
from tidelog.commitlog.flusher import Flusher
from tidelog.commitlog.keyindex import DEFAULT_CAPACITY, DEFAULT_SLOTS
from tidelog.commitlog.queues import QueueOffsets
from tidelog.commitlog.retentionpolicy import SegmentInfo
from tidelog.errors import (
    ConfigError,
    InvalidArgumentError,
    OffsetBelowRetentionError,
    StoreClosedError,
    TidelogError,
)

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 1 << 30
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
MIN_SEGMENT_BYTES = 4096
KEY_INDEX_INTERVAL_MS = 200  # how often the indexer looks for new records
NO_END = (1 << 63) - 1
# descriptors all consume queues together hold open: far below a default `ulimit -n` of 4096+
# once segments, index files and sockets are counted, while a reader's queue stays open
DEFAULT_CQ_MAX_OPEN_FILES = 1024
MIN_CQ_OPEN_FILES = 16

__all__ = ["CommitLog", "Placement", "QueueOffsets"]


class CommitLog:
    """A broker's commit log. Create with `CommitLog.open(directory, ...)`."""

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int,
        flush: str,
        flush_interval_ms: int,
        max_message_bytes: int,
        cq_units_per_file: int,
        cq_max_open_files: int,
        checkpoint_interval_ms: int,
        clock: Callable[[], float],
        key_index_slots: int = DEFAULT_SLOTS,
        key_index_entries: int = DEFAULT_CAPACITY,
    ) -> None:
        if flush not in ("sync", "async"):
            raise ConfigError(f"flush must be 'sync' or 'async', not {flush!r}")
        if segment_bytes < MIN_SEGMENT_BYTES:
            raise ConfigError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
        if cq_max_open_files < MIN_CQ_OPEN_FILES:
            # a queue holds up to three at once (its append file and two it reads): fewer would
            # have queues close each other's on every read
            raise ConfigError(f"cq_max_open_files must be at least {MIN_CQ_OPEN_FILES}")
        if max_message_bytes + rec.BLANK_SIZE > segment_bytes:
            max_message_bytes = segment_bytes - rec.BLANK_SIZE
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.flush_mode = flush
        self.flush_interval_ms = flush_interval_ms
        self.max_message_bytes = max_message_bytes
        self._core = LogCore(
            directory,
            segment_bytes=segment_bytes,
            sync_flush=flush == "sync",
            max_message_bytes=max_message_bytes,
            cq_units_per_file=cq_units_per_file,
            cq_max_open_files=cq_max_open_files,
            clock=clock,
            key_index_slots=key_index_slots,
            key_index_entries=key_index_entries,
        )
        checkpoint_interval = checkpoint_interval_ms / 1000.0
        # async mode flushes every flush_interval_ms; sync mode wakes on demand, and at checkpoints
        interval = flush_interval_ms / 1000.0 if flush == "async" else checkpoint_interval
        self._flusher = Flusher(self._core, interval=interval, checkpoint_interval=checkpoint_interval)
        self._indexer = lookups.KeyIndexer(
            self._core, interval=KEY_INDEX_INTERVAL_MS / 1000, sync_interval=checkpoint_interval
        )
        # called with the cut offset at the start of every truncate(), before anything is removed
        self.truncate_listeners: list[Callable[[int], None]] = []

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        flush: str = "async",
        flush_interval_ms: int = 500,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        cq_units_per_file: int = 300_000,
        cq_max_open_files: int = DEFAULT_CQ_MAX_OPEN_FILES,
        checkpoint_interval_ms: int = 1000,
        full_scan: bool = False,
        clock: Callable[[], float] = time.time,
        key_index_slots: int = DEFAULT_SLOTS,
        key_index_entries: int = DEFAULT_CAPACITY,
    ) -> CommitLog:
        """Open (creating if needed) and recover the log in `directory`. The key index has
        `key_index_slots` hash slots per file (4 bytes each, in memory for the active file) and
        `key_index_entries` entries per file (commitlog/FORMAT.md "Key index")."""
        self = cls(
            os.fspath(directory),
            segment_bytes=segment_bytes,
            flush=flush,
            flush_interval_ms=flush_interval_ms,
            max_message_bytes=max_message_bytes,
            cq_units_per_file=cq_units_per_file,
            cq_max_open_files=cq_max_open_files,
            checkpoint_interval_ms=checkpoint_interval_ms,
            clock=clock,
            key_index_slots=key_index_slots,
            key_index_entries=key_index_entries,
        )
        try:
            recovery.recover(self._core, full_scan)
        except OSError as exc:
            # Recovery writes too (the consume-queue units it rebuilds, the checkpoint): a full
            # disk refuses the open with the same typed error an append gets, nothing is lost.
            self._core.close_files()
            raise store_error(f"cannot open the commit log in {directory}: {exc}", exc) from exc
        except BaseException:
            self._core.close_files()
            raise
        self._flusher.start()
        self._indexer.start()
        return self

    def close(self) -> None:
        """Flush everything, record a clean shutdown and release the files."""
        core = self._core
        if core.closed:
            return
        core.closed = True
        self._indexer.stop()
        self._flusher.stop()
        try:
            core.keys.sync(clean=True)
        except OSError as exc:  # derived data: the next open repairs or rebuilds it
            log.warning("key index of %s not synced at close: %s", self.directory, exc)
        try:
            if core.failure is None:
                self._flusher.flush_once(sync_cqs=True, clean=True)
        finally:
            core.waiters.fail_all(StoreClosedError("the commit log was closed"))
            core.close_files()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ offsets

    @property
    def min_offset(self) -> int:
        return self._core.min_offset

    @property
    def max_offset(self) -> int:
        return self._core.offsets.max

    @property
    def flushed_offset(self) -> int:
        return self._core.offsets.flushed

    @property
    def confirm_offset(self) -> int:
        return self._core.offsets.confirm

    @confirm_offset.setter
    def confirm_offset(self, value: int) -> None:
        if not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"confirm offset must be a non-negative integer, not {value!r}")
        self._core.offsets.advance_confirm(value)

    @property
    def epochs(self) -> EpochFile:
        return self._core.epochs

    @property
    def last_epoch(self) -> int:
        return self._core.epochs.last_epoch

    @property
    def recovered_clean(self) -> bool:
        """Whether this open found the last shutdown clean (a new log counts as clean). After a
        crash, writes past the flushed offset may be gone here while a slave holds them."""
        return self._core.recovered_clean

    @property
    def failure(self) -> TidelogError | None:
        """The typed error this log stopped with (DISK_FULL, STORE_ERROR), or None while it serves."""
        return self._core.failure

    @property
    def failure_listeners(self) -> list[Callable[[TidelogError], None]]:
        """Called (from any thread) with the typed error when a write or sync fails."""
        return self._core.failure_listeners

    @property
    def flush_listeners(self) -> list[Callable[[float, int], None]]:
        """Called from the flusher thread after each fdatasync with (seconds it took, bytes it made
        durable); they must be quick and must not raise."""
        return self._core.flush_listeners

    # ------------------------------------------------------------------ append and flush

    def append(self, messages: Sequence[rec.Message], *, now_ms: int | None = None) -> list[Placement]:
        """Append a batch; returns where each record landed, in order.

        The batch is validated whole before anything is written. The records are visible to
        `read_raw` on return; `await flushed(end of the last record)` waits for durability.
        """
        core = self._core
        core.check_open()
        if not messages:
            return []
        store_ts = int(core.clock() * 1000) if now_ms is None else now_ms
        with core.lock:
            return append_batch(core, messages, store_ts)

    def append_encoded(
        self, topic: str, queue_id: int, batch: bytearray, count: int
    ) -> tuple[int, list[int]]:
        """Append a producer's record batch (commitlog/batch.py): every record is checked before
        anything is written, then stamped in `batch` itself (queue and physical offsets, epoch,
        store time, CRC) and written as it is. Returns (first queue offset, physical offset of each
        record)."""
        core = self._core
        core.check_open()
        check_topic_queue(topic, queue_id)
        checked = check_batch(batch, topic.encode(), queue_id, count, core.max_message_bytes)
        if not checked:
            raise InvalidArgumentError("a record batch needs at least one record")
        store_ts = int(core.clock() * 1000)
        with core.lock:
            return append_encoded(core, topic, queue_id, batch, checked, store_ts)

    async def flushed(self, offset: int, *, now: bool = False, timeout: float | None = None) -> int:
        """Wait until fdatasync covers every byte below `offset`; returns the flushed offset.

        `now` asks the flusher to flush at once even in async mode (a write that must be durable
        before it is acknowledged, whatever the log's flush setting: ledger entries). `timeout`
        raises TimeoutError (pass it here, not through asyncio.wait_for: see OffsetWaiters.wait)."""
        core = self._core
        offsets = core.offsets
        if offset <= offsets.flushed:
            return offsets.flushed
        core.check_open()
        if offset > offsets.max:
            raise InvalidArgumentError(f"offset {offset} is beyond the max offset {offsets.max}")
        if now:
            core.flush_requests.request(offset, force=True)
        # The flusher thread may finish a flush covering `offset` between the check above and
        # the registration: `reached` re-reads the flushed offset once the waiter is in place.
        return await core.waiters.wait(offset, timeout, reached=lambda: offsets.flushed)

    def flush(self) -> int:
        """Flush now, in the caller's thread; returns the flushed offset."""
        self._core.check_open()
        self._flusher.flush_once(sync_cqs=False)
        return self._core.offsets.flushed

    # ------------------------------------------------------------------ reads

    def read(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_count: int = 32,
        max_bytes: int | None = None,
        *,
        confirmed_only: bool = True,
    ) -> list[rec.StoredMessage]:
        """Messages of (topic, queue) from `queue_offset`, in order, never past the confirm offset.

        An empty list means "not yet written or not yet confirmed"; an offset below retention,
        or a record that cannot be read back intact, raises instead. `confirmed_only=False`
        reads to the end of the log: for the broker's own indexes (ledger recovery must see what
        a replica holds, confirmed or not), never for client reads.
        """
        return reads.read(self._core, topic, queue_id, queue_offset, max_count, max_bytes, confirmed_only)

    def read_encoded(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int
    ) -> tuple[bytes, int]:
        """The stored bytes of confirmed records of (topic, queue) from `queue_offset` (as `read`
        would return them, CRC-checked), and how many records they hold."""
        return reads.read_encoded(self._core, topic, queue_id, queue_offset, max_count, max_bytes)

    def tail(
        self, topic: str, queue_id: int, start: int, batch: int = 256, *, confirmed_only: bool = False
    ) -> Iterator[rec.StoredMessage]:
        """Every record of (topic, queue) from queue offset `start` to the end of the log, confirmed
        or not (for the broker's own indexes folded from internal topics; `confirmed_only`: up to
        the confirm offset); records that retention removed are skipped."""
        while True:
            try:
                msgs = self.read(topic, queue_id, start, batch, confirmed_only=confirmed_only)
            except OffsetBelowRetentionError as exc:
                start = max(exc.min_offset, start + 1)
                continue
            if not msgs:
                return
            yield from msgs
            start = msgs[-1].queue_offset + 1

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first confirmed queue offset of (topic, queue) whose record was stored at or after
        `timestamp_ms` (epoch ms), or the queue's confirmed end when none was: where a group
        reset to that time starts (RocketMQ's searchOffset). A binary search over the consume
        queue reading each probed record's store time, so O(log n) record reads."""
        return reads.offset_for_time(self._core, topic, queue_id, timestamp_ms)

    def read_at(self, phys_offset: int) -> rec.StoredMessage:
        """The record at a physical offset (any record kind), CRC-checked."""
        return reads.read_at(self._core, phys_offset)

    # ------------------------------------------------------------------ lookups

    def message_in_queue(self, topic: str, queue_id: int, queue_offset: int) -> bytes:
        """The stored bytes of the confirmed message at `queue_offset` of (topic, queue):
        MESSAGE_NOT_FOUND past the confirmed end, OFFSET_BELOW_RETENTION below the start."""
        return lookups.in_queue(self._core, topic, queue_id, queue_offset)

    def message_at(self, phys_offset: int) -> bytes:
        """The stored bytes of the confirmed user message starting at `phys_offset` (the offset a
        message id names); MESSAGE_NOT_FOUND where no such message starts (commitlog/lookups.py)."""
        return lookups.at_offset(self._core, phys_offset)

    def find_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ts: int = 0,
        end_ts: int = NO_END,
        max_results: int = 32,
        max_bytes: int = 4 << 20,
    ) -> tuple[list[bytes], bool]:
        """The stored bytes of the confirmed messages of `topic` with `key` stored within
        [begin_ts, end_ts] (ms), newest first, within the limits (at least one message when any
        matches); and whether more may match. Blocks while the key index catches up: call it
        off the event loop."""
        return lookups.by_key(self._core, topic, key, begin_ts, end_ts, max_results, max_bytes)

    def index_keys(self) -> None:
        """Bring the key index up to the end of the log now (the indexer does so every
        `KEY_INDEX_INTERVAL_MS`), and sync it."""
        lookups.catch_up(self._core)
        self._core.keys.sync()

    def queue_offsets(self, topic: str, queue_id: int) -> QueueOffsets:
        return self._core.queues.offsets(topic, queue_id, self._core.offsets.confirm)

    def queues(self) -> list[tuple[str, int]]:
        return self._core.queues.keys()

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
        return reads.read_raw_chunk(self._core, phys_offset, max_bytes)

    def raw_span(self, phys_offset: int, max_bytes: int) -> reads.RawSpan | None:
        """Where `read_raw_chunk`'s bytes lie in their segment file, when that is known without
        reading them (the chunk ends at a known append boundary, as a master's stream of recent
        appends does); None when the records must be walked, or at or beyond the max offset.
        For a sender that hands the bytes to the kernel (`os.sendfile`): valid until the next
        truncation or retention of this log, so use it before yielding to the event loop."""
        return reads.raw_span(self._core, phys_offset, max_bytes)

    def append_raw(self, phys_offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append bytes copied from a master, at exactly the current max offset.

        Every record is validated (length, magic, CRC, its own physical offset, segment fit)
        before any byte is written; a blank marker must close the segment exactly. Returns the new
        max offset.
        """
        return replication.append_raw(self._core, phys_offset, bytes(data))

    def start_at(self, offset: int) -> None:
        """Make an empty log begin at `offset`, a segment boundary (the master's min offset, when
        its retention deleted what lay below): min and max offsets become `offset`. Refused for a
        log that holds anything."""
        replication.start_at(self._core, offset)

    # ------------------------------------------------------------------ repair and truncation

    def scrub(self, offset: int, max_bytes: int) -> tuple[int, verify.Damage | None]:
        """Check about `max_bytes` of records from `offset` against their CRCs, below the stable
        end: (the next offset to check, the damage met). Safe on any thread (`verify.scrub_chunk`)."""
        return verify.scrub_chunk(self._core, offset, max_bytes)

    def repair_range(self, offset: int, data: bytes) -> None:
        """Overwrite damaged bytes in place with a copy from another replica, and fsync them.

        Replicas are byte-identical below the confirm offset, so the copy must be whole valid
        records whose physical offsets are exactly where they land, inside one segment and below
        this log's confirm offset; anything else is refused without writing a byte.
        """
        repair.repair_range(self._core, offset, data)

    def truncate(self, phys_offset: int) -> None:
        """Durably drop every record at and beyond `phys_offset` (fork repair).

        Consume-queue units and epoch entries go with them; the confirm and flushed offsets are
        lowered to the cut. The offset must be a record boundary. Truncate listeners run first,
        so state derived from the log (ledger fences) is made safe before records disappear.
        """
        truncation.truncate(self._core, phys_offset, self.truncate_listeners)

    # ------------------------------------------------------------------ cut queues (deleted topics)

    def cut_queue(self, topic: str, queue_id: int, queue_offset: int) -> None:
        """Make the queue offsets of (topic, queue) below `queue_offset` unreadable for good: their
        consume-queue units go now, with every file that held only them (an empty file keeps
        the queue's start); the records stay in their segments until retention deletes those.
        The queue continues at its next offset. Idempotent; a queue absent here is left alone."""
        core = self._core
        core.check_open()
        check_topic_queue(topic, queue_id)
        cq = core.queues.get(topic, queue_id)
        if cq is None or queue_offset <= cq.min_offset:
            return  # decided without the locks: only the owner's thread changes queues' starts
        with core.flush_lock, core.lock:
            core.queues.cut(cq, queue_offset)
        log.info("cut %s/%d below queue offset %d in %s", topic, queue_id, queue_offset, self.directory)

    def queue_unit_at(self, topic: str, queue_id: int, phys_offset: int) -> tuple[int, int | None]:
        """The first unit of (topic, queue) whose record starts at or after `phys_offset`: its
        queue offset and physical offset, or (the queue's next offset, None) when there is none.
        For per-topic retention (broker/retention.py), which cuts or holds a topic's queues by
        physical position. A queue absent here is (0, None)."""
        core = self._core
        core.check_open()
        check_topic_queue(topic, queue_id)
        with core.lock:  # the appender extends the units under it
            cq = core.queues.get(topic, queue_id)
            if cq is None:
                return 0, None
            return cq.unit_at(phys_offset)

    def drop_queues(self, topic: str) -> None:
        """Forget every consume queue of `topic`, files included; each starts again at the queue
        offset of the next record of the topic appended or dispatched. For when the record that
        cut them is about to be truncated away: where they start is no longer known."""
        core = self._core
        core.check_open()
        with core.flush_lock, core.lock:
            core.queues.drop_topic(topic)
        log.warning("dropped the consume queues of %s in %s", topic, self.directory)

    # ------------------------------------------------------------------ retention

    def delete_expired(
        self,
        *,
        now_ms: int | None = None,
        max_age_ms: int | None = None,
        max_total_bytes: int | None = None,
        keep_from: int | None = None,
    ) -> int:
        """Delete whole segments older than `max_age_ms` or beyond `max_total_bytes`.

        The active (last) segment is never deleted, nor a segment holding any byte at or above
        `keep_from` (an offset a replica or consumer still needs). Returns the new min offset.
        """
        self._core.check_open()
        now = int(self._core.clock() * 1000) if now_ms is None else now_ms
        return retention.delete_expired(self._core, now, max_age_ms, max_total_bytes, keep_from)

    def segment_infos(self) -> list[SegmentInfo]:
        """The segments, oldest first: (base, end, modification time in ms), for the retention rule
        (`commitlog/retentionpolicy.py`)."""
        return retention.segment_infos(self._core)

    def delete_before(self, offset: int) -> int:
        """Delete every segment whose bytes all lie below `offset` (never the active one); consume
        queues, the epoch file and the confirm offset follow as in `delete_expired`. The caller
        decided with the retention rule; returns the new min offset."""
        return retention.delete_before(self._core, offset)

    @property
    def recovery_floor(self) -> int:
        """The lowest offset a recovery after a crash would scan from (flushed and durable
        consume-queue offsets): retention keeps it."""
        offsets = self._core.offsets
        return min(offsets.flushed, offsets.cq_durable)
