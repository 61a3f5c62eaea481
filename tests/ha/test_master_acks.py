"""`HaMaster.wait_acks`, the shell's half of the release rule: a write sized before a member joined
waits for that member too (the core's half is tests/ha/test_mastercore.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import FlushSlaveTimeoutError
from tidelog.ha.master import HaMaster
from tidelog.ha.mastercore import SlaveJoined


def test_a_write_for_one_ack_waits_for_a_member_that_joined_meanwhile(tmp_path: Path) -> None:
    """The simulator's seed 7426: the master, alone in its set, sized a write for its own ack; a
    slave was proposed into the set before the write's wait began, and the shell's shortcut for
    one ack answered at once. Now the wait asks the core, which counts the joining member."""

    async def run() -> None:
        log = CommitLog.open(tmp_path, segment_bytes=1 << 20)
        log.epochs.append(1, 0)
        master = HaMaster(
            log,
            broker_set="bs",
            broker_id=1,
            epoch=1,
            sync_state_set=frozenset({1}),
            sss_epoch=1,
            slave_timeout_ms=200,
        )
        try:
            log.append([Message("t", 0, b"before")])
            master.on_appended()
            await master.wait_acks(log.max_offset, 1)  # alone: its own append is enough
            held = log.max_offset
            master._step(SlaveJoined(2, held))  # caught up: proposed into the set
            assert master.core.tracker.effective == {1, 2}
            log.append([Message("t", 0, b"sized for one ack")])
            master.on_appended()
            with pytest.raises(FlushSlaveTimeoutError):
                await master.wait_acks(log.max_offset, 1)
        finally:
            await master.close()
            log.close()

    asyncio.run(run())
