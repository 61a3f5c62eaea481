"""The bound on the descriptors consume queues hold: many active queues share one LRU pool of
descriptors, evicted queues open theirs again on their next use, and nothing written is lost or
left unsynced by an eviction."""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest

from tidelog.broker import config as broker_config
from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.consumequeue import ConsumeQueue
from tidelog.commitlog.queues import QueueIndex
from tidelog.errors import ConfigError

Unit = tuple[int, int, int]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def queue_fds(root: Path) -> int:
    """Descriptors of this process open on files under `root`/consumequeue."""
    under = str(root / "consumequeue") + os.sep
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(under)
    return count


def test_units_written_through_evictions_read_back_equal_and_descriptors_stay_bounded(
    tmp_path: Path,
) -> None:
    bound, queues = 8, 60
    before = open_fds()
    index = QueueIndex(str(tmp_path / "cq"), 7, max_open_files=bound)
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
            most = max(most, open_fds() - before)
        for cq in index.write_dirty():
            cq.sync()
        most = max(most, open_fds() - before)
        for q in rng.sample(range(queues), 10):  # readers of old units open sealed files
            m = model[q]
            if m:
                lo = rng.randrange(len(m))
                assert index.open("t", q).units(lo, len(m)) == m[lo:]
                most = max(most, open_fds() - before)
    assert most <= bound
    assert index.descriptors.open_count <= bound
    assert index.descriptors.evictions > 0
    for q, m in model.items():
        assert index.open("t", q).units(0, len(m)) == m
    index.close_all()
    assert open_fds() == before
    again = QueueIndex(str(tmp_path / "cq"), 7, max_open_files=bound)
    again.load(durable_phys=phys)
    try:
        assert open_fds() - before <= bound
        for q, m in model.items():
            cq = again.get("t", q)
            assert cq is not None and cq.next_offset == len(m)
            assert cq.units(0, len(m)) == m
    finally:
        again.close_all()


def test_an_evicted_queue_with_unsynced_units_is_synced_before_its_descriptor_closes(
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
    assert written <= synced  # every file written was fdatasync'ed, by its eviction or its sync
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
    assert broker_config.from_mapping(base).cq_max_open_files == 1024
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
    broken = index.open("t", 5).unsynced_fd()
    real = os.fdatasync
    synced: list[int] = []

    def failing(fd: int) -> None:
        if fd == broken:
            raise OSError(5, "Input/output error")
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        index.sync(queues)
    assert len(synced) == 11  # every other queue was synced all the same
    assert index.open("t", 5).unsynced_fd() == broken  # the next checkpoint meets it again
    monkeypatch.setattr(os, "fdatasync", real)
    index.close_all()


def test_a_checkpoint_gives_the_sync_pool_only_the_queues_that_wrote(
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
    assert len(queues) == 30  # the flusher passes every queue
    synced: list[str] = []
    real = ConsumeQueue.sync
    monkeypatch.setattr(ConsumeQueue, "sync", lambda self: synced.append(self.dir) or real(self))
    index.sync(queues)
    assert sorted(synced) == sorted(index.open("t", q).dir for q in (3, 17))
    index.close_all()
