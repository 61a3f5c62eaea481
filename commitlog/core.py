"""The state the parts of the commit log share, and the log's failure stop.

`LogCore` holds the configuration, the segment files, the offsets, the consume-queue index, the
epoch and checkpoint files, the two locks and the flush waiters; the façade (`commitlog/log.py`)
and the modules for each job (append, reads, replication, truncation, repair, retention,
recovery, flushing) work on it. Locks: `lock` guards the segment list and the offsets against the
flusher thread; `flush_lock` keeps truncation, repair and retention from closing or rewriting a
file under a running fdatasync.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.commitlog.epochs import EpochFile
from tidelog.commitlog.fileio import store_error
from tidelog.commitlog.flusher import FlushRequests
from tidelog.commitlog.offsets import Offsets
from tidelog.commitlog.queues import QueueIndex
from tidelog.commitlog.segments import SegmentFiles
from tidelog.commitlog.waiters import OffsetWaiters
from tidelog.errors import StoreClosedError, TidelogError

log = logging.getLogger(__name__)


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
        clock: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.segments = SegmentFiles(os.path.join(directory, "commitlog"), segment_bytes)
        self.queues = QueueIndex(os.path.join(directory, "consumequeue"), cq_units_per_file)
        self.offsets = Offsets(directory)
        self.lock = threading.RLock()
        self.flush_lock = threading.Lock()
        self.flush_requests = FlushRequests(sync_flush)
        self.waiters = OffsetWaiters(self.flush_requests.request)
        self.checkpoint: CheckpointFile | None = None
        self.epochs: EpochFile
        self.closed = False
        self.failure: TidelogError | None = None
        # called (from any thread) with the typed error when a write or sync fails
        self.failure_listeners: list[Callable[[TidelogError], None]] = []
        # called from the flusher thread with (seconds one fdatasync took, bytes it made durable)
        self.flush_listeners: list[Callable[[float, int], None]] = []
        self._last_cp_state: tuple[int, int, int] = (-1, -1, -1)

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset(self.offsets.max)

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
        if self.checkpoint is not None:
            self.checkpoint.close()
