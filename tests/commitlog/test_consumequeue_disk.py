"""Consume queues read from their files: the on-disk queue against an in-memory model, memory that
holds only unwritten units, an open that reads no whole file, no descriptor left behind, and none
closed twice after the open of a queue's next file failed."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tidelog.commitlog.consumequeue import UNIT, UNIT_SIZE, ConsumeQueue, written_units
from tidelog.commitlog.queues import QueueIndex

Unit = tuple[int, int, int]


class Model:
    """A queue as a list: units [base, next) in physical order, nothing on disk."""

    def __init__(self) -> None:
        self.base = 0
        self.units: list[Unit] = []
        self.cursor = 0  # the next record's physical offset

    @property
    def next(self) -> int:
        return self.base + len(self.units)

    def first_at_or_after(self, phys: int) -> int:
        return self.base + next((i for i, u in enumerate(self.units) if u[0] >= phys), len(self.units))

    def confirmed_end(self, confirm: int) -> int:
        return self.base + sum(1 for u in self.units if u[0] + u[1] <= confirm)


class QueueAgainstModel(RuleBasedStateMachine):
    """Random put/extend/write/truncate/trim/cut/reopen/close-descriptors sequences on a queue of
    tiny files."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.cq: ConsumeQueue | None = None

    @initialize(per_file=st.integers(1, 5))
    def open_queue(self, per_file: int) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.per_file = per_file
        self.cq = ConsumeQueue(os.path.join(self.tmp.name, "q"), "t", 0, per_file)

    def teardown(self) -> None:
        if self.cq is not None:
            self.cq.close()
            self.tmp.cleanup()

    def _new_units(self, sizes: list[int], gaps: list[int]) -> list[Unit]:
        out = []
        for size, gap in zip(sizes, gaps, strict=False):
            self.model.cursor += gap
            out.append((self.model.cursor, size, self.model.cursor * 7))
            self.model.cursor += size
        return out

    @rule(
        sizes=st.lists(st.integers(1, 50), min_size=1, max_size=12),
        gaps=st.lists(st.integers(0, 30), min_size=12),
    )
    def extend(self, sizes: list[int], gaps: list[int]) -> None:
        assert self.cq is not None
        units = self._new_units(sizes, gaps)
        self.cq.extend([u[0] for u in units], [u[1] for u in units], [u[2] for u in units])
        self.model.units.extend(units)

    @rule(size=st.integers(1, 50), skip=st.integers(0, 3))
    def put(self, size: int, skip: int) -> None:
        assert self.cq is not None
        (u,) = self._new_units([size], [0])
        qoff = self.model.next + (skip if not self.model.units else 0)  # skipping only when empty
        self.cq.put(qoff, *u, where="test")
        if qoff > self.model.next:
            self.model.base = qoff
        self.model.units.append(u)

    @rule(pick=st.integers(0, 10**6))
    def redispatch(self, pick: int) -> None:
        assert self.cq is not None
        if self.model.units:
            i = pick % len(self.model.units)
            self.cq.put(self.model.base + i, *self.model.units[i], where="test")  # a no-op

    @rule()
    def write_pending(self) -> None:
        assert self.cq is not None
        self.cq.write_pending()

    @rule()
    def release_descriptors(self) -> None:
        """The log's descriptor pool closes this queue's files; its next use opens them again."""
        assert self.cq is not None
        assert self.cq.release_descriptors()

    @rule(pick=st.integers(0, 10**6), into_gap=st.integers(0, 30))
    def truncate_phys(self, pick: int, into_gap: int) -> None:
        """Truncate at a record boundary: a unit's start, or inside the gap before it (another
        queue's records), or the end."""
        assert self.cq is not None
        m = self.model
        if m.units:
            i = pick % len(m.units)
            prev_end = m.units[i - 1][0] + m.units[i - 1][1] if i else 0
            at = max(prev_end, m.units[i][0] - into_gap)
        else:
            at = max(0, m.cursor - into_gap)
        self.cq.truncate_phys(at)
        m.units = m.units[: m.first_at_or_after(at) - m.base]
        m.cursor = min(m.cursor, at)

    @rule(back=st.integers(0, 200))
    def trim_below(self, back: int) -> None:
        assert self.cq is not None
        at = max(0, self.model.cursor - back)
        self.cq.trim_below(at)
        new_base = self.model.first_at_or_after(at)
        self.model.units = self.model.units[new_base - self.model.base :]
        self.model.base = new_base

    @rule(ahead=st.integers(-3, 6))
    def cut(self, ahead: int) -> None:
        assert self.cq is not None
        at = max(0, self.model.next + ahead)
        self.cq.cut(at)
        if at > self.model.base:  # units below `at` go; the queue starts (or continues) there
            self.model.units = self.model.units[min(at - self.model.base, len(self.model.units)) :]
            self.model.base = at

    @rule()
    def reopen(self) -> None:
        """Written units survive a close; the first file may start below the queue's start, which
        the owner cuts again (as the broker does after a restart)."""
        assert self.cq is not None
        self.cq.write_pending()
        self.cq.close()
        self.cq = ConsumeQueue(os.path.join(self.tmp.name, "q"), "t", 0, self.per_file)
        assert self.cq.pending == 0
        assert self.cq.min_offset <= self.model.base
        assert self.cq.next_offset == max(self.model.next, self.cq.min_offset)
        self.cq.cut(self.model.base)

    @precondition(lambda self: self.cq is not None)
    @invariant()
    def same_as_model(self) -> None:
        cq, m = self.cq, self.model
        assert cq is not None
        assert (cq.min_offset, cq.next_offset) == (m.base, m.next)
        assert cq.units(m.base, m.next) == m.units
        assert [cq.unit(q) for q in range(m.base, m.next)] == m.units
        assert [cq.units(q, min(q + 2, m.next)) for q in range(m.base, m.next)] == [
            m.units[q - m.base : q - m.base + 2] for q in range(m.base, m.next)
        ]
        for probe in {0, m.cursor, m.cursor // 2, *(u[0] + d for u in m.units[-3:] for d in (-1, 0, 1))}:
            assert cq.confirmed_end(probe) == m.confirmed_end(probe), probe
            qoff, phys = cq.unit_at(probe)
            assert qoff == m.first_at_or_after(probe)
            assert phys == (m.units[qoff - m.base][0] if qoff < m.next else None)


QueueAgainstModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
TestQueueAgainstModel = QueueAgainstModel.TestCase


def test_written_units_finds_the_zero_tail() -> None:
    for n in range(0, 9):
        for written in range(0, n + 1):
            sizes = [5] * written + [0] * (n - written)
            assert written_units(lambda i, s=sizes: s[i], n) == written


def fill(cq: ConsumeQueue, n: int, batch: int = 10_000) -> None:
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        cq.extend([i * 100 for i in range(lo, hi)], [100] * (hi - lo), [i for i in range(lo, hi)])
        cq.write_pending()


def test_units_in_files_leave_memory_and_a_reopen_loads_none(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path / "q"), "t", 0, 30_000)
    fill(cq, 200_000)
    assert cq.pending == 0 and len(cq.phys) == len(cq.sizes) == len(cq.tags) == 0
    cq.extend([200_000 * 100], [100], [1])
    assert cq.pending == 1  # only what the flusher has not written yet
    cq.write_pending()
    cq.close()
    again = ConsumeQueue(str(tmp_path / "q"), "t", 0, 30_000)
    try:
        assert (again.min_offset, again.next_offset, again.pending) == (0, 200_001, 0)
        assert again.file_count == 7
        assert again.unit(0) == (0, 100, 0) and again.unit(199_999) == (199_999 * 100, 100, 199_999)
        assert again.units(29_998, 30_002) == [(i * 100, 100, i) for i in range(29_998, 30_002)]
        assert again.confirmed_end(150_000 * 100 + 99) == 150_000
        assert again.unit_at(123_456 * 100 - 5) == (123_456, 123_456 * 100)
        assert again.pending == 0  # reads and searches brought nothing into memory
    finally:
        again.close()


def test_an_open_reads_no_whole_file_and_a_damaged_middle_unit_shows_only_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qdir = tmp_path / "q"
    cq = ConsumeQueue(str(qdir), "t", 0, 50_000)
    fill(cq, 100_000)
    cq.close()
    with open(qdir / f"{0:020d}", "r+b") as f:  # zero the size of unit 777, mid-file
        f.seek(777 * UNIT_SIZE)
        f.write(UNIT.pack(777 * 100, 0, 777))
    read = []
    real_pread, real_read = os.pread, os.read
    monkeypatch.setattr(os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real_read(fd, n))
    again = ConsumeQueue(str(qdir), "t", 0, 50_000)
    monkeypatch.undo()
    try:
        assert sum(read) <= 4 * UNIT_SIZE  # a unit or two of each file, of 50,000 each
        assert again.next_offset == 100_000  # the damage was not looked at
        assert again.unit(777) == (777 * 100, 0, 777)
    finally:
        again.close()


def test_an_unwritten_zero_tail_is_cut_at_open(tmp_path: Path) -> None:
    qdir = tmp_path / "q"
    cq = ConsumeQueue(str(qdir), "t", 0, 100)
    fill(cq, 150)
    cq.close()
    with open(qdir / f"{100:020d}", "ab") as f:  # a crash left the file longer, with zeros
        f.write(bytes(UNIT_SIZE * 7 + 3))
    again = ConsumeQueue(str(qdir), "t", 0, 100)
    try:
        assert again.next_offset == 150
        assert os.path.getsize(qdir / f"{100:020d}") == 50 * UNIT_SIZE
        assert again.unit(149) == (14_900, 100, 149)
    finally:
        again.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_outlives_truncation_cuts_retention_or_close(tmp_path: Path) -> None:
    before = open_fds()
    index = QueueIndex(str(tmp_path / "cq"), 10)
    cq = index.open("t", 0)
    fill(cq, 95, batch=7)
    assert [cq.unit(q)[0] for q in (3, 15, 27, 44, 61, 90)] == [q * 100 for q in (3, 15, 27, 44, 61, 90)]
    cq.truncate_phys(50 * 100)
    cq.trim_below(12 * 100)
    assert [u[0] for u in cq.units(12, 50)] == [q * 100 for q in range(12, 50)]
    cq.cut(33)
    assert cq.units(33, 50)[0] == (3300, 100, 33)
    cq.cut(60)  # past the end: an empty anchor file
    assert (cq.min_offset, cq.next_offset) == (60, 60)
    other = index.open("u", 1)
    fill(other, 40, batch=9)
    other.units(0, 40)
    index.drop_topic("u")
    index.close_all()
    assert open_fds() == before


def test_a_reader_never_sees_a_unit_move_from_the_tail_to_the_files(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path / "q"), "t", 0, 64)
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            n = cq.next_offset
            if n and [u[0] for u in cq.units(max(0, n - 50), n)] != [
                q * 100 for q in range(max(0, n - 50), n)
            ]:
                bad.append(f"wrong units below {n}")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for lo in range(0, 5000, 50):
            cq.extend([q * 100 for q in range(lo, lo + 50)], [100] * 50, [0] * 50)
            if lo % 150 == 0:
                cq.write_pending()
    finally:
        stop.set()
        t.join()
        cq.close()
    assert not bad


def test_a_failed_open_of_the_next_file_leaves_no_closed_descriptor_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq = ConsumeQueue(str(tmp_path / "q"), "t", 0, 10)
    fill(cq, 10)  # the first file is full: the next unit opens the next file
    old_fd = cq._fd
    assert old_fd is not None
    real_open = os.open

    def fail_once(*args: object, **kw: object) -> int:
        monkeypatch.setattr(os, "open", real_open)
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "open", fail_once)
    cq.extend([1000], [100], [10])
    with pytest.raises(OSError, match="Too many open files"):
        cq.write_pending()
    # The old descriptor is closed; its number now belongs to another file, as it would once
    # anything else opened one.
    sentinel = real_open(os.devnull, os.O_RDONLY)
    if sentinel != old_fd:  # the lowest free number is usually that one already
        os.dup2(sentinel, old_fd)
        os.close(sentinel)
    try:
        cq.close()
        os.fstat(old_fd)  # still open: the queue did not close what it no longer owned
    finally:
        os.close(old_fd)
