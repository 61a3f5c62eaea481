"""The bound on the descriptors consume queues hold: many active queues share one LRU pool of
descriptors, evicted queues open theirs again on their next use, and nothing written is lost or
left unsynced by an eviction (the checkpoint syncs an evicted queue's files by name, and many
queues' with one syncfs)."""

from __future__ import annotations

import contextlib
import os
import random
import threading
from pathlib import Path

import pytest

from tidelog.broker import config as broker_config
from tidelog.commitlog import CommitLog, Message, consumequeue, fileio
from tidelog.commitlog.consumequeue import SYNCFS_MIN_QUEUES, ConsumeQueue
from tidelog.commitlog.queues import QueueIndex
from tidelog.errors import ConfigError
from tidelog.invariants import require

Unit = tuple[int, int, int]


def fds_under(root: Path) -> int:
    """Descriptors of this process open on `root` or on files under it. Not the process's count
    of all its descriptors: other tests' leftovers in the same worker (clients whose sockets close
    when their objects are collected) open and close descriptors of their own meanwhile."""
    top = os.path.realpath(root)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            count += target == top or target.startswith(top + os.sep)
    return count


def queue_fds(root: Path) -> int:
    """Descriptors of this process open on files under `root`/consumequeue."""
    return fds_under(root / "consumequeue")


def test_units_written_through_evictions_read_back_equal_and_descriptors_stay_bounded(
    tmp_path: Path,
) -> None:
    bound, queues = 8, 60
    cq_dir = tmp_path / "cq"
    index = QueueIndex(str(cq_dir), 7, max_open_files=bound)
    model: dict[int, list[Unit]] = {q: [] for q in range(queues)}
    rng = random.Random(5)
    phys = 0
    most = 0
    for _round in range(15):
        for q in rng.sample(range(queues), 25):
            cq = index.open("t", q)
            n = rng.randint(1, 9)
            units = [(phys + i * 10, 10, q * 1000 + len(model[q]) + i) for i in range(n)]
            phys += n * 10
            cq.extend([u[0] for u in units], [u[1] for u in units], [u[2] for u in units])
            model[q].extend(units)
            index.dirty.add(cq)
            most = max(most, fds_under(cq_dir))
        for cq in index.write_dirty():
            cq.sync()
        most = max(most, fds_under(cq_dir))
        for q in rng.sample(range(queues), 10):  # readers of old units open sealed files
            m = model[q]
            if m:
                lo = rng.randrange(len(m))
                assert index.open("t", q).units(lo, len(m)) == m[lo:]
                most = max(most, fds_under(cq_dir))
    assert most <= bound
    assert index.descriptors.open_count <= bound
    assert index.descriptors.evictions > 0
    for q, m in model.items():
        assert index.open("t", q).units(0, len(m)) == m
    index.close_all()
    assert fds_under(tmp_path) == 0  # the queues' and the index's own, on the log's directory (syncfs)
    again = QueueIndex(str(cq_dir), 7, max_open_files=bound)
    again.load(durable_phys=phys)
    try:
        assert fds_under(cq_dir) <= bound
        for q, m in model.items():
            cq = again.get("t", q)
            assert cq is not None and cq.next_offset == len(m)
            assert cq.units(0, len(m)) == m
    finally:
        again.close_all()


def test_an_evicted_queue_with_unsynced_units_is_synced_by_name_at_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = QueueIndex(str(tmp_path / "cq"), 1000, max_open_files=4)
    synced: set[str] = set()
    real = os.fdatasync

    def recording(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    for q in range(20):
        cq = index.open("t", q)
        cq.extend([q * 100], [100], [q])
        index.dirty.add(cq)
    # the flusher's round: write every queue, then sync every queue
    queues = index.write_dirty()
    evicted_unsynced = {cq.dir for cq in queues if cq._fd is None}
    assert len(evicted_unsynced) >= 15  # the bound closed most of them between write and sync
    for cq in queues:
        cq.sync()
    written = {os.path.join(cq.dir, f"{0:020d}") for cq in queues}
    assert written <= synced  # every file written was fdatasync'ed, its descriptor closed or not
    assert not any(cq.unsynced for cq in queues)
    index.close_all()


def test_a_log_with_many_active_queues_holds_at_most_its_bound(tmp_path: Path) -> None:
    log = CommitLog.open(
        tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6, cq_max_open_files=16
    )
    try:
        most = 0
        for _ in range(2):
            log.append([Message(f"t{q % 20}", q // 20, b"x" * 20) for q in range(200)])
            log._flusher.flush_once(sync_cqs=True)  # a checkpoint: every queue written and synced
            most = max(most, queue_fds(tmp_path))
        assert 0 < most <= 16
        assert log._core.queues.descriptors.open_count <= 16
        assert [m.body for m in log.read("t7", 3, 0, 10, confirmed_only=False)] == [b"x" * 20] * 2
    finally:
        log.close()
    again = CommitLog.open(
        tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6, cq_max_open_files=16
    )
    try:
        assert again.queue_offsets("t19", 9).max == 2
        assert queue_fds(tmp_path) <= 16
    finally:
        again.close()


def test_a_bound_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cq_max_open_files"):
        CommitLog.open(tmp_path, cq_max_open_files=3)


def test_a_busy_queue_is_passed_over_not_waited_for(tmp_path: Path) -> None:
    index = QueueIndex(str(tmp_path / "cq"), 100, max_open_files=1)
    first = index.open("t", 0)
    first.extend([0], [10], [0])
    first.write_pending()
    with first._lock:  # another thread busy in this queue
        assert not first.release_descriptors()
        second: ConsumeQueue = index.open("t", 1)
        second.extend([10], [10], [1])
        second.write_pending()  # would have waited forever for `first`'s lock
        assert first._fd is not None
    index.close_all()


def test_the_broker_key_defaults_to_1024_and_refuses_a_bound_below_16() -> None:
    base = {"broker_set": "a", "data_dir": "/tmp/x", "controllers": "127.0.0.1:1", "secret": "s" * 32}
    assert broker_config.from_mapping(base).cq_max_open_files == 16384
    assert broker_config.from_mapping({**base, "cq_max_open_files": 64}).cq_max_open_files == 64
    with pytest.raises(ConfigError, match="cq_max_open_files is at least 16"):
        broker_config.from_mapping({**base, "cq_max_open_files": 8})


def test_queues_sync_together_and_a_failed_sync_is_raised_and_stays_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = QueueIndex(str(tmp_path / "cq"), 1000)
    for q in range(12):
        cq = index.open("t", q)
        cq.extend([q * 100], [100], [q])
        index.dirty.add(cq)
    queues = index.write_dirty()
    broken = os.path.join(index.open("t", 5).dir, f"{0:020d}")
    real = os.fdatasync
    synced: list[str] = []

    def failing(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path == broken:
            raise OSError(5, "Input/output error")
        synced.append(path)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        index.sync(queues)
    assert len(synced) == 11  # every other queue was synced all the same
    assert [cq.queue_id for cq in queues if cq.unsynced] == [5]  # the next checkpoint meets it again
    monkeypatch.setattr(os, "fdatasync", real)
    index.close_all()


def test_a_checkpoint_syncs_only_the_queues_that_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = QueueIndex(str(tmp_path / "cq"), 1000)
    for q in range(30):
        index.open("t", q)
    for q in (3, 17):
        cq = index.open("t", q)
        cq.extend([q * 100], [100], [q])
        index.dirty.add(cq)
    queues = index.write_dirty()
    assert sorted(cq.queue_id for cq in queues) == [3, 17]
    assert not index.dirty  # taken
    synced: list[str] = []
    real = ConsumeQueue.sync
    monkeypatch.setattr(ConsumeQueue, "sync", lambda self: synced.append(self.dir) or real(self))
    index.sync(list(index.by_key.values()))  # every queue offered: only the two that wrote sync
    assert sorted(synced) == sorted(index.open("t", q).dir for q in (3, 17))
    index.close_all()


def _write_many(index: QueueIndex, queues: int, phys: int) -> list[ConsumeQueue]:
    for q in range(queues):
        cq = index.open("t", q)
        cq.extend([phys + q], [1], [q])
        index.dirty.add(cq)
    return index.write_dirty()


def test_many_queues_sync_with_one_syncfs_and_a_failed_one_leaves_them_unsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = QueueIndex(str(tmp_path / "cq"), 1000, max_open_files=16)
    calls: list[int] = []
    fdatasyncs: list[int] = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: fdatasyncs.append(fd) or real_fdatasync(fd))
    monkeypatch.setattr(
        consumequeue, "sync_filesystem", lambda fd: calls.append(fd) or fileio.sync_filesystem(fd)
    )
    queues = _write_many(index, SYNCFS_MIN_QUEUES, 0)
    assert len(queues) == SYNCFS_MIN_QUEUES
    index.sync(queues)
    assert len(calls) == 1 and not fdatasyncs  # one syncfs, no fdatasync of any file
    assert not any(cq.unsynced for cq in queues)

    def failing(fd: int) -> bool:
        raise OSError(5, "syncfs failed: Input/output error")

    monkeypatch.setattr(consumequeue, "sync_filesystem", failing)
    queues = _write_many(index, SYNCFS_MIN_QUEUES, 1000)
    with pytest.raises(OSError, match="syncfs failed"):
        index.sync(queues)
    assert all(cq.unsynced for cq in queues)  # the next checkpoint meets them again
    monkeypatch.undo()
    index.sync([])  # a round with nothing new written still syncs what the failed one left
    assert not any(cq.unsynced for cq in queues)
    index.close_all()


def test_a_checkpoint_of_many_queues_past_the_bound_evicts_none(tmp_path: Path) -> None:
    """With the bound reached, a queue whose descriptor is closed writes through one opened for
    that write alone: a checkpoint does not close the other queues' descriptors one by one."""
    index = QueueIndex(str(tmp_path / "cq"), 1000, max_open_files=16)
    index.sync(_write_many(index, 200, 0))  # creating each queue's first file opens it in the pool
    evicted = index.descriptors.evictions
    for r in (1, 2):
        index.sync(_write_many(index, 200, r * 1000))
        assert index.descriptors.open_count <= 16
        assert fds_under(tmp_path / "cq") <= 16
    assert index.descriptors.evictions == evicted  # the writes of later rounds closed nothing
    for q in range(200):
        assert index.open("t", q).units(0, 3) == [(r * 1000 + q, 1, q) for r in range(3)]
    index.close_all()


def test_appends_go_on_while_a_checkpoint_writes_the_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint writes consume-queue files outside the log lock: an append made while one
    queue's write is held up returns, and what was taken before it becomes durable."""
    log = CommitLog.open(tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)
    entered, release = threading.Event(), threading.Event()
    real = ConsumeQueue.write_pending

    def held(self: ConsumeQueue) -> None:
        if self.topic == "slow":
            entered.set()
            require(release.wait(30), "the test released the write")
        real(self)

    try:
        log.append([Message("slow", 0, b"a"), Message("fast", 0, b"b")])
        monkeypatch.setattr(ConsumeQueue, "write_pending", held)
        end = log.max_offset
        checkpoint = threading.Thread(target=log._flusher.flush_once, kwargs={"sync_cqs": True})
        checkpoint.start()
        require(entered.wait(30), "the checkpoint reached the queue writes")
        log.append([Message("fast", 0, b"c")])  # waited for the checkpoint before: deadlock here
        assert log._core.offsets.cq_durable < end  # not durable while the write is held
        release.set()
        checkpoint.join(30)
        assert not checkpoint.is_alive()
        assert log._core.offsets.cq_durable == end
        assert [m.body for m in log.read("fast", 0, 0, 10, confirmed_only=False)] == [b"b", b"c"]
    finally:
        release.set()
        log.close()


def test_a_queue_is_kept_only_once_the_filesystem_descriptor_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The descriptor syncfs goes through is opened before the first queue is kept: were the
    queue kept without it, nothing it wrote would ever be synced."""
    index = QueueIndex(str(tmp_path / "cq"), 1000)
    real = os.open

    def no_dir(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECTORY:
            raise OSError(24, "Too many open files")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", no_dir)
    with pytest.raises(OSError, match="Too many open files"):
        index.open("t", 0)
    assert index.get("t", 0) is None
    monkeypatch.undo()
    cq = index.open("t", 0)
    cq.extend([0], [1], [0])
    index.dirty.add(cq)
    index.sync(index.write_dirty())
    assert not cq.unsynced
    index.close_all()
