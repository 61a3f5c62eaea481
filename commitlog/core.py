"""The state the parts of the commit log share, and the log's failure stop.

`LogCore` holds the configuration, the segment files, the offsets, the consume-queue index, the
key index, the epoch and checkpoint files, the two locks and the flush waiters; the façade
(`commitlog/log.py`) and the modules for each job (append, reads, replication, truncation,
repair, retention, recovery, flushing, lookups) work on it. Locks: `lock` guards the segment list and the offsets against the
flusher thread; `flush_lock` keeps truncation, repair and retention from closing or rewriting a
file under a running fdatasync.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Callable

from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.commitlog.epochs import EpochFile
from tidelog.commitlog.fileio import store_error
from tidelog.commitlog.flusher import FlushRequests
from tidelog.commitlog.keyindex import KeyIndex
from tidelog.commitlog.offsets import Offsets
from tidelog.commitlog.queues import QueueIndex
from tidelog.commitlog.segments import SegmentFiles
from tidelog.commitlog.waiters import OffsetWaiters
from tidelog.errors import StoreClosedError, TidelogError

log = logging.getLogger(__name__)


KEEP_ENDS = 1024  # recent append ends remembered (see LogCore.ends)


class LogCore:
    """One log's shared state. Created by `CommitLog`; `recovery.recover` opens its files."""

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int,
        sync_flush: bool,
        max_message_bytes: int,
        cq_units_per_file: int,
        cq_max_open_files: int,
        clock: Callable[[], float],
        key_index_slots: int,
        key_index_entries: int,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.segments = SegmentFiles(os.path.join(directory, "commitlog"), segment_bytes)
        self.queues = QueueIndex(
            os.path.join(directory, "consumequeue"), cq_units_per_file, cq_max_open_files
        )
        self.offsets = Offsets(directory)
        self.keys = KeyIndex(os.path.join(directory, "index"), key_index_slots, key_index_entries)
        self.lock = threading.RLock()
        self.flush_lock = threading.Lock()
        self.flush_requests = FlushRequests(sync_flush)
        self.waiters = OffsetWaiters(self.flush_requests.request)
        self.checkpoint: CheckpointFile | None = None
        # whether the open found the last shutdown clean (or no log at all): after a crash the
        # tail past the flushed offset may be gone, though a slave may already hold it
        self.recovered_clean = True
        self.epochs: EpochFile
        self.closed = False
        self.failure: TidelogError | None = None
        # called (from any thread) with the typed error when a write or sync fails
        self.failure_listeners: list[Callable[[TidelogError], None]] = []
        # where recent appends ended, ascending: record boundaries a raw read can stop at without
        # walking the records (the master's HA sender reads the newest bytes)
        self.ends: list[int] = []
        # called from the flusher thread with (seconds one fdatasync took, bytes it made durable)
        self.flush_listeners: list[Callable[[float, int], None]] = []
        self._last_cp_state: tuple[int, int, int] = (-1, -1, -1)

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset(self.offsets.max)

    def appended(self, end: int) -> None:
        """The log now ends at `end`, a record boundary, after an append (of any kind)."""
        self.offsets.max = end
        ends = self.ends
        ends.append(end)
        if len(ends) > 2 * KEEP_ENDS:
            del ends[:KEEP_ENDS]

    def boundary_in(self, start: int, end: int) -> int | None:
        """The last known record boundary in (start, end], or None."""
        ends = self.ends
        i = bisect.bisect_right(ends, end)
        return ends[i - 1] if i and ends[i - 1] > start else None

    def forget_ends_after(self, offset: int) -> None:
        """Truncation: boundaries beyond `offset` are no longer in the log."""
        self.ends = [e for e in self.ends if e <= offset]

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError("the commit log is closed")
        if self.failure is not None:
            raise self.failure

    def fail(self, why: str, exc: BaseException | None = None) -> TidelogError:
        """Stop serving after a failed write or sync: the files may hold a partial batch, which only
        recovery (a reopen) may judge. Nothing is acknowledged past the flushed offset meanwhile:
        every waiter fails, and every later call raises the same typed error. Returns it."""
        if self.failure is None:
            log.error("commit log %s stops: %s; reopen it to recover", self.directory, why)
            self.failure = store_error(f"the commit log stopped after a failed write ({why})", exc)
            self.waiters.fail_all(self.failure)
            for listener in list(self.failure_listeners):
                try:
                    listener(self.failure)
                except Exception:  # a listener must not hide the failure
                    log.exception("commit log failure listener failed")
        return self.failure

    def write_checkpoint(self, *, clean: bool) -> None:
        """Record the flushed, confirm and consume-queue offsets (skipped when none moved)."""
        o = self.offsets
        state = (o.flushed, o.confirm, o.cq_durable)
        if (state == self._last_cp_state and not clean) or self.checkpoint is None:
            return
        self.checkpoint.write(*state, clean=clean)
        self._last_cp_state = state

    def close_files(self) -> None:
        self.segments.close_all()
        self.queues.close_all()
        self.keys.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
