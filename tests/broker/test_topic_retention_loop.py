"""A topic's own retention in one broker's retention rounds (broker/retention.py,
commitlog/topicretention.py) over a real commit log: a shorter one cuts only that topic's
queues (a typed OFFSET_BELOW_RETENTION for its old offsets, other topics and the segments
untouched); a longer one holds the segments with its young records against the broker's rule;
with the broker's rule off, rounds still apply a topic's."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.broker.test_retention_loop import HOUR_MS, SEG, T, _Replica
from tidelog.broker.retention import RetentionLoop
from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.segments import segment_name
from tidelog.errors import OffsetBelowRetentionError

U = "u"


@pytest.fixture
def log(tmp_path: Path) -> Any:
    cl = CommitLog.open(tmp_path, segment_bytes=SEG, flush_interval_ms=10, checkpoint_interval_ms=10)
    yield cl
    cl.close()


def _topics(replica: _Replica, **retention_ms: int) -> None:
    replica.topic_table.update(
        "a",
        [
            SimpleNamespace(name=n, queues={"a": 1}, generation=0, retention_ms=retention_ms.get(n, 0))
            for n in (T, U)
        ],
    )


def _append(log: CommitLog, topic: str, count: int) -> None:
    for _ in range(count):
        log.append([Message(topic, 0, b"x" * 500)])
    log.confirm_offset = log.max_offset
    deadline = time.monotonic() + 5
    while log.recovery_floor < log.max_offset and time.monotonic() < deadline:
        time.sleep(0.01)


def _round(replica: _Replica, at: float) -> RetentionLoop:
    loop = RetentionLoop(replica, clock=lambda: at)  # type: ignore[arg-type]
    asyncio.run(loop.check_once())
    return loop


def test_a_shorter_topic_retention_cuts_only_that_topics_queues(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=HOUR_MS)
    _topics(replica, u=1000)
    _append(log, U, 10)
    _append(log, T, 10)
    _append(log, U, 10)
    assert len(log.segment_infos()) >= 3
    loop = _round(replica, time.time() + 60)  # older than u's second, far younger than the hour
    assert log.queue_offsets(U, 0).min == 20  # all of u went from its queue
    assert loop.cut_messages == 20
    with pytest.raises(OffsetBelowRetentionError):
        log.read(U, 0, 0)
    assert log.queue_offsets(T, 0).min == 0 and len(log.read(T, 0, 0, 100)) == 10  # t keeps its own
    assert log.min_offset == 0  # the bytes go with the broker's rule, not yet
    _append(log, U, 3)
    _round(replica, time.time())  # the new ones are younger than u's retention
    assert [m.queue_offset for m in log.read(U, 0, 20)] == [20, 21, 22]


def test_a_cut_stops_at_the_first_segment_young_enough(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=HOUR_MS)
    _topics(replica, u=5000)
    _append(log, U, 12)  # more than a segment
    first_end = log.segment_infos()[0].end
    _append(log, T, 20)
    infos = log.segment_infos()
    now = infos[1].newest_ms / 1000 + 2  # segment 0 seen as old, the later ones within 5 s
    os.utime(Path(log.directory) / "commitlog" / segment_name(infos[0].base), (now - 60, now - 60))
    _round(replica, now)
    start = log.queue_offsets(U, 0).min
    kept = log.read(U, 0, start, 100, confirmed_only=False)
    assert 0 < start < 12 and kept and kept[0].phys_offset >= first_end


def test_a_longer_topic_retention_holds_the_segments_of_its_young_records(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=1000)
    _topics(replica, u=HOUR_MS)
    _append(log, T, SEG // 500 + 2)  # a segment and more
    _append(log, U, 1)
    held_at = log.read(U, 0, 0)[0].phys_offset
    _append(log, T, 3 * SEG // 500)
    loop = _round(replica, time.time() + 60)
    assert 0 < log.min_offset <= held_at  # what came before u's record went, u's record stayed
    assert loop.last_decision is not None and loop.last_decision.held_by == "topic:u"
    assert log.read(U, 0, 0)
    _round(replica, time.time() + 2 * HOUR_MS / 1000)  # once older than u's hour it goes too
    assert log.min_offset > held_at
    with pytest.raises(OffsetBelowRetentionError):
        log.read(U, 0, 0)


def test_with_the_broker_rule_off_rounds_apply_a_topics_retention(log: CommitLog) -> None:
    replica = _Replica(log, retention_ms=0, retention_check_interval_ms=10)
    _topics(replica)
    _append(log, U, 5)
    _append(log, T, 5)
    loop = RetentionLoop(replica, clock=lambda: time.time() + 60)  # type: ignore[arg-type]

    async def run_until_cut() -> None:
        stopping = asyncio.Event()
        task = asyncio.ensure_future(loop.run(stopping))
        await asyncio.sleep(0.05)
        _topics(replica, u=1000)  # learned from a heartbeat while the loop runs
        deadline = time.monotonic() + 5
        while log.queue_offsets(U, 0).min == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stopping.set()
        await task

    asyncio.run(run_until_cut())
    assert log.queue_offsets(U, 0).min == 5
    assert log.queue_offsets(T, 0).min == 0 and log.min_offset == 0
