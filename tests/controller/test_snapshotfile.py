"""The controller's snapshot file written beside the Raft thread (controller/snapshotfile.py): the
state it holds is the state at the capture, whatever commands apply while it is written; a torn
or damaged file is refused; files of the earlier format still load; the writer reports SERIALIZING
until its file is in place; and a controller goes on committing while a snapshot is written."""

from __future__ import annotations

import asyncio
import copy
import gzip
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer

from tests.controller.inproc import compacting, create_keys, single_node
from tidelog.controller import snapshot, snapshotfile
from tidelog.controller.commands import AlterTopicQueues, AlterTopicRetention, CreateTopic, DeleteTopic
from tidelog.controller.model import BrokerSet, Member, MetaEntry, Topic
from tidelog.controller.raft import RaftNode
from tidelog.controller.recover import SNAPSHOT_FILE, _snapshot_index
from tidelog.controller.state import ControllerState
from tidelog.tasks import within

RAFT = ((b"last", 7, 2), (b"before", 6, 2), set())


def a_state(topics: int, keys: int, deleted: int = 0) -> ControllerState:
    s = ControllerState()
    for i in range(topics):
        s.topics[f"t{i}"] = Topic(f"t{i}", {"broker-a": 1 + i % 8}, created_ms=i, generation=i + 1)
    for i in range(deleted):
        s.deleted_topics[f"d{i}"] = Topic(f"d{i}", {"broker-a": 2}, generation=i + 1, deleted_ms=5)
    for i in range(keys):
        s.metadata[f"k/{i}"] = MetaEntry(f"k/{i}", b"v" * (i % 50), 1 + i % 3, i)
    s.next_topic_generation = topics + deleted + 1
    return s


@settings(max_examples=40, deadline=None)
@given(
    topics=st.integers(0, 60),
    keys=st.integers(0, 200),
    deleted=st.integers(0, 20),
    size=st.integers(1, 70),
)
def test_parts_of_any_size_restore_the_captured_state(
    topics: int, keys: int, deleted: int, size: int
) -> None:
    s = a_state(topics, keys, deleted)
    restored = ControllerState()
    snapshot.restore_parts(restored, snapshot.parts(snapshot.capture(s), size=size))
    assert restored == s


def test_the_file_holds_the_state_at_the_capture_not_what_applied_after(tmp_path: Path) -> None:
    s = a_state(3, 4)
    s.broker_sets["broker-a"] = BrokerSet(
        name="broker-a", members={1: Member(1, "127.0.0.1:1", "127.0.0.1:2")}, next_broker_id=2
    )
    before = copy.deepcopy(s)
    captured = snapshot.capture(s)
    # what the Raft thread applies while the file is written: topics and entries replaced
    for cmd in (
        CreateTopic(name="t9", queues={"broker-a": 2}, now_ms=9),
        AlterTopicRetention(name="t0", retention_ms=60_000, now_ms=9),
        DeleteTopic(name="t1", now_ms=9),
        AlterTopicQueues(name="t2", queues={"broker-a": 8}, now_ms=9),
    ):
        assert s.apply(cmd).ok
    s.metadata["k/0"] = MetaEntry("k/0", b"changed", 2, 9)
    del s.metadata["k/1"]
    assert s != before
    snapshotfile.write(tmp_path / "snap", RAFT, captured)
    restored, raft = snapshotfile.read(tmp_path / "snap", 1 << 20)
    assert restored == before
    assert raft == RAFT


def test_raft_part_alone_is_read_from_either_format(tmp_path: Path) -> None:
    """What the forced recovery reads of a stopped node's snapshot (controller/recover.py)."""
    path = tmp_path / SNAPSHOT_FILE
    snapshotfile.write(path, RAFT, snapshot.capture(a_state(3, 3)))
    assert snapshotfile.read_raft(path) == RAFT
    assert _snapshot_index(tmp_path) == 7
    with gzip.open(path, "wb") as f:
        pysyncobj_pickle.dump(
            [[{}, {"format": 2, "packed": snapshot.pack(a_state(1, 1).to_dict())}], *RAFT], f
        )
    assert snapshotfile.read_raft(path) == RAFT
    assert _snapshot_index(tmp_path) == 7
    path.write_bytes(snapshotfile.MAGIC)
    with pytest.raises(ValueError):
        snapshotfile.read_raft(path)


def test_a_torn_or_damaged_file_is_refused_at_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    snapshotfile.write(path, RAFT, snapshot.capture(a_state(5, 30)))
    whole = path.read_bytes()
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        with pytest.raises(ValueError):
            snapshotfile.check(path)
        with pytest.raises(ValueError):
            snapshotfile.read(path, 1 << 20)
    path.write_bytes(whole + b"\0")
    with pytest.raises(ValueError):
        snapshotfile.read(path, 1 << 20)
    damaged = bytearray(whole)
    damaged[len(snapshotfile.MAGIC) + 8] ^= 0xFF  # inside the first frame's zlib stream
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="does not decode"):
        snapshotfile.read(path, 1 << 20)


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_file_of_the_earlier_format_loads(tmp_path: Path, fmt: int) -> None:
    s = a_state(20, 50, 2)
    doc = s.to_dict()
    consumer = {"format": 1, "state": doc} if fmt == 1 else {"format": 2, "packed": snapshot.pack(doc)}
    path = tmp_path / "snap"
    with gzip.open(path, "wb") as f:
        pysyncobj_pickle.dump([[{}, consumer], *RAFT], f)
    snapshotfile.check(path)
    restored, raft = snapshotfile.read(path, 1 << 20)
    assert restored == s
    assert raft == RAFT
    with gzip.open(path, "wb") as f:
        pysyncobj_pickle.dump([[{}, {"format": 9}], *RAFT], f)
    with pytest.raises(ValueError, match="not a controller snapshot"):
        snapshotfile.check(path)


class Gate:
    """Holds `snapshotfile.write` until opened, and says when a write is waiting there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        real = snapshotfile.write

        def held(path: Path, raft: Any, captured: snapshot.Capture, rest_share: float = 0.0) -> int:
            self.entered.set()
            assert self.opened.wait(30), "the test never opened the gate"
            if fail:
                raise OSError(28, "No space left on device")
            return real(path, raft, captured, rest_share)

        monkeypatch.setattr(snapshotfile, "write", held)


def test_the_writer_reports_serializing_until_its_file_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    path = tmp_path / "raft.snapshot"
    path.write_bytes(b"the snapshot before")
    state = a_state(2, 3)
    restored: list[ControllerState] = []
    writer = snapshotfile.SnapshotWriter(path, lambda: snapshot.capture(state), restored.append, 1 << 20)
    tmp = tmp_path / "raft.snapshot.tmp"
    tmp.write_bytes(b"stale: PySyncObj would rename it over the snapshot")
    assert writer.check() == SERIALIZER_STATE.NOT_SERIALIZING
    writer.serialize(str(tmp), RAFT)
    assert not tmp.exists()
    assert gate.entered.wait(10)
    assert writer.check() == SERIALIZER_STATE.SERIALIZING
    assert path.read_bytes() == b"the snapshot before"
    gate.opened.set()
    assert writer.wait(10)
    assert writer.check() == SERIALIZER_STATE.SUCCESS
    assert writer.check() == SERIALIZER_STATE.NOT_SERIALIZING
    assert not writer.writing.exists()
    assert writer.load(str(path)) == RAFT
    assert restored == [state]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_write_reports_failed_after_a_pause_and_keeps_the_snapshot_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch, fail=True)
    path = tmp_path / "raft.snapshot"
    path.write_bytes(b"the snapshot before")
    state = a_state(1, 1)
    clock = Clock()
    writer = snapshotfile.SnapshotWriter(
        path, lambda: snapshot.capture(state), lambda s: None, 1 << 20, clock
    )
    writer.serialize(str(tmp_path / "raft.snapshot.tmp"), RAFT)
    gate.opened.set()
    assert writer.wait(10)
    # not again at every tick on a full disk: a pause first
    assert writer.check() == SERIALIZER_STATE.SERIALIZING
    clock.now += writer.RETRY_AFTER_S
    assert writer.check() == SERIALIZER_STATE.FAILED
    assert writer.check() == SERIALIZER_STATE.NOT_SERIALIZING
    assert path.read_bytes() == b"the snapshot before"
    assert not writer.writing.exists()


def test_a_write_begun_before_a_leaders_snapshot_loaded_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Putting it in place would lay an older state over the one just loaded, beside a journal
    that starts after it: a restart would then clear the journal to the older snapshot."""
    gate = Gate(monkeypatch)
    path = tmp_path / "raft.snapshot"
    older, newer = a_state(1, 1), a_state(5, 5)
    restored: list[ControllerState] = []
    writer = snapshotfile.SnapshotWriter(path, lambda: snapshot.capture(older), restored.append, 1 << 20)
    writer.serialize(str(tmp_path / "raft.snapshot.tmp"), RAFT)
    assert gate.entered.wait(10)
    sent = ((b"n", 70, 3), (b"m", 69, 3), set())
    gate.opened.set()  # the leader's file is written with the real `write`, past the gate
    snapshotfile.write(tmp_path / "sent", sent, snapshot.capture(newer))
    os.replace(tmp_path / "sent", path)  # as PySyncObj puts a received snapshot in place
    assert writer.load(str(path)) == sent and restored == [newer]
    assert writer.wait(10)
    assert writer.check() == SERIALIZER_STATE.FAILED
    assert snapshotfile.read_raft(path) == sent
    assert not writer.writing.exists()


def test_through_pysyncobjs_serializer_a_failed_capture_ends_and_the_next_one_writes(
    tmp_path: Path,
) -> None:
    """PySyncObj's `Serializer` serializes nothing more until the checker answers SUCCESS or
    FAILED: a capture that raises must end in FAILED, not leave it waiting for good."""
    path = tmp_path / "raft.snapshot"
    state = a_state(2, 2)
    broken = [True]

    def capture() -> snapshot.Capture:
        if broken[0]:
            raise MemoryError("the capture failed")
        return snapshot.capture(state)

    clock = Clock()
    writer = snapshotfile.SnapshotWriter(path, capture, lambda s: None, 1 << 20, clock)
    ser = Serializer(str(path), 1024, False, writer.serialize, writer.load, writer.check)
    ser.serialize((None, *RAFT), RAFT[0][1])
    assert ser.checkSerializing() == (SERIALIZER_STATE.SERIALIZING, 7)
    clock.now += writer.RETRY_AFTER_S
    assert ser.checkSerializing() == (SERIALIZER_STATE.FAILED, 7)
    broken[0] = False
    ser.serialize((None, *RAFT), RAFT[0][1])
    assert writer.wait(10)
    assert ser.checkSerializing() == (SERIALIZER_STATE.SUCCESS, 7)
    assert snapshotfile.read(path, 1 << 20) == (state, RAFT)


@pytest.mark.slow
def test_a_controller_commits_while_a_snapshot_is_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write is held open; commands still commit (in the Raft thread, which PySyncObj's own
    writer would have held for the whole write); once the file is in place, a restart reads it."""
    gate = Gate(monkeypatch)
    opts = compacting()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 6)  # a compaction starts, its write held at the gate
            assert await asyncio.to_thread(gate.entered.wait, 10), "no snapshot was started"
            for i in range(6, 12):
                await within(client.meta_create(f"k/{i:02d}", f"v{i}".encode()), 5)
            assert not gate.opened.is_set()
            gate.opened.set()
            snap = tmp_path / "data" / "c1" / "raft.snapshot"
            deadline = asyncio.get_running_loop().time() + 10
            while not snap.exists():
                assert asyncio.get_running_loop().time() < deadline, "the snapshot was never put in place"
                await asyncio.sleep(0.02)

    async def second_life() -> list[tuple[str, bytes]]:
        async with single_node(tmp_path, **opts) as (_node, client):
            return [(e.key, e.value) for e in await client.meta_list("k/")]

    asyncio.run(first_life())
    assert asyncio.run(second_life()) == [(f"k/{i:02d}", f"v{i}".encode()) for i in range(12)]


@pytest.mark.slow
def test_a_snapshot_that_ends_while_the_node_stops_is_put_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its write is held until the node has begun to stop: the Raft thread's check never comes,
    and the stop itself puts the file in place (the start then aligns the journal to it)."""
    gate = Gate(monkeypatch)
    opts = compacting()
    closing = threading.Event()
    real_close = RaftNode.close

    def close(self: RaftNode) -> None:
        closing.set()
        real_close(self)

    monkeypatch.setattr(RaftNode, "close", close)
    opener = threading.Thread(target=lambda: closing.wait(60) and gate.opened.set(), daemon=True)
    opener.start()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 6)
            assert await asyncio.to_thread(gate.entered.wait, 10), "no snapshot was started"

    async def second_life() -> list[str]:
        async with single_node(tmp_path, **opts) as (_node, client):
            return [e.key for e in await client.meta_list("k/")]

    asyncio.run(first_life())
    opener.join(10)
    assert (tmp_path / "data" / "c1" / "raft.snapshot").exists()
    assert asyncio.run(second_life()) == [f"k/{i:02d}" for i in range(6)]
