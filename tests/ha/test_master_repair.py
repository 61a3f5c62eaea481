"""A master repairs damaged bytes of its log from a slave that acked them (docs/ARCHITECTURE.md
§3.9; ha/master.py::HaMaster.request_repair): HA master and slave over real loopback sockets, in
one process, as in tests/ha/test_streaming.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.ha.test_streaming import MASTER_ID, SLAVE_ID, Pair, batch, until
from tidelog.commitlog import CommitLog


def _flip(log_dir: Path, offset: int, segment_bytes: int) -> None:
    """One byte of the log at physical `offset` inverted in its segment file, under the open log."""
    seg = sorted((log_dir / "commitlog").iterdir())[offset // segment_bytes]
    fd = os.open(seg, os.O_RDWR)
    try:
        at = offset % segment_bytes
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
    finally:
        os.close(fd)


def _damage(log: CommitLog, start: int, length: int) -> tuple[int, int] | None:
    _, found = log.scrub(start, length)
    return None if found is None else (found.start, found.end)


async def _settled(pair: Pair, n: int) -> tuple[int, int]:
    """`n` records on both logs, flushed and confirmed: (the 10th record's offset, its size)."""
    placed = pair.mlog.append(batch(n, "r"))
    assert pair.master is not None
    pair.master.on_appended()
    end = placed[-1].phys_offset + placed[-1].size
    await until(lambda: pair.mlog.confirm_offset == end and pair.slog.max_offset == end, what="the copy")
    pair.mlog.flush()
    return placed[10].phys_offset, placed[10].size


def test_a_master_repairs_a_damaged_record_from_the_slave_that_acked_it(tmp_path: Path) -> None:
    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}))
        await pair.start_master()
        assert pair.master is not None
        try:
            assert pair.master.request_repair(0, 100) is None  # no slave connected: nobody to ask
            pair.start_slave()
            at, size = await _settled(pair, 30)
            _flip(tmp_path / "m", at + 50, pair.mlog.segment_bytes)
            assert _damage(pair.mlog, at, size) == (at, at + size)

            assert pair.master.request_repair(at, size) == SLAVE_ID
            await until(lambda: pair.master is not None and pair.master.repaired, what="the repair")
            assert pair.master.repaired == [(at, at + size)]
            assert _damage(pair.mlog, at, size) is None
            pair.assert_byte_identical()
            assert pair.slave is not None and pair.slave.connected  # one connection throughout
        finally:
            await pair.close()

    asyncio.run(main())


def test_a_slave_whose_copy_is_damaged_too_repairs_nothing_and_is_not_asked_again_at_once(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        pair = Pair(tmp_path, 1, frozenset({MASTER_ID, SLAVE_ID}))
        await pair.start_master()
        assert pair.master is not None
        try:
            pair.start_slave()
            at, size = await _settled(pair, 30)
            _flip(tmp_path / "m", at + 50, pair.mlog.segment_bytes)
            _flip(tmp_path / "s", at + 60, pair.slog.segment_bytes)

            assert pair.master.request_repair(at, size) == SLAVE_ID
            await until(
                lambda: pair.master is not None and all(a.answered for a in pair.master._asked.values()),  # noqa: SLF001
                what="the slave's answer",
            )
            assert not pair.master.repaired
            assert _damage(pair.mlog, at, size) == (at, at + size)  # nothing written from a bad copy
            assert pair.master.request_repair(at, size) is None  # the only holder had no good copy
            assert pair.slave is not None and pair.slave.connected
        finally:
            await pair.close()

    asyncio.run(main())
