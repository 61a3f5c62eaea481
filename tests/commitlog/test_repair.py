"""repair_range rewrites damaged bytes only with a valid copy of the same records; verify.scan finds them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.verify import scan
from tidelog.errors import CorruptRecordError, InvalidArgumentError, OffsetMismatchError

SEG = 1 << 20


def _log(path: Path) -> CommitLog:
    log = CommitLog.open(path, segment_bytes=SEG, flush="async")
    log.append([Message("t", 0, b"%04d" % i * 100) for i in range(50)])
    log.confirm_offset = log.max_offset
    log.flush()
    return log


def _flip(log: CommitLog, offset: int) -> None:
    path = log.directory + "/commitlog/" + f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_repair_restores_a_damaged_record_from_a_good_copy(tmp_path: Path) -> None:
    good, bad = _log(tmp_path / "good"), _log(tmp_path / "bad")
    placed = bad.read("t", 0, 10, 1)[0]
    _flip(bad, placed.phys_offset + placed.size - 5)
    with pytest.raises(CorruptRecordError) as info:
        bad.read("t", 0, 10, 1)
    assert info.value.size == placed.size
    damage = scan(bad.directory).damage
    assert [(d.start <= placed.phys_offset + placed.size - 5 < d.end) for d in damage] == [True]
    copy = good.read_raw(placed.phys_offset, placed.size)
    bad.repair_range(placed.phys_offset, copy)
    assert bad.read("t", 0, 10, 1)[0].body == placed.body
    assert scan(bad.directory).damage == []
    good.close()
    bad.close()


def test_repair_refuses_anything_but_valid_records_of_that_place(tmp_path: Path) -> None:
    log = _log(tmp_path / "l")
    first = log.read("t", 0, 0, 1)[0]
    second = log.read("t", 0, 1, 1)[0]
    raw_second = log.read_raw(second.phys_offset, second.size)
    damaged = bytearray(log.read_raw(first.phys_offset, first.size))
    damaged[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.repair_range(first.phys_offset, bytes(damaged))
    with pytest.raises(OffsetMismatchError):  # the right bytes for another place
        log.repair_range(first.phys_offset, raw_second)
    log.close()
    fresh = CommitLog.open(tmp_path / "unconfirmed", segment_bytes=SEG, flush="async")
    placed = fresh.append([Message("t", 0, b"%04d" % i * 100) for i in range(2)])
    with pytest.raises(InvalidArgumentError):  # beyond the confirm offset (0 here)
        fresh.repair_range(placed[1].phys_offset, fresh.read_raw(placed[1].phys_offset, placed[1].size))
    fresh.close()
