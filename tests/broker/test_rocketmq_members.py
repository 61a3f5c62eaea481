"""The RocketMQ endpoint's consumers as group members (broker/rocketmqmembers.py), against an
in-memory metadata store: what is announced, how often, and what a termination or another
endpoint's announcement of the same consumer does."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.broker import rocketmqmembers as rm
from tidelog.broker import rocketmqrules as rules
from tidelog.client import assign as asg
from tidelog.errors import MetadataExistsError, MetadataNotFoundError, MetadataVersionMismatchError
from tidelog.proto import controller_pb2 as pb


class Store:
    """The controllers' metadata store, as the endpoint's client calls it."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[bytes, int]] = {}
        self.writes = 0

    async def meta_create(self, key: str, value: bytes) -> pb.MetaEntry:
        if key in self.entries:
            raise MetadataExistsError(key)
        return self._put(key, value, 1)

    async def meta_cas(self, key: str, value: bytes, expected_version: int) -> pb.MetaEntry:
        if key not in self.entries:
            raise MetadataNotFoundError(key)
        if self.entries[key][1] != expected_version:
            raise MetadataVersionMismatchError(key)
        return self._put(key, value, expected_version + 1)

    async def meta_get(self, key: str) -> pb.MetaEntry:
        if key not in self.entries:
            raise MetadataNotFoundError(key)
        value, version = self.entries[key]
        return pb.MetaEntry(key=key, value=value, version=version)

    async def meta_delete(self, key: str) -> None:
        if self.entries.pop(key, None) is None:
            raise MetadataNotFoundError(key)

    def _put(self, key: str, value: bytes, version: int) -> pb.MetaEntry:
        self.writes += 1
        self.entries[key] = (value, version)
        return pb.MetaEntry(key=key, value=value, version=version)

    def members(self, group: str) -> dict[str, dict[str, Any]]:
        prefix = asg.members_prefix(group)
        return {k[len(prefix) :]: json.loads(v) for k, (v, _) in self.entries.items() if k.startswith(prefix)}


def members_of(store: Store) -> rm.Members:
    return rm.Members(SimpleNamespace(controller=store))  # type: ignore[arg-type]


async def settle(m: rm.Members) -> None:
    while m._tasks:  # noqa: SLF001 - the test waits for the background writes it caused
        await asyncio.sleep(0.01)


CLIENT = "host@1@0@abc"


def test_a_consumer_is_announced_per_topic_as_a_shared_member_and_deleted_when_it_terminates() -> None:
    async def go() -> None:
        store = Store()
        m = members_of(store)
        m.seen("billing", CLIENT, ["orders", "refunds"])
        await settle(m)
        got = store.members("billing")
        assert set(got) == {rules.member_id(CLIENT, "orders"), rules.member_id(CLIENT, "refunds")}
        for mid, doc in got.items():
            assert doc["mode"] == "shared" and doc["session_ms"] == rm.SESSION_MS
            assert mid.endswith(doc["topic"])
        now_ms = int(time.time() * 1000)
        prefix = asg.members_prefix("billing")
        live = asg.active_members(((k, v) for k, (v, _) in store.entries.items()), prefix, now_ms)
        assert sorted(live.values()) == ["orders", "refunds"]
        # the group remembers its topics beyond its members, as for tidelog's own consumers
        assert asg.topics_prefix("billing") + "orders" in store.entries
        # a heartbeat (no topic) renews the topics learned before; within ANNOUNCE_S: no write
        writes = store.writes
        m.seen("billing", CLIENT)
        await settle(m)
        assert store.writes == writes
        m.gone("billing", CLIENT)
        await settle(m)
        assert store.members("billing") == {}
        # past the session, a member that stopped calling is not live any more
        later = now_ms + rm.SESSION_MS + 1
        assert asg.active_members(((k, v) for k, (v, _) in store.entries.items()), prefix, later) == {}

    asyncio.run(go())


def test_a_renewal_after_another_endpoint_announced_the_same_consumer_writes_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def go() -> None:
        store = Store()
        here, there = members_of(store), members_of(store)
        here.seen("billing", CLIENT, ["orders"])
        await settle(here)
        there.seen("billing", CLIENT, ["orders"])  # another broker set's endpoint: key exists
        await settle(there)
        monkeypatch.setattr(rm, "ANNOUNCE_S", 0.0)
        here.seen("billing", CLIENT)  # its version is stale now
        await settle(here)
        ((_, version),) = [e for k, e in store.entries.items() if "/members/" in k]
        assert version == 3

    asyncio.run(go())
