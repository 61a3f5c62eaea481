"""A flusher round writes only the consume queues that are due (commitlog/queues.py `due_split`,
commitlog/flusher.py CQ_ROUNDS, CQ_ENOUGH_UNITS): which queues a round takes and what it leaves, the durable
offset it records (never past a unit left in memory), and a crash with queues left unwritten:
recovery rebuilds them from the log and every message reads back, bytes equal."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tidelog.commitlog import CommitLog, Message
from tidelog.commitlog.checkpoint import CheckpointFile
from tidelog.commitlog.flusher import CQ_ENOUGH_UNITS, CQ_ROUNDS
from tidelog.commitlog.queues import due_split


@dataclass(eq=False)
class _Queue:
    phys: list[int] = field(default_factory=list)


@given(
    st.lists(st.lists(st.integers(0, 1000), max_size=6), max_size=12),
    st.integers(0, 1100),
    st.integers(1, 7),
)
def test_due_split_takes_what_is_old_or_many_and_keeps_the_rest_durable(
    pendings: list[list[int]], cut: int, enough: int
) -> None:
    queues = [_Queue(sorted(p)) for p in pendings]
    target = 1200
    taken, left, durable = due_split(queues, cut, target, enough)
    assert sorted(map(id, taken + left)) == sorted(map(id, queues))
    assert all(not q.phys or q.phys[0] < cut or len(q.phys) >= enough for q in taken)
    assert all(q.phys and q.phys[0] >= cut and len(q.phys) < enough for q in left)
    assert durable == min([target] + [q.phys[0] for q in left])


def _round(log: CommitLog) -> None:
    log._flusher.flush_once(sync_cqs=True, pace=True)  # noqa: SLF001 - the flusher's own round


def _written(tmp: Path, topic: str) -> bool:
    return any(f.stat().st_size for f in (tmp / "consumequeue" / topic).rglob("*") if f.is_file())


def test_a_round_writes_a_queue_once_its_units_are_older_than_the_cut(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)
    try:
        log.append([Message("a", 0, b"a0"), Message("b", 0, b"b0")])
        for _ in range(CQ_ROUNDS):  # no round old enough yet: nothing written, nothing vouched for
            _round(log)
            assert not _written(tmp_path, "a") and log._core.offsets.cq_durable == 0  # noqa: SLF001
        log.append([Message("b", 0, b"b1")])
        _round(log)  # a and b hold units older than the first round's end: both written
        assert _written(tmp_path, "a") and _written(tmp_path, "b")
        assert log._core.offsets.cq_durable == log.max_offset  # noqa: SLF001
        before_a1 = log.max_offset
        log.append([Message("a", 0, b"a1")])
        newest = log.max_offset
        _round(log)  # a's new unit is younger than the cut: left, and the durable offset stops at it
        assert log._core.offsets.cq_durable == before_a1  # noqa: SLF001
        assert [m.body for m in log.read("a", 0, 0, 10, confirmed_only=False)] == [b"a0", b"a1"]
    finally:
        log.close()
    assert CheckpointFile(str(tmp_path)).loaded.cq_offset == newest  # a clean close writes them all


_CRASH = """
import os, sys
from tidelog.commitlog import CommitLog, Message
log = CommitLog.open(sys.argv[1], flush_interval_ms=10**6, checkpoint_interval_ms=10**6)
for r in range(int(sys.argv[2])):
    log.append([Message(f"t{q}", 0, b"r%d-q%d" % (r, q)) for q in range(8) if (r + q) % 3])
    log._flusher.flush_once(sync_cqs=True, pace=True)
print(log._core.offsets.cq_durable, log.max_offset, flush=True)
os._exit(0)  # a crash: no clean close, some queues' units only in memory
"""


def test_a_queue_with_enough_units_is_written_at_once(tmp_path: Path) -> None:
    log = CommitLog.open(tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)
    try:
        log.append([Message("busy", 0, b"x")] * CQ_ENOUGH_UNITS + [Message("quiet", 0, b"y")])
        _round(log)
        assert _written(tmp_path, "busy") and not _written(tmp_path, "quiet")
    finally:
        log.close()


def test_after_a_crash_the_queues_left_unwritten_are_rebuilt_from_the_log(tmp_path: Path) -> None:
    rounds = 7
    out = subprocess.run(
        [sys.executable, "-c", _CRASH, str(tmp_path), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    durable, end = map(int, out.stdout.split())
    assert durable < end  # the crash left units the files do not hold
    log = CommitLog.open(tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)
    try:
        assert log.max_offset == end
        for q in range(8):
            want = [b"r%d-q%d" % (r, q) for r in range(rounds) if (r + q) % 3]
            got = [m.body for m in log.read(f"t{q}", 0, 0, 100, confirmed_only=False)]
            assert got == want, q
    finally:
        log.close()
