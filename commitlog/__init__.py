"""The commit log: segment files, record codec, group-commit flushing, reads by offset, crash
recovery, truncation, consume queues, the epoch file, checkpoints and retention.

Public surface (the broker, the HA layer and the tests use these names):

    log = CommitLog.open(directory, segment_bytes=..., flush="sync" | "async", flush_interval_ms=...)
    placed = log.append([Message(topic, queue_id, body, key=None, tags=None, properties=None), ...])
    await log.flushed(offset)        # group commit
    log.read(topic, queue_id, queue_offset, max_count)
    log.read_raw(offset, max_bytes) / log.append_raw(offset, data)
    log.truncate(offset); log.max_offset; log.min_offset; log.flushed_offset; log.confirm_offset
    log.epochs.append(epoch, start); log.epochs.last_consistent_point(remote, remote_end)
"""

from tidelog.commitlog.append import Placement
from tidelog.commitlog.epochs import EpochEntry, EpochFile, last_consistent_point
from tidelog.commitlog.log import CommitLog
from tidelog.commitlog.queues import QueueOffsets
from tidelog.commitlog.record import Message, StoredMessage

__all__ = [
    "CommitLog",
    "EpochEntry",
    "EpochFile",
    "Message",
    "Placement",
    "QueueOffsets",
    "StoredMessage",
    "last_consistent_point",
]
