"""Truncation (fork repair): durably drop every record at and beyond an offset.

Consume-queue units, key index entries and epoch entries go with the records; the max, confirm, flushed and
consume-queue offsets come down to the cut (`Offsets.lower_to`, the one place the confirm offset
goes back). Truncate listeners run first, so state derived from the log (ledger fences) is made
safe before records disappear.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from tidelog.commitlog import record as rec
from tidelog.commitlog.core import LogCore
from tidelog.errors import OffsetBelowRetentionError, OffsetMismatchError

log = logging.getLogger(__name__)


def truncate(core: LogCore, phys_offset: int, listeners: Iterable[Callable[[int], None]]) -> None:
    """See `CommitLog.truncate`."""
    core.check_open()
    if phys_offset >= core.offsets.max:
        return
    for listener in list(listeners):
        listener(phys_offset)
    if phys_offset < core.min_offset:
        raise OffsetBelowRetentionError(phys_offset, core.min_offset, what="truncation offset")
    if phys_offset % core.segment_bytes:
        head, _ = core.segments.pread(phys_offset, 8)
        _, magic = rec.BLANK.unpack(head)
        if magic not in (rec.MAGIC, rec.BLANK_MAGIC):
            raise OffsetMismatchError(f"truncation offset {phys_offset} is not a record boundary")
    with core.flush_lock, core.lock:
        log.warning("truncating %s at offset %d (max was %d)", core.directory, phys_offset, core.offsets.max)
        core.segments.truncate_at(phys_offset)
        core.queues.truncate_phys(phys_offset)
        core.keys.truncate(phys_offset)
        core.epochs.truncate_suffix(phys_offset)
        core.offsets.lower_to(phys_offset)
        core.forget_ends_after(phys_offset)
        core.write_checkpoint(clean=False)
