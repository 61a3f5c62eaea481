"""Recovery at open: find where the log really ends, cut a torn tail, catch the consume queues up.

Recovery scans from the segment holding min(checkpointed flushed offset, durable consume-queue
offset) (from the first segment with `full_scan`): damage at or above the flushed offset is a
torn tail and is cut; damage below it is corruption and stops the open with the file and offset
named (commitlog/FORMAT.md "Recovery"). Records past the durable consume-queue offset are
indexed again on the way. The key index is then opened against the recovered end (its entries
past it dropped); the indexer extends it from its last synced point (commitlog/lookups.py).
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil

from tidelog.commitlog import record as rec
from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.epochs import EpochFile
from tidelog.commitlog.segments import Segment
from tidelog.errors import CorruptRecordError, InvalidArgumentError, TidelogError
from tidelog.invariants import stop_if_violated

log = logging.getLogger(__name__)


def recover(core: LogCore, full_scan: bool) -> None:
    """Open the files of `core.directory` and set its offsets to what the files hold."""
    segments = core.segments
    segments.open_existing()  # creates the directories of a new log
    checkpoint = core.checkpoint = CheckpointFile(core.directory)
    cp = checkpoint.loaded
    core.recovered_clean = cp.clean if cp is not None else not len(segments)
    if cp is None and len(segments):
        # Without a checkpoint only rolled segments are known to be complete.
        log.warning(
            "no checkpoint in %s: trusting rolled segments, rebuilding consume queues", core.directory
        )
    flushed_cp = cp.flushed_offset if cp else (segments.list[-1].base if len(segments) else 0)
    rebuild_cqs = cp is None or not os.path.isdir(core.queues.directory)
    if rebuild_cqs:
        core.queues.remove_files()
        if cp is not None:
            # Until the rebuild below is on disk, the checkpoint must not vouch for any unit: a
            # rebuild cut short (a crash, a full disk) would otherwise leave a partial directory
            # that the next open trusts, and records it never indexed could not be read.
            checkpoint.write(cp.flushed_offset, cp.confirm_offset, 0, clean=False)
    if not len(segments):
        if cp is not None and cp.flushed_offset > 0:
            raise CorruptRecordError(
                segments.directory,
                cp.flushed_offset,
                "the checkpoint records flushed data but no segment exists",
            )
        core.offsets.restore(0, 0)
        core.epochs = EpochFile(core.directory, lambda: core.offsets.max)
        checkpoint.write(0, 0, 0, clean=False)
        open_key_index(core, 0, 0)
        return
    min_off = segments.list[0].base
    cq_cp = min_off if rebuild_cqs else max(min_off, cp.cq_offset if cp else 0)
    core.queues.load(cq_cp)
    scan_from = min_off if full_scan else max(min_off, min(flushed_cp, cq_cp))
    end = scan(core, scan_from, flushed_cp, cq_cp)
    segments.cut_at(end)
    core.queues.settle(end, min_off)
    segments.sync(segments.list)
    confirm = cp.confirm_offset if cp else min_off
    core.offsets.restore(end, min(max(confirm, min_off), end))
    core.epochs = EpochFile(core.directory, lambda: core.offsets.max)
    core.epochs.truncate_after(end)
    core.write_checkpoint(clean=False)
    open_key_index(core, end, min_off)
    log.info(
        "recovered %s: offsets [%d, %d), confirm %d, last epoch %d, %d queues",
        core.directory,
        min_off,
        end,
        core.offsets.confirm,
        core.epochs.last_epoch,
        len(core.queues.by_key),
    )


def open_key_index(core: LogCore, end: int, min_off: int) -> None:
    """Open the key index against the recovered log. It is derived data: whatever is wrong with
    it costs a rebuild from the log (which the indexer then does), never the open."""
    keys = core.keys
    try:
        keys.open(end, min_off)
    except Exception as exc:  # an index we cannot make sense of: start it again
        if isinstance(exc, OSError | ValueError | TidelogError):
            log.warning(
                "key index in %s cannot be opened (%s): rebuilding it from the log", keys.directory, exc
            )
        else:
            stop_if_violated(exc)
            log.exception("key index in %s cannot be opened: rebuilding it from the log", keys.directory)
        keys.close()
        shutil.rmtree(keys.directory, ignore_errors=True)
        keys.open(end, min_off)


def scan(core: LogCore, scan_from: int, flushed_cp: int, dispatch_from: int) -> int:
    """Validate records from the segment holding `scan_from`; returns the recovered end."""
    segments = core.segments
    first = min(segments.index(scan_from), len(segments) - 1)
    # From `scan_from` itself, not from the start of its segment: it is a record boundary (the end
    # of what a checkpoint vouched for), so a restart reads only what was written since the last
    # checkpoint, whatever the segment size (bench.scale's log dimension).
    start = max(0, scan_from - segments.list[first].base)
    for seg in segments.list[first:]:
        if seg.size == 0:
            if seg.base < flushed_cp:
                raise CorruptRecordError(
                    seg.path, seg.base, f"the segment is empty but data up to {flushed_cp} was flushed"
                )
            return seg.base
        end = _scan_segment(core, seg, flushed_cp, dispatch_from, start)
        if end is not None:
            return end
        start = 0
    return segments.list[-1].base + core.segment_bytes


def _scan_segment(
    core: LogCore, seg: Segment, flushed_cp: int, dispatch_from: int, start: int = 0
) -> int | None:
    """Validate (and index past `dispatch_from`) one segment's records from `start` on; returns
    where the log ends inside it, or None when a blank marker closes it (the scan goes on to the next)."""
    seg_bytes = core.segment_bytes
    if start >= seg.size:
        return seg.base + start if start < seg_bytes else None
    with mmap.mmap(seg.fd, seg.size, prot=mmap.PROT_READ) as mm:
        pos = start
        while True:
            offset = seg.base + pos
            kind, size, reason = rec.check_at(mm, pos)
            if kind == rec.VALID:
                if offset >= dispatch_from:
                    reason = _dispatch(core, mm, pos, seg.path)
                    if reason:
                        return _end_of_data(seg, offset, rec.DAMAGED, reason, flushed_cp)
                pos += size
                continue
            if kind == rec.IS_BLANK and size == seg_bytes - pos:
                return None  # segment complete; continue with the next one
            if kind == rec.IS_BLANK:
                kind, reason = rec.DAMAGED, f"blank marker declares {size} bytes, {seg_bytes - pos} left"
            return _end_of_data(seg, offset, kind, reason, flushed_cp)


def _dispatch(core: LogCore, mm: mmap.mmap, pos: int, path: str) -> str:
    """Index the record at `pos`; "" once done, else why no queue can take it. Its CRC holds, so
    a topic name or queue id out of the rules comes from a faulty writer: damage at this offset
    (corruption below the flushed offset, a tail to cut above it), not a refused request."""
    try:
        core.queues.dispatch(rec.decode_header(mm, pos), path)
    except InvalidArgumentError as exc:
        return f"no queue can index this record: {exc.message}"
    return ""


def _end_of_data(seg: Segment, offset: int, kind: str, reason: str, flushed_cp: int) -> int:
    """The scan met no valid record at `offset`: corruption below the flushed offset, else the end."""
    if offset < flushed_cp:
        why = reason if kind == rec.DAMAGED else "data missing below the flushed offset"
        raise CorruptRecordError(seg.path, offset, f"{why} (flushed up to {flushed_cp})")
    if kind == rec.DAMAGED:
        log.warning("torn tail in %s at offset %d (%s): truncating", seg.path, offset, reason)
    return offset
