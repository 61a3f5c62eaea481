"""A controller node restarts from its own data dir: Raft journal and, after log compaction,
the snapshot (stored as ControllerState.to_dict(), not pickled classes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.controller.inproc import single_node
from tests.procs import free_address
from tidelog.controller.config import parse
from tidelog.controller.node import ControllerNode


def test_restart_restores_state_from_snapshot_and_journal(tmp_path: Path) -> None:
    nodes = [{"id": "c1", "raft": free_address(), "grpc": free_address()}]
    # Compact after a handful of entries so the restart must read the snapshot, then the journal tail.
    opts = {"nodes": nodes, "raft": {"log_compaction_min_entries": 4}}

    async def first_life() -> None:
        async with single_node(tmp_path, **opts) as (_node, client):
            for i in range(12):
                await client.meta_create(f"k/{i:02d}", f"v{i}".encode())
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
    nodes = [{"id": "c1", "raft": free_address(), "grpc": free_address()}]
    opts = {"nodes": nodes, "raft": {"log_compaction_min_entries": 4}}

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
