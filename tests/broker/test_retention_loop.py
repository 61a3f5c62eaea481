"""One broker's retention rounds (broker/retention.py) over a real commit log, with the replica's
role and its slaves' acks stood in: the floors hold (a slave's ack, a disconnected slave's last
ack for `retention_slave_hold_ms`, a named group's position, an unknown master min on a slave,
an existing ledger), consume queues follow, a read below retention gets the typed error, and a
deleted ledger frees its segments and its fence."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.broker import config
from tidelog.broker.offsets import GroupOffsets, commit_message
from tidelog.broker.retention import RetentionLoop
from tidelog.broker.topics import TopicTable
from tidelog.commitlog import CommitLog, Message
from tidelog.errors import NoSuchLedgerExistsError, NotMasterError, OffsetBelowRetentionError
from tidelog.ledger.metadata import new_ledger_metadata
from tidelog.ledger.store import LedgerIndex, create_message

SEG = 4096
T = "t"
HOUR_MS = 3600 * 1000


class _Master:
    def __init__(self) -> None:
        self.slave_acks: dict[int, int] = {}

    def acks(self) -> dict[int, int]:
        return dict(self.slave_acks)


class _Replica:
    """What the retention loop reads of a replica, over a real log."""

    def __init__(self, log: CommitLog, **keys: Any) -> None:
        self.cfg = config.from_mapping(
            {
                "broker_set": "a",
                "data_dir": str(log.directory),
                "controllers": "127.0.0.1:1",
                "secret": "s" * 32,
                "retention_ms": 1000,
                **keys,
            }
        )
        self.log = log
        self.role = "master"
        self.ctx = "[test]"
        self.master_epoch = 1
        self.master_address = ""
        self.ha_master = _Master()
        self.topic_table = TopicTable(log)
        self.topic_table.update("a", [SimpleNamespace(name=T, queues={"a": 2}, generation=0)])
        self.offsets = GroupOffsets(log)
        self.ledgers = SimpleNamespace(index=LedgerIndex(log), metadata_source=None)

    def require_writable(self) -> None:
        if self.role != "master":
            raise NotMasterError("not master")

    def append(self, msgs: list[Message]) -> tuple[None, list[Any]]:
        return None, self.log.append(msgs)


def _fill(log: CommitLog, segments: int) -> None:
    target = len(log.segment_infos()) + segments
    while len(log.segment_infos()) < target:
        log.append([Message(T, 0, b"x" * 500)])
    log.confirm_offset = log.max_offset
    # what recovery would restart from (flushed, durable consume queues) is a floor too
    deadline = time.monotonic() + 5
    while log.recovery_floor < log.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)


def _round(replica: _Replica, at: float) -> int:
    loop = RetentionLoop(replica, clock=lambda: at)  # type: ignore[arg-type]
    return asyncio.run(loop.check_once())


@pytest.fixture
def log(tmp_path: Path) -> Any:
    cl = CommitLog.open(tmp_path, segment_bytes=SEG, flush_interval_ms=10, checkpoint_interval_ms=10)
    yield cl
    cl.close()


def test_a_slave_ack_holds_then_expired_segments_go(log: CommitLog) -> None:
    replica = _Replica(log)
    _fill(log, 4)
    later = time.time() + 60
    segs = log.segment_infos()
    replica.ha_master.slave_acks = {2: segs[1].base + 10}
    loop = RetentionLoop(replica, clock=lambda: later)  # type: ignore[arg-type]
    assert asyncio.run(loop.check_once()) == 1  # the segment the slave is still reading stays
    assert log.min_offset == segs[1].base
    assert loop.last_decision is not None and loop.last_decision.held_by == "slaves"
    replica.ha_master.slave_acks = {}  # the slave went away: its last ack still holds, for a while
    assert asyncio.run(loop.check_once()) == 0
    loop.clock = lambda: later + 2 * HOUR_MS / 1000
    assert asyncio.run(loop.check_once()) == len(segs) - 2
    assert log.min_offset == segs[-1].base
    offsets = log.queue_offsets(T, 0)
    assert offsets.min > 0  # the consume queue followed
    with pytest.raises(OffsetBelowRetentionError):
        log.read(T, 0, 0)
    assert log.read(T, 0, offsets.min)


def test_nothing_goes_before_it_expires(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=HOUR_MS)
    _fill(log, 3)
    assert _round(replica, time.time()) == 0


def test_a_named_group_keeps_what_it_has_not_consumed(log: CommitLog) -> None:
    replica = _Replica(log, retention_respect_groups=["keep"])
    _fill(log, 2)
    unread = log.queue_offsets(T, 0).max - 1
    log.append([commit_message("keep", T, 0, unread), commit_message("other", T, 0, 0)])
    _fill(log, 2)
    at = time.time() + 60
    _round(replica, at)
    _round(replica, at)
    assert log.read(T, 0, unread)  # still there
    assert log.queue_offsets(T, 0).min > 0  # what it had consumed went


def test_a_slave_deletes_nothing_before_it_knows_its_master_min(log: CommitLog) -> None:
    replica = _Replica(log)
    replica.role = "slave"
    _fill(log, 3)
    assert _round(replica, time.time() + 60) == 0
    assert log.min_offset == 0


def test_retention_off_deletes_nothing_and_stops_when_asked(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=0, retention_check_interval_ms=10)
    _fill(log, 3)
    loop = RetentionLoop(replica, clock=lambda: time.time() + 10 * HOUR_MS)  # type: ignore[arg-type]
    assert not loop.enabled
    assert asyncio.run(loop.check_once()) == 0

    async def run_briefly() -> None:
        stopping = asyncio.Event()
        task = asyncio.ensure_future(loop.run(stopping))
        await asyncio.sleep(0.1)  # rounds run (a topic may get a retention of its own at any time)
        stopping.set()
        await task

    asyncio.run(run_briefly())
    assert log.min_offset == 0 and log.queue_offsets(T, 0).min == 0


def test_an_existing_ledger_keeps_its_segments_and_a_deleted_one_frees_them(log: CommitLog) -> None:
    replica = _Replica(log)
    gone: set[int] = set()

    async def metadata(ledger_id: int) -> Any:
        if ledger_id in gone:
            raise NoSuchLedgerExistsError(f"no ledger {ledger_id}", ledger_id=ledger_id)
        return None

    replica.ledgers.metadata_source = metadata
    _fill(log, 1)
    log.append([create_message(new_ledger_metadata(7, "a", [0], 1, password=b"pw"))])
    replica.ledgers.index.fence(7)
    _fill(log, 3)
    create_at = replica.ledgers.index.ledger_starts()[7]
    at = time.time() + 60
    _round(replica, at)
    assert log.min_offset <= create_at < log.segment_infos()[1].base  # held from its CREATE on
    assert replica.ledgers.index.fenced_ledgers() == [7]
    gone.add(7)  # its user deleted it
    _round(replica, at)
    assert log.min_offset == log.segment_infos()[-1].base
    assert replica.ledgers.index.fenced_ledgers() == []  # and its fence went with it
