"""The consume-queue index of the commit log: one `ConsumeQueue` per (topic, queue), by name.

Owns the map of open queues, the set of queues with units not yet in their files (the flusher
takes it under the log lock and writes them at checkpoints outside it, while appends go on), a
descriptor on the queues' filesystem for syncing many at once, and the operations that touch
every queue at once: loading at
recovery, dispatching recovered or replicated records, cutting them with the log, and the cuts
of a deleted topic's queues (commitlog/FORMAT.md "Consume queue").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog.consumequeue import ConsumeQueue, DescriptorPool, check_topic_queue, sync_queues
from tidelog.commitlog.epochs import fsync_dir


class QueueOffsets(NamedTuple):
    min: int  # lowest readable queue offset (retention)
    max: int  # next queue offset to be written
    confirmed: int  # readers see queue offsets below this


class AppendSlot:
    """What the append path keeps of one queue between batches (its queue, its encoded topic
    name), and its share of the batch being laid out, stamped with that batch: a batch spread
    over 10,000 queues makes no per-queue object."""

    __slots__ = ("cq", "name", "name_len", "batch", "next", "phys", "sizes", "tags")
    # the share of batch `batch`, set by the append path when a batch first meets the queue
    next: int
    phys: list[int]
    sizes: list[int]
    tags: list[int]

    def __init__(self, cq: ConsumeQueue, name: bytes) -> None:
        self.cq = cq
        self.name = name
        self.name_len = len(name)
        self.batch = -1  # no batch's share yet


def due_split(
    dirty: Iterable[ConsumeQueue], cut: int, target: int, enough: int
) -> tuple[list[ConsumeQueue], list[ConsumeQueue], int]:
    """Which dirty queues a checkpoint writes: those holding a unit of a record below `cut` or at
    least `enough` units (and those holding none: nothing to keep), and which it leaves for a
    later one; and the durable
    offset after it, `target` lowered to the oldest unit left. A queue whose units all came after
    the last checkpoints waits: with 10,000 queues each receiving a few messages a second, a
    checkpoint every second wrote every queue's file every second, each write a system call and
    its Python around it (a fifth of a broker's CPU in bench.scale's 10,000-queue run); such a
    queue now writes every few checkpoints, more units at a time, and recovery scans from the
    oldest unit left (`Flusher`: a few checkpoint intervals of log). A queue with `enough` units
    writes at once, so a log of a few busy queues leaves none behind and recovers as before."""
    taken: list[ConsumeQueue] = []
    left: list[ConsumeQueue] = []
    durable = target
    for cq in dirty:
        oldest = cq.phys[0] if cq.phys else None
        if oldest is None or oldest < cut or len(cq.phys) >= enough:
            taken.append(cq)
        else:
            left.append(cq)
            durable = min(durable, oldest)
    return taken, left, durable


class QueueIndex:
    """Every consume queue of one log, under `directory/<topic>/<queue id>`."""

    def __init__(self, directory: str, units_per_file: int, max_open_files: int = 1024) -> None:
        self.directory = directory
        self.units_per_file = units_per_file
        # every queue's descriptors, together: at most `max_open_files` (LRU-closed past it)
        self.descriptors = DescriptorPool(max_open_files)
        self.by_key: dict[tuple[str, int], ConsumeQueue] = {}
        self.dirty: set[ConsumeQueue] = set()
        # the append path's slots, by (topic, queue id); forgotten with the queues they name
        self.slots: dict[tuple[str, int], AppendSlot] = {}
        self._fs_fd: int | None = None
        # queues written and not yet synced: a round whose sync failed leaves them here, and
        # the next sync takes them whatever it is given
        self.unsynced: set[ConsumeQueue] = set()

    def _added(self, cq: ConsumeQueue) -> None:
        """Keep `cq`. Before the first queue, a descriptor on the queues' filesystem (the log's
        directory, which outlives the queues' own) is opened, before any write it is to sync:
        syncfs reports a writeback error only to descriptors opened before it."""
        if self._fs_fd is None:
            self._fs_fd = os.open(
                os.path.dirname(os.path.abspath(self.directory)), os.O_RDONLY | os.O_DIRECTORY
            )
        self.by_key[(cq.topic, cq.queue_id)] = cq

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.by_key.get((topic, queue_id))

    def open(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue of (topic, queue_id), created (files included) on first use."""
        cq = self.by_key.get((topic, queue_id))
        if cq is None:
            check_topic_queue(topic, queue_id)
            cq = ConsumeQueue(
                os.path.join(self.directory, topic, str(queue_id)),
                topic,
                queue_id,
                self.units_per_file,
                self.descriptors,
            )
            self._added(cq)
        return cq

    def slot(self, topic: str, queue_id: int) -> AppendSlot:
        """The append slot of (topic, queue_id), made (the queue opened) on first use."""
        key = (topic, queue_id)
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = AppendSlot(self.open(topic, queue_id), topic.encode())
        return slot

    def offsets(self, topic: str, queue_id: int, confirm: int) -> QueueOffsets:
        check_topic_queue(topic, queue_id)
        cq = self.by_key.get((topic, queue_id))
        if cq is None:
            return QueueOffsets(0, 0, 0)
        return QueueOffsets(cq.min_offset, cq.next_offset, cq.confirmed_end(confirm))

    def keys(self) -> list[tuple[str, int]]:
        return sorted(self.by_key)

    # ------------------------------------------------------------------ recovery and dispatch

    def load(self, durable_phys: int) -> None:
        """Open every queue on disk, dropping units at or beyond `durable_phys` (not known durable)."""
        self.slots.clear()
        if not os.path.isdir(self.directory):
            return
        for topic in sorted(os.listdir(self.directory)):
            tdir = os.path.join(self.directory, topic)
            for qname in sorted(os.listdir(tdir)):
                if not qname.isdigit():
                    continue
                cq = ConsumeQueue(
                    os.path.join(tdir, qname), topic, int(qname), self.units_per_file, self.descriptors
                )
                cq.truncate_phys(durable_phys)
                self._added(cq)

    def remove_files(self) -> None:
        """Delete the queues' directory (recovery rebuilds every queue from the log)."""
        self.slots.clear()
        if os.path.isdir(self.directory):
            shutil.rmtree(self.directory)

    def dispatch(self, h: rec.Header, where: str) -> None:
        """Index a record found in the log (recovery)."""
        cq = self.open(h.topic, h.queue_id)
        if h.queue_offset < cq.min_offset:
            return  # a record of a cut queue (deleted topic): never indexed again
        cq.put(h.queue_offset, h.phys_offset, h.size, rec.tags_hash(rec.tags_of(h.props)), where)

    def settle(self, end: int, min_phys: int) -> None:
        """After recovery: every queue ends at `end`, starts at `min_phys`, and is on disk."""
        for cq in self.by_key.values():
            cq.truncate_phys(end)
            cq.trim_below(min_phys)
            cq.write_pending()
        self.sync(list(self.by_key.values()))

    # ------------------------------------------------------------------ flushing

    def take_dirty(self) -> list[ConsumeQueue]:
        """The queues with units not yet in their files, taken (the caller holds the log lock,
        which appends hold too): queues appended to from now on are dirty again."""
        taken, self.dirty = self.dirty, set()
        return list(taken)

    def take_due(self, cut: int, target: int, enough: int) -> tuple[list[ConsumeQueue], int]:
        """The dirty queues whose oldest unit not in their files is of a record below `cut`, taken
        (the caller holds the log lock); the others stay dirty. With the offset below which every
        record's unit will then be in the files once the taken queues are written: `target` (the
        log's end now), or the oldest pending unit's record among the queues left (`due_split`)."""
        taken, left, durable = due_split(self.dirty, cut, target, enough)
        self.dirty = set(left)
        return taken, durable

    def write(self, queues: list[ConsumeQueue]) -> list[ConsumeQueue]:
        """Write `queues`' pending units to their files, each under its own lock (the log lock is
        not needed: appends only add to a queue's tail); the queues that wrote. A queue not
        written (a write failed before it) is dirty again."""
        for i, cq in enumerate(queues):
            try:
                cq.write_pending()
            except BaseException:
                self.dirty.update(queues[i:])
                raise
            finally:
                if cq.unsynced:
                    self.unsynced.add(cq)
        return [cq for cq in queues if cq.unsynced]

    def write_dirty(self) -> list[ConsumeQueue]:
        """`write` of every dirty queue (the caller holds the log lock)."""
        return self.write(self.take_dirty())

    def sync(self, queues: list[ConsumeQueue]) -> None:
        """Make durable what `queues` wrote: one syncfs for many, an fdatasync of each file for a
        few (`consumequeue.sync_queues`)."""
        todo = list(self.unsynced.union(queues))  # sync_queues skips those with nothing unsynced
        try:
            # syncfs for many queues, or while the descriptor bound closes queues' files
            sync_queues(todo, self._fs_fd, prefer_fs=self.descriptors.full())
        finally:
            self.unsynced = {cq for cq in todo if cq.unsynced}

    # ------------------------------------------------------------------ cutting

    def truncate_phys(self, phys_offset: int) -> None:
        """Durably drop every unit of a record at or beyond `phys_offset` (log truncation)."""
        for cq in self.by_key.values():
            cq.truncate_phys(phys_offset)
            cq.write_pending()
        self.sync(list(self.by_key.values()))
        self.dirty.clear()

    def trim_below(self, min_phys: int) -> None:
        """Retention: each queue starts at its first unit at or above `min_phys`."""
        for cq in self.by_key.values():
            cq.trim_below(min_phys)

    def cut(self, cq: ConsumeQueue, queue_offset: int) -> None:
        cq.cut(queue_offset)
        fsync_dir(cq.dir)

    def drop_topic(self, topic: str) -> None:
        """Forget every queue of `topic`, files included."""
        self.slots.clear()
        for key in [k for k in self.by_key if k[0] == topic]:
            cq = self.by_key.pop(key)
            self.dirty.discard(cq)
            self.unsynced.discard(cq)
            cq.close()
            shutil.rmtree(cq.dir, ignore_errors=True)
        if os.path.isdir(self.directory):
            fsync_dir(self.directory)

    def close_all(self) -> None:
        self.slots.clear()
        self.unsynced.clear()
        for cq in self.by_key.values():
            cq.close()
        self.by_key.clear()
        if self._fs_fd is not None:
            fd, self._fs_fd = self._fs_fd, None
            os.close(fd)
