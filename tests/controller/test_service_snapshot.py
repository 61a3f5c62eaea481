"""A controller node restarts from its own data dir: Raft journal and, after log compaction,
the snapshot (stored as ControllerState.to_dict(), not pickled classes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pysyncobj import syncobj as psyncobj

from tests.controller.inproc import compacting, create_keys, single_node
from tidelog.controller.config import parse
from tidelog.controller.node import ControllerNode
from tidelog.controller.raftdisk import align_journal


def test_restart_restores_state_from_snapshot_and_journal(tmp_path: Path) -> None:
    opts = compacting()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 12)
            await client.register_broker("broker-a", "127.0.0.1:30001", "127.0.0.1:31001", identity="a-1")
            await client.create_topic("orders", {"broker-a": 4})
            await client.meta_cas("k/00", b"changed", 1)
            await client.create_user("alice", "AKalice1", "ab" * 32)
            await client.grant_acl("alice", "topic", "orders-*", "produce")

    async def second_life() -> None:
        async with single_node(tmp_path, **opts) as (node, client):
            entries = await client.meta_list("k/")
            assert [e.key for e in entries] == [f"k/{i:02d}" for i in range(12)]
            assert (entries[0].value, entries[0].version) == (b"changed", 2)
            assert [t.name for t in await client.list_topics()] == ["orders"]
            assert [(u.name, u.access_key) for u in await client.list_users()] == [("alice", "AKalice1")]
            assert [(g.user, g.kind, g.pattern, g.permission) for g in await client.list_acls()] == [
                ("alice", "topic", "orders-*", "produce")
            ]
            assert node.acl_table().users["alice"].signing_key == "ab" * 32  # the derived key, kept
            sets = (await client.describe_broker_sets()).broker_sets
            assert [(s.role.broker_set, [m.broker_id for m in s.members]) for s in sets] == [
                ("broker-a", [1])
            ]
            # ids keep counting from where they were
            reply = await client.register_broker(
                "broker-a", "127.0.0.1:30002", "127.0.0.1:31002", identity="a-2"
            )
            assert reply.broker_id == 2

    asyncio.run(first_life())
    assert (tmp_path / "data" / "c1" / "raft.snapshot").exists(), "log compaction never wrote a snapshot"
    asyncio.run(second_life())


def test_an_unreadable_snapshot_stops_the_node_instead_of_starting_empty(tmp_path: Path) -> None:
    opts = compacting()

    async def write() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            for i in range(8):
                await client.meta_create(f"k/{i}", b"v")

    asyncio.run(write())
    snapshot = tmp_path / "data" / "c1" / "raft.snapshot"
    assert snapshot.exists()
    snapshot.write_bytes(snapshot.read_bytes()[:20])  # torn
    cfg = parse({"data_dir": str(tmp_path / "data"), **opts})
    with pytest.raises(ValueError, match="snapshot .* is unreadable"):
        ControllerNode(cfg)


def test_a_stop_between_a_snapshot_and_the_journals_cut_loses_no_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySyncObj writes a compaction's snapshot, then cuts the journal a tick later. A node that
    stops in between (here: every cut is skipped, as if each time it stopped right there) comes
    back with a journal that starts before the snapshot's end; PySyncObj alone cleared such a
    journal to the snapshot and lost every entry after it (controller/raftdisk.py `align_journal`)."""
    opts = compacting()

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            await create_keys(client, 12)

    async def second_life() -> list[str]:
        async with single_node(tmp_path, **opts) as (_node, client):
            return [e.key for e in await client.meta_list("k/")]

    with monkeypatch.context() as m:
        m.setattr(psyncobj.SyncObj, "_SyncObj__deleteEntriesTo", lambda self, to_index: None)
        asyncio.run(first_life())
    assert (tmp_path / "data" / "c1" / "raft.snapshot").exists(), "log compaction never wrote a snapshot"
    assert asyncio.run(second_life()) == [f"k/{i:02d}" for i in range(12)]


def test_align_journal_cuts_only_to_the_snapshots_own_entries() -> None:
    journal = [(b"c%d" % i, i, 1) for i in range(1, 11)]

    class _Journal(list[tuple[bytes, int, int]]):
        def deleteEntriesTo(self, to: int) -> None:  # noqa: N802 (PySyncObj's name)
            del self[:to]

    j = _Journal(journal)
    assert align_journal(j, journal[5], journal[6]) == 5  # the snapshot ends at entry 7
    assert j == journal[5:]
    assert align_journal(j, journal[5], journal[6]) == 0  # aligned already
    for before, last in (
        ((b"other", 6, 1), journal[6]),  # not this log's entry
        (journal[5], (b"c7", 7, 2)),  # another term
        (journal[9], (b"c11", 11, 1)),  # the snapshot ends past the journal
        ((b"c0", 0, 1), journal[0]),  # before the journal's start
    ):
        k = _Journal(journal)
        assert align_journal(k, before, last) == 0 and k == journal
