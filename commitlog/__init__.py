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

The names are imported on first use (PEP 562): a client that needs only the record-batch codec
(`tidelog.commitlog.batch`) or a constant does not load the whole store with the package, which
cost every `tide` command about a fifth of a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tidelog.commitlog.append import Placement
    from tidelog.commitlog.epochs import EpochEntry, EpochFile, last_consistent_point
    from tidelog.commitlog.log import CommitLog
    from tidelog.commitlog.queues import QueueOffsets
    from tidelog.commitlog.record import Message, StoredMessage

_WHERE = {
    "CommitLog": "log",
    "EpochEntry": "epochs",
    "EpochFile": "epochs",
    "Message": "record",
    "Placement": "append",
    "QueueOffsets": "queues",
    "StoredMessage": "record",
    "last_consistent_point": "epochs",
}

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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
