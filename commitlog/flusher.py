"""Group commit: the one thread that fdatasyncs the log, writes consume queues and checkpoints.

In `sync` mode the thread wakes when someone awaits `flushed(offset)` (`FlushRequests.request`)
and flushes everything appended so far, so every appender that arrived during one fdatasync
shares the next one; in `async` mode it flushes every `flush_interval_ms`. Consume-queue files
are written and synced at checkpoints only (they are derived data, rebuilt from the log past the
durable offset). A failed fdatasync stops the log: the kernel may have dropped the dirty pages.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING

from tidelog.invariants import stop_if_violated

if TYPE_CHECKING:
    from tidelog.commitlog.core import LogCore

log = logging.getLogger(__name__)

#: Seconds between checkpoint records at least, outside checkpoints of the consume queues and clean
#: stops (each record is a write and an fdatasync of its own).
CHECKPOINT_MIN_INTERVAL = 0.05
#: A checkpoint writes a dirty consume queue only once its oldest unit written to no file is of a
#: record below the log's end at the checkpoint this many rounds back (`queues.due_split`): a busy
#: queue writes every CQ_ROUNDS + 1 checkpoints, and recovery scans at most that many intervals.
CQ_ROUNDS = 2
#: ... or once it holds this many units: a busy queue writes every round, as before, and a log of
#: a few busy queues leaves none behind (its recovery scans one interval, not CQ_ROUNDS + 1)
CQ_ENOUGH_UNITS = 64


class FlushRequests:
    """The highest offset someone waits to see flushed, and the condition the flusher sleeps on."""

    def __init__(self, sync_mode: bool) -> None:
        self.sync_mode = sync_mode
        self.cond = threading.Condition()
        self.requested = 0

    def request(self, offset: int, *, force: bool = False) -> None:
        """Wake the flusher for `offset`: always in sync mode, in async mode only when forced."""
        if force or self.sync_mode:
            with self.cond:
                if offset > self.requested:
                    self.requested = offset
                    self.cond.notify()

    def wake_all(self) -> None:
        with self.cond:
            self.cond.notify_all()


class Flusher:
    """The flusher thread of one log, and `flush_once`, which any thread may call."""

    def __init__(self, core: LogCore, *, interval: float, checkpoint_interval: float) -> None:
        self.core = core
        self.interval = interval  # seconds between periodic flushes
        self.checkpoint_interval = checkpoint_interval
        self._thread: threading.Thread | None = None
        self._last_cq_sync = 0.0
        self._last_checkpoint = 0.0
        # the log's end at the last CQ_ROUNDS checkpoints of the consume queues, oldest first
        self._cq_ends: collections.deque[int] = collections.deque(maxlen=CQ_ROUNDS)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"flush:{self.core.directory}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wake the thread and wait for it to end (the caller has set `core.closed`)."""
        self.core.flush_requests.wake_all()
        if self._thread is not None:
            self._thread.join()

    def _wait_for_work(self, next_periodic: float) -> None:
        core = self.core
        requests = core.flush_requests
        with requests.cond:
            while not core.closed and requests.requested <= core.offsets.flushed:
                wait = next_periodic - time.monotonic()
                if wait <= 0:
                    break
                requests.cond.wait(wait)

    def _loop(self) -> None:
        core = self.core
        next_periodic = time.monotonic() + self.interval
        while True:
            self._wait_for_work(next_periodic)
            if core.closed:
                return
            now = time.monotonic()
            if now >= next_periodic:
                next_periodic = now + self.interval
            if core.failure is not None:
                time.sleep(0.05)
                continue
            try:
                self.flush_once(sync_cqs=now - self._last_cq_sync >= self.checkpoint_interval, pace=True)
            except OSError as exc:
                # After a failed fdatasync the kernel may have dropped the dirty pages: what they
                # held is not known to be on disk, and retrying could report it durable. Stop.
                core.fail(f"flush failed: {exc}", exc)
            except Exception as exc:  # a bug: keep flushing; waiters stay pending and the next round retries
                stop_if_violated(exc)
                log.exception("flush of %s failed", core.directory)
                time.sleep(0.05)

    def flush_once(self, *, sync_cqs: bool, clean: bool = False, pace: bool = False) -> None:
        """fdatasync every byte appended so far and release its waiters; with `sync_cqs` or
        `clean`, also write and sync the consume queues (with `pace`, the flusher's own rounds,
        only those due: CQ_ROUNDS); then record the checkpoint (with `pace`, at most every
        `CHECKPOINT_MIN_INTERVAL`)."""
        core = self.core
        offsets = core.offsets
        with core.flush_lock:
            with core.lock:
                target = offsets.max
                segs = core.segments.unflushed(offsets.flushed)
                # the queues with units not in their files yet, taken under the lock so that none
                # of a record below `target` is missed; written below, outside it (appends go on:
                # with 10,000 active queues the writes take a tenth of a second)
                dirty, durable = None, target
                if clean or sync_cqs:
                    if clean or not pace:  # asked for: every queue (each unit is below the end)
                        cut = target + 1
                    else:  # the flusher's own round: the queues due (CQ_ROUNDS)
                        cut = self._cq_ends[0] if len(self._cq_ends) == CQ_ROUNDS else 0
                        self._cq_ends.append(target)
                    dirty, durable = core.queues.take_due(cut, target, CQ_ENOUGH_UNITS)
            if target > offsets.flushed:
                size, started = target - offsets.flushed, time.monotonic()
                core.segments.sync(segs)
                offsets.mark_flushed(target)
                # The bytes are on disk: their waiters go now, not after the checkpoint's own
                # fdatasync below (which would double what a `flush: sync` write waits for).
                core.waiters.release(target)
                for listener in core.flush_listeners:  # one call per fdatasync: the group commit's size
                    listener(time.monotonic() - started, size)
            if dirty is not None:
                # consume-queue files are written here, not on every append: the durable offset
                # only moves once every queue's units below `durable` are written and synced
                core.queues.sync(core.queues.write(dirty))
                offsets.cq_durable = durable
                self._last_cq_sync = time.monotonic()
            if clean or dirty is not None or not pace or self._checkpoint_due():
                core.write_checkpoint(clean=clean)
                self._last_checkpoint = time.monotonic()
        core.waiters.release(offsets.flushed)

    def _checkpoint_due(self) -> bool:
        """Whether a flush records the checkpoint. A checkpoint lagging the flushed offset only
        makes recovery scan a little more (it starts at the checkpoint, and intact records past it
        are kept), so a flusher woken for every `flush: sync` write records it at most every
        `CHECKPOINT_MIN_INTERVAL`; a periodic flush records what was deferred."""
        return time.monotonic() - self._last_checkpoint >= CHECKPOINT_MIN_INTERVAL
