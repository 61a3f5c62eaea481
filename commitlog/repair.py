"""Repair: overwrite damaged bytes in place with a copy from another replica.

Replicas are byte-identical below the confirm offset, so the copy must be whole valid records
whose physical offsets are exactly where they land, inside one segment and below this log's
confirm offset; anything else is refused without writing a byte. The damage is found offline
(`commitlog/verify.py`).
"""

from __future__ import annotations

import logging
import os

from tidelog.commitlog import record as rec
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.fileio import pwrite_all
from tidelog.errors import CorruptRecordError, InvalidArgumentError, OffsetMismatchError

log = logging.getLogger(__name__)


def repair_range(core: LogCore, offset: int, data: bytes) -> None:
    """See `CommitLog.repair_range`."""
    core.check_open()
    end = offset + len(data)
    confirm = core.offsets.confirm
    if not data or offset < core.min_offset or end > confirm:
        raise InvalidArgumentError(
            f"repair [{offset}, {end}) is outside [{core.min_offset}, confirm {confirm})"
        )
    if offset // core.segment_bytes != (end - 1) // core.segment_bytes:
        raise InvalidArgumentError(f"repair [{offset}, {end}) crosses a segment boundary")
    _check_records(offset, data)
    with core.flush_lock, core.lock:
        seg = core.segments.at(offset)
        try:
            pwrite_all(seg.fd, data, offset - seg.base)
            os.fdatasync(seg.fd)
        except OSError as exc:
            raise core.fail(f"repair at {offset} failed: {exc}", exc) from exc
    log.warning("repaired %s bytes [%d, %d) from another replica", seg.path, offset, end)


def _check_records(offset: int, data: bytes) -> None:
    """`data` must be whole valid records, each holding its own place (`offset` + its position)."""
    pos = 0
    while pos < len(data):
        kind, size, reason = rec.check_at(data, pos)
        if kind != rec.VALID:
            raise CorruptRecordError("<repair data>", offset + pos, reason or "not a record")
        if rec.decode_header(data, pos).phys_offset != offset + pos:
            raise OffsetMismatchError(f"repair data at {offset + pos} holds the record of another offset")
        pos += size
