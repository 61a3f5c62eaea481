"""Cut and dropped consume queues (a deleted topic's): the units below a cut are never readable
again, their files go at once, the queue's start survives a reopen and a crash whose recovery
re-dispatches the cut records, and a dropped queue starts again at the next record dispatched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog, Message
from tidelog.errors import CorruptRecordError, OffsetBelowRetentionError

NEVER = 10**9


def open_log(path: Path, **kw) -> CommitLog:
    kw.setdefault("segment_bytes", 8192)
    kw.setdefault("flush_interval_ms", NEVER)
    kw.setdefault("checkpoint_interval_ms", NEVER)
    kw.setdefault("cq_units_per_file", 4)
    return CommitLog.open(path, **kw)


def put(log: CommitLog, prefix: str, n: int, queue: int = 0) -> None:
    log.append([Message("t", queue, f"{prefix}-{i}".encode()) for i in range(n)])
    log.confirm_offset = log.max_offset


def bodies(log: CommitLog, queue: int = 0) -> list[bytes]:
    o = log.queue_offsets("t", queue)
    return [m.body for m in log.read("t", queue, o.min, 1000)] if o.max > o.min else []


def files(path: Path, queue: int = 0) -> dict[str, int]:
    qdir = path / "consumequeue" / "t" / str(queue)
    return {f.name: f.stat().st_size for f in sorted(qdir.iterdir())}


def test_a_cut_of_everything_removes_the_files_and_keeps_the_start(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    put(log, "old", 10)
    put(log, "other", 3, queue=1)
    log.close()
    log = open_log(tmp_path)
    assert len(files(tmp_path)) == 3
    log.cut_queue("t", 0, 10)
    assert files(tmp_path) == {f"{10:020d}": 0}, "only an empty file naming the start is left"
    assert log.queue_offsets("t", 0)[:2] == (10, 10)
    with pytest.raises(OffsetBelowRetentionError):
        log.read("t", 0, 9)
    assert bodies(log, 1) == [b"other-0", b"other-1", b"other-2"], "other queues are untouched"
    log.cut_queue("t", 0, 10)  # again: nothing
    put(log, "new", 2)
    assert bodies(log) == [b"new-0", b"new-1"]
    log.close()
    log = open_log(tmp_path)
    assert log.queue_offsets("t", 0)[:2] == (10, 12) and bodies(log) == [b"new-0", b"new-1"]
    log.close()


def test_an_empty_cut_queue_keeps_its_start_across_a_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    put(log, "old", 5)
    log.cut_queue("t", 0, 5)
    log.close()
    for _ in range(2):  # each reopen must keep the file that names the start
        log = open_log(tmp_path)
        assert log.queue_offsets("t", 0)[:2] == (5, 5)
        log.close()
    log = open_log(tmp_path)
    put(log, "new", 1)
    assert log.read("t", 0, 5)[0].body == b"new-0"
    log.close()


def test_a_cut_below_newer_units_keeps_them(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    put(log, "old", 9)
    put(log, "new", 3)
    log.close()
    log = open_log(tmp_path)  # the units are in files 0, 4 and 8 now
    log.cut_queue("t", 0, 9)
    assert bodies(log) == [b"new-0", b"new-1", b"new-2"]
    assert log.queue_offsets("t", 0).min == 9
    log.close()
    log = open_log(tmp_path)
    # files wholly below the cut are gone; the one holding offset 9 starts at 8 and is cut again
    # by the owner after a restart (the broker folds its markers at start-up)
    assert sorted(files(tmp_path)) == [f"{8:020d}"]
    log.cut_queue("t", 0, 9)
    assert bodies(log) == [b"new-0", b"new-1", b"new-2"]
    log.close()


def test_recovery_after_a_crash_does_not_index_cut_records_again(tmp_path: Path) -> None:
    log = open_log(tmp_path / "live")
    put(log, "old", 6)
    log.flush()  # records durable; consume queues never synced (checkpoint offset 0)
    log.cut_queue("t", 0, 6)
    put(log, "new", 2)
    log.flush()
    shutil.copytree(tmp_path / "live", tmp_path / "crashed")  # the disk as a crash would leave it
    log.close()
    crashed = open_log(tmp_path / "crashed")  # re-dispatches every record from offset 0
    assert crashed.queue_offsets("t", 0)[:2] == (6, 8)
    assert bodies(crashed) == [b"new-0", b"new-1"]
    crashed.close()


def test_a_dropped_queue_starts_at_the_next_replicated_record(tmp_path: Path) -> None:
    master, slave = open_log(tmp_path / "m"), open_log(tmp_path / "s")
    put(master, "a", 4)
    start = master.max_offset
    put(master, "b", 2)
    slave.append_raw(0, master.read_raw(0, start))
    slave.cut_queue("t", 0, 4)
    with pytest.raises(CorruptRecordError):  # a record below a queue's start is refused, never mis-indexed
        slave.append_raw(start, _rewritten(master, start, qoff=2))
    slave.drop_queues("t")
    assert slave.queue_offsets("t", 0)[:2] == (0, 0)
    assert not (tmp_path / "s" / "consumequeue" / "t" / "0").exists()
    slave.append_raw(start, master.read_raw(start, 1 << 16))
    slave.confirm_offset = slave.max_offset
    assert slave.queue_offsets("t", 0)[:2] == (4, 6) and bodies(slave) == [b"b-0", b"b-1"]
    master.close()
    slave.close()


def _rewritten(log: CommitLog, at: int, *, qoff: int) -> bytes:
    """The record at `at` re-encoded with another queue offset (what a diverged master would send)."""
    from tidelog.commitlog import record as rec

    m = log.read_at(at)
    return rec.encode(
        topic=m.topic.encode(),
        props=b"",
        body=m.body,
        flags=m.flags,
        queue_id=m.queue_id,
        epoch=m.epoch,
        queue_offset=qoff,
        phys_offset=at,
        born_ts=m.born_ts,
        store_ts=m.store_ts,
    )


def test_an_append_after_the_queues_are_dropped_starts_them_again(tmp_path):
    """The append path keeps a slot per queue between batches: dropping the topic's queues must
    forget it, or the next append would index into the dropped queue."""
    log = CommitLog.open(tmp_path / "m", flush="async")
    log.append([Message("t", 0, b"a"), Message("t", 0, b"b")])
    log.drop_queues("t")
    log.append([Message("t", 0, b"c")])
    log.confirm_offset = log.max_offset
    assert [(m.queue_offset, m.body) for m in log.read("t", 0, 0, 10)] == [(0, b"c")]
    log.close()
    again = CommitLog.open(tmp_path / "m", flush="async")
    assert [(m.queue_offset, m.body) for m in again.read("t", 0, 0, 10, confirmed_only=False)] == [(0, b"c")]
    again.close()
