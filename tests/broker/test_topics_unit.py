"""Topic generation markers over real commit logs, in one process (broker/topics.py): a marker
cuts the same queue offsets on every replica whenever it is applied, the cut survives a restart,
a truncation below a marker gives the repaired replica the new master's index, a slave serves a
topic only once it holds the marker, and commits from before the marker are ignored."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.offsets import GroupOffsets, commit_message
from tidelog.broker.topics import MARKS_TOPIC, TopicTable, decode_mark, mark_message
from tidelog.commitlog import CommitLog, Message
from tidelog.errors import OffsetBelowRetentionError, UnavailableError

T = "ret"


def _open(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=1 << 20)


def _topic(generation: int, queues: int = 2) -> SimpleNamespace:
    return SimpleNamespace(name=T, queues={"a": queues}, generation=generation)


def _append(log: CommitLog):
    def append(msg: Message):
        placed = log.append([msg])[-1]
        log.confirm_offset = log.max_offset
        return placed

    return append


def _produce(log: CommitLog, prefix: str, n: int, queues: int = 2) -> None:
    log.append([Message(T, i % queues, f"{prefix}-{i}".encode()) for i in range(n)])
    log.confirm_offset = log.max_offset


def _copy(src: CommitLog, dst: CommitLog, upto: int | None = None) -> None:
    """Replicate src's bytes into dst, as the HA stream does."""
    end = src.max_offset if upto is None else upto
    off = dst.max_offset
    while off < end:
        data, _ = src.read_raw_chunk(off, min(1 << 16, end - off))
        off = dst.append_raw(off, data)
    dst.confirm_offset = dst.max_offset


def _index(log: CommitLog, queues: int = 2) -> dict[int, tuple[int, int, list[bytes]]]:
    out = {}
    for q in range(queues):
        o = log.queue_offsets(T, q)
        out[q] = (o.min, o.max, [m.body for m in log.read(T, q, o.min, 1000)] if o.max > o.min else [])
    return out


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**40),
    st.dictionaries(st.integers(0, 65535), st.integers(0, 2**50), max_size=8),
)
def test_markers_round_trip(topic: str, generation: int, cuts: dict[int, int]) -> None:
    assert decode_mark(mark_message(topic, generation, cuts).body) == (topic, generation, cuts)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b"[1]",
        b'{"t": 1, "g": 1, "cut": {}}',
        b'{"t": "x", "g": -1, "cut": {}}',
        b'{"t": "x", "g": 1, "cut": {"0": "5"}}',
        b'{"t": "x", "g": true, "cut": {}}',
    ],
)
def test_anything_else_is_not_a_marker(body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_mark(body)


def test_a_marker_cuts_the_same_offsets_on_every_replica_whenever_applied(tmp_path: Path) -> None:
    master, early, late = _open(tmp_path / "m"), _open(tmp_path / "s1"), _open(tmp_path / "s2")
    table = TopicTable(master)
    table.update("a", [_topic(1)])
    assert table.serve(T, _append(master)) == 2
    _produce(master, "old", 10)
    table.update("a", [_topic(2)])  # deleted and created again
    slaves = {name: TopicTable(log) for name, log in (("early", early), ("late", late))}
    for s in slaves.values():
        s.update("a", [_topic(2)])
    _copy(master, early)
    with pytest.raises(UnavailableError):  # a slave without the marker does not serve the topic
        slaves["early"].serve(T, None)
    table.enforce(_append(master))  # the master writes the marker
    assert _index(master) == {0: (5, 5, []), 1: (5, 5, [])}
    _produce(master, "new", 4)
    _copy(master, early)
    slaves["early"].serve(T, None)  # applied as soon as asked, after newer records arrived
    _copy(master, late)
    slaves["late"].serve(T, None)  # applied after every record arrived
    want = {0: (5, 7, [b"new-0", b"new-2"]), 1: (5, 7, [b"new-1", b"new-3"])}
    assert _index(master) == _index(early) == _index(late) == want
    for log in (master, early, late):
        with pytest.raises(OffsetBelowRetentionError):
            log.read(T, 0, 0)
        log.close()


def test_the_cut_holds_after_a_restart_and_its_files_go_at_once(tmp_path: Path) -> None:
    log = _open(tmp_path / "m")
    table = TopicTable(log)
    table.update("a", [_topic(1)])
    table.serve(T, _append(log))
    _produce(log, "old", 6)
    log.flush()
    log.close()  # consume-queue files written
    log = _open(tmp_path / "m")
    table = TopicTable(log)
    table.update("a", [], [_topic(1)])  # deleted: a tombstone
    table.enforce(_append(log))
    qdir = tmp_path / "m" / "consumequeue" / T
    assert all(f.stat().st_size == 0 for f in qdir.rglob("*") if f.is_file()), "units of the cut queue remain"
    marks = log.queue_offsets(MARKS_TOPIC, 0).max
    table.enforce(_append(log))
    assert log.queue_offsets(MARKS_TOPIC, 0).max == marks, "a tombstone is marked once"
    table.update("a", [_topic(3)])
    table.serve(T, _append(log))
    _produce(log, "new", 2)
    log.close()
    log = _open(tmp_path / "m")
    TopicTable(log)  # the fold at start-up
    assert _index(log) == {0: (3, 4, [b"new-0"]), 1: (3, 4, [b"new-1"])}
    log.close()


def test_a_truncated_marker_gives_the_repaired_replica_the_new_masters_index(tmp_path: Path) -> None:
    a, b, c = _open(tmp_path / "a"), _open(tmp_path / "b"), _open(tmp_path / "c")
    ta = TopicTable(a)
    ta.update("a", [_topic(1)])
    ta.serve(T, _append(a))
    _produce(a, "old", 4)
    fork = a.max_offset
    _copy(a, c)  # c: the common history
    _produce(a, "old-a", 2)  # a takes old-generation records c never gets
    ta.update("a", [_topic(2)])
    ta.enforce(_append(a))  # a writes a marker that c never gets
    _produce(a, "new-a", 2)
    _copy(a, b)
    tb = TopicTable(b)
    tb.update("a", [_topic(2)])
    tb.serve(T, None)
    assert _index(b)[0][0] == 3  # cut at a's marker
    # c becomes master: more old-generation records, then its own marker, then new ones
    tc = TopicTable(c)
    tc.update("a", [_topic(1)])
    tc.serve(T, _append(c))
    _produce(c, "old-c", 2)
    tc.update("a", [_topic(2)])
    tc.enforce(_append(c))
    _produce(c, "new-c", 2)
    # b repairs its fork: truncated to the common history, then it copies c's
    b.truncate(fork)
    _copy(c, b)
    tb.serve(T, None)
    assert _index(b) == _index(c) == {0: (3, 4, [b"new-c-0"]), 1: (3, 4, [b"new-c-1"])}
    for log in (a, b, c):
        log.close()


def test_a_commit_from_before_the_marker_belongs_to_the_old_topic(tmp_path: Path) -> None:
    log = _open(tmp_path / "m")
    table = TopicTable(log)
    table.update("a", [_topic(1)])
    table.serve(T, _append(log))
    _produce(log, "old", 4)
    log.append([commit_message("g", T, 0, 2), commit_message("h", T, 1, 1)])
    log.confirm_offset = log.max_offset
    offsets = GroupOffsets(log)
    assert offsets.fetch("g", T, 0, since=table.marks.marked_at(T)) == 2
    table.update("a", [_topic(2)])
    table.enforce(_append(log))
    log.append([commit_message("h", T, 1, 2)])
    log.confirm_offset = log.max_offset
    assert offsets.fetch("g", T, 0, since=table.marks.marked_at(T)) is None
    assert offsets.fetch("h", T, 1, since=table.marks.marked_at(T)) == 2
    assert offsets.fetch("g", T, 0) == 2  # without a marker position: as stored
    log.close()


def test_a_pass_with_nothing_new_since_the_last_one_reads_nothing(tmp_path: Path) -> None:
    """With many topics a pass sorts all of them: it runs again only after a new view, a marker or
    a promotion (bench.scale: 6% of an idle master's CPU at 100,000 topics)."""
    log = _open(tmp_path / "m")
    table = TopicTable(log)
    table.update("a", [_topic(1)])
    appended: list[Message] = []

    def counting(msg: Message):
        appended.append(msg)
        return _append(log)(msg)

    table.enforce(counting, epoch=1)
    assert len(appended) == 1  # the marker of generation 1
    passes = []
    table.generations = _Counting(table.generations, passes)
    table.enforce(counting, epoch=1)
    assert not passes and len(appended) == 1  # nothing changed: no pass at all
    table.enforce(counting, epoch=2)  # a promotion: one pass, nothing to write
    assert len(passes) == 1 and len(appended) == 1
    table.update("a", [_topic(2)])  # a new generation: a pass, and its marker
    table.enforce(counting, epoch=2)
    assert len(appended) == 2 and decode_mark(appended[-1].body)[1] == 2
    log.close()


class _Counting(dict):
    """A dict that records each walk over its items."""

    def __init__(self, items: dict, walks: list) -> None:
        super().__init__(items)
        self._walks = walks

    def items(self):
        self._walks.append(1)
        return super().items()
