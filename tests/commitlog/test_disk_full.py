"""A full disk never costs an acknowledged record, and the store opens again afterwards (hardening row 5).

Observed before: with `flush: sync` on an 8 MB tmpfs, short pwrites were ignored; the log
reported a flushed offset beyond the bytes its segment held, 4 acknowledged records were lost
and the store refused to open. Here records are appended until the disk is full; every record
whose fsync was awaited must read back, byte for byte, after a reopen.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path

import pytest

from tests.tmpfs import grow, tmpfs
from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog import log as log_module
from tidelog.errors import DiskFullError, StoreError

SEG = 1 << 20


def _open(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=SEG, flush="sync", checkpoint_interval_ms=50)


def _fill_until_full(log: CommitLog) -> tuple[list[tuple[int, bytes]], BaseException]:
    acked: list[tuple[int, bytes]] = []

    async def main() -> BaseException:
        i = 0
        while True:
            body = (b"%08d" % i) * 1000
            try:
                placed = log.append([Message("t", i % 3, body)])
                await log.flushed(placed[-1].phys_offset + placed[-1].size, timeout=5)
            except (DiskFullError, StoreError) as exc:
                return exc
            acked.append((i, body))
            i += 1

    return acked, asyncio.run(main())


def _read_all(log: CommitLog) -> dict[int, list[bytes]]:
    log.confirm_offset = log.max_offset
    return {q: [m.body for m in log.read("t", q, 0, 100000)] for q in range(3)}


def test_appends_until_the_disk_is_full_lose_nothing_acknowledged(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", 8 << 20) as disk:
        log = _open(disk / "store")
        acked, err = _fill_until_full(log)
        assert isinstance(err, DiskFullError), err
        assert err.code == "DISK_FULL" and len(acked) > 100
        with pytest.raises(DiskFullError):  # the log stays stopped: nothing more is acknowledged
            log.append([Message("t", 0, b"late")])
        log.close()
        # Recovery may need room to write the consume-queue units it rebuilds: on a disk still
        # full it refuses with the same typed error (a broker waits and retries, broker/server.py)
        # and loses nothing; once there is room it opens.
        try:
            reopened = _open(disk / "store")
        except DiskFullError:
            grow(disk, 16 << 20)
            reopened = _open(disk / "store")
        got = _read_all(reopened)
        for i, body in acked:
            assert body in got[i % 3], f"acknowledged record {i} is gone"
        reopened.close()


def test_a_short_write_is_completed_and_a_stalled_one_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwrite
    calls = {"n": 0}

    def half(fd: int, data: bytes, offset: int) -> int:
        calls["n"] += 1
        view = memoryview(data)
        return real(fd, view[: max(1, len(view) // 2)], offset)

    log = _open(tmp_path / "store")
    monkeypatch.setattr(log_module.os, "pwrite", half)
    import tidelog.commitlog.fileio as fileio

    monkeypatch.setattr(fileio.os, "pwrite", half)
    placed = log.append([Message("t", 0, b"y" * 5000)])
    asyncio.run(log.flushed(placed[-1].phys_offset + placed[-1].size, timeout=5))
    assert calls["n"] > 1  # the write came in pieces and was completed

    def stalled(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "pwrite", stalled)
    with pytest.raises(DiskFullError):
        log.append([Message("t", 0, b"z" * 5000)])
    monkeypatch.undo()
    log.close()
    reopened = _open(tmp_path / "store")
    assert _read_all(reopened)[0] == [b"y" * 5000]
    reopened.close()


def test_an_open_that_cannot_write_what_recovery_rebuilds_refuses_with_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _open(tmp_path / "store")
    placed = log.append([Message("t", 0, b"x" * 100)])
    asyncio.run(log.flushed(placed[-1].phys_offset + placed[-1].size, timeout=5))
    log.close()
    shutil.rmtree(tmp_path / "store" / "consumequeue")  # recovery rebuilds the queues, and writes them

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("tidelog.commitlog.consumequeue.write_all", full)
    with pytest.raises(DiskFullError, match="cannot open the commit log"):
        _open(tmp_path / "store")
    monkeypatch.undo()
    reopened = _open(tmp_path / "store")  # with room, it opens and holds the record
    assert _read_all(reopened)[0] == [b"x" * 100]
    reopened.close()
