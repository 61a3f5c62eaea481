"""The consume-queue index of the commit log: one `ConsumeQueue` per (topic, queue), by name.

Owns the map of open queues, the set of queues with units not yet in their files (the flusher
writes them at checkpoints), and the operations that touch every queue at once: loading at
recovery, dispatching recovered or replicated records, cutting them with the log, and the cuts
of a deleted topic's queues (commitlog/FORMAT.md "Consume queue").
"""

from __future__ import annotations

import os
import shutil
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog.consumequeue import ConsumeQueue, DescriptorPool, check_topic_queue, sync_queues
from tidelog.commitlog.epochs import fsync_dir


class QueueOffsets(NamedTuple):
    min: int  # lowest readable queue offset (retention)
    max: int  # next queue offset to be written
    confirmed: int  # readers see queue offsets below this


class QueueIndex:
    """Every consume queue of one log, under `directory/<topic>/<queue id>`."""

    def __init__(self, directory: str, units_per_file: int, max_open_files: int = 1024) -> None:
        self.directory = directory
        self.units_per_file = units_per_file
        # every queue's descriptors, together: at most `max_open_files` (LRU-closed past it)
        self.descriptors = DescriptorPool(max_open_files)
        self.by_key: dict[tuple[str, int], ConsumeQueue] = {}
        self.dirty: set[ConsumeQueue] = set()
        self._names: dict[tuple[str, int], bytes] = {}

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
            self.by_key[(topic, queue_id)] = cq
        return cq

    def name_bytes(self, topic: str, queue_id: int) -> bytes:
        """The topic's encoded name, once (topic, queue_id) is known to be valid."""
        key = (topic, queue_id)
        name = self._names.get(key)
        if name is None:
            check_topic_queue(topic, queue_id)
            name = topic.encode()
            self._names[key] = name
        return name

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
                self.by_key[(topic, int(qname))] = cq

    def remove_files(self) -> None:
        """Delete the queues' directory (recovery rebuilds every queue from the log)."""
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

    def write_dirty(self) -> list[ConsumeQueue]:
        """Write every queue's pending units to its files; returns every queue (to sync)."""
        for cq in list(self.dirty):
            cq.write_pending()
            self.dirty.discard(cq)
        return list(self.by_key.values())

    def sync(self, queues: list[ConsumeQueue]) -> None:
        """fdatasync what `queues` wrote, many files at once (one by one, 10,000 active queues
        cost a checkpoint seconds)."""
        sync_queues(queues)

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
        for key in [k for k in self.by_key if k[0] == topic]:
            cq = self.by_key.pop(key)
            self.dirty.discard(cq)
            cq.close()
            shutil.rmtree(cq.dir, ignore_errors=True)
        if os.path.isdir(self.directory):
            fsync_dir(self.directory)

    def close_all(self) -> None:
        for cq in self.by_key.values():
            cq.close()
        self.by_key.clear()
