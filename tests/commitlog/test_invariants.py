"""The offset rules of the commit log (commitlog/offsets.py), each broken on purpose.

Where the public API can break a rule, the test goes through it; the flushed offset and the
retention rule cannot be broken from outside (the log moves them itself), so those tests poke
the `Offsets` object directly, as a bug inside the log would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.offsets import Offsets
from tidelog.commitlog.segments import SegmentFiles
from tidelog.invariants import InvariantViolation

SEG = 8192


def open_log(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=SEG, flush_interval_ms=10**9, checkpoint_interval_ms=10**9)


def test_the_confirm_offset_cannot_go_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"x" * 100) for _ in range(3)])
    log.confirm_offset = placed[2].phys_offset
    log.confirm_offset = placed[2].phys_offset  # staying put is growing by nothing
    with pytest.raises(InvariantViolation, match="go back"):
        log.confirm_offset = placed[1].phys_offset
    assert log.confirm_offset == placed[2].phys_offset
    log.close()


def test_the_confirm_offset_cannot_pass_the_max(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 100)])
    with pytest.raises(InvariantViolation, match="pass the max"):
        log.confirm_offset = log.max_offset + 1
    assert log.confirm_offset == 0
    log.close()


def test_truncation_is_the_one_way_down_for_the_confirm_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    placed = log.append([Message("t", 0, b"x" * 100) for _ in range(4)])
    log.confirm_offset = log.max_offset
    log.flush()
    log.truncate(placed[1].phys_offset)
    assert log.confirm_offset == log.flushed_offset == log.max_offset == placed[1].phys_offset
    log.append([Message("t", 0, b"y" * 100)])
    log.confirm_offset = log.max_offset  # grows again from the cut
    log.close()


def test_the_flushed_offset_cannot_pass_the_max() -> None:
    offsets = Offsets("log")
    offsets.max = 100
    offsets.mark_flushed(100)
    with pytest.raises(InvariantViolation, match="flushed offset 101 would pass the max 100"):
        offsets.mark_flushed(101)
    assert offsets.flushed == 100


def test_after_retention_the_min_offset_is_not_above_the_confirm_offset() -> None:
    offsets = Offsets("log")
    offsets.max = 3 * SEG + 10
    offsets.raise_confirm_to_min(2 * SEG)  # retention raises a lower confirm offset to the new min
    assert offsets.confirm == 2 * SEG
    # a new min past the end of the log (a bug in choosing the doomed segments) breaks the rule
    with pytest.raises(InvariantViolation, match="after retention min"):
        offsets.raise_confirm_to_min(4 * SEG)


def test_retention_raises_the_confirm_offset_to_the_new_min(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append([Message("t", 0, b"x" * 900) for _ in range(40)])
    new_min = log.delete_expired(max_total_bytes=2 * SEG)
    assert new_min > 0
    assert log.min_offset == new_min <= log.confirm_offset <= log.max_offset
    log.close()


def test_a_new_segment_must_follow_the_last_one(tmp_path: Path) -> None:
    segments = SegmentFiles(str(tmp_path), SEG)
    segments.write_chunk(0, 0, b"", closes=False)
    with pytest.raises(InvariantViolation, match="does not follow the last one"):
        segments.write_chunk(2 * SEG, 2 * SEG, b"", closes=False)
    segments.close_all()
