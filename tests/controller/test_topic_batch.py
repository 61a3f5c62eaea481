"""Topics in bulk (controller/topics.py `create_topics`, the CreateTopics and paged ListTopics calls):
many topics in one Raft commit, each created or refused on its own; lists a page at a time."""

from __future__ import annotations

import asyncio
import copy
import pickle
from pathlib import Path

import pytest

from tests.controller.inproc import single_node
from tests.controller.simbroker import SimBroker
from tests.controller.test_state_rules import A, mastered, refused
from tidelog.client.controllers import ControllerClient
from tidelog.controller.config import parse
from tidelog.controller.state import ControllerState, CreateTopic, CreateTopics
from tidelog.controller.topics import MAX_TOPICS_PER_CREATE
from tidelog.errors import (
    ConfigError,
    InvalidArgumentError,
    MetadataExistsError,
    MetadataLimitReachedError,
    MetadataNotFoundError,
    TopicLimitReachedError,
)
from tidelog.proto import controller_pb2 as pb


def test_each_topic_of_a_batch_is_created_or_refused_on_its_own() -> None:
    s = mastered()
    assert s.apply(CreateTopic("taken", {A: 2}, now_ms=1)).ok
    batch = CreateTopics(
        (
            CreateTopic("one", {A: 4}, now_ms=2),
            CreateTopic("taken", {A: 4}, now_ms=2),
            CreateTopic("bad/name", {A: 4}, now_ms=2),
            CreateTopic("two", {"no-such-set": 4}, now_ms=2),
            CreateTopic("three", {A: 1}, now_ms=2),
        )
    )
    r = s.apply(batch)
    assert r.ok and r.changed
    codes = [one.code for one in r.value]
    assert codes == ["OK", "TOPIC_EXISTS", "INVALID_ARGUMENT", "CONTROLLER_BROKER_METADATA_NOT_EXIST", "OK"]
    assert sorted(s.topics) == ["one", "taken", "three"]
    assert s.topics["taken"].queues == {A: 2}  # the refused one left the existing topic alone
    generations = [s.topics[n].generation for n in ("one", "three")]
    assert generations[0] < generations[1]  # in request order, as one by one would give


def test_a_batch_gives_the_same_state_as_its_topics_one_by_one() -> None:
    one_by_one, batched = mastered(), mastered()
    cmds = tuple(CreateTopic(f"t{i}", {A: 1 + i % 3}, now_ms=5) for i in range(20))
    for c in cmds:
        assert one_by_one.apply(c).ok
    assert batched.apply(CreateTopics(cmds)).ok
    assert batched == one_by_one


@pytest.mark.parametrize("count", [0, MAX_TOPICS_PER_CREATE + 1])
def test_an_empty_or_oversized_batch_is_refused_whole(count: int) -> None:
    cmds = tuple(CreateTopic(f"t{i}", {A: 1}, now_ms=1) for i in range(count))
    refused(mastered(), CreateTopics(cmds), "INVALID_ARGUMENT")


def test_a_batch_replays_from_the_journal() -> None:
    cmd = CreateTopics((CreateTopic("t", {A: 1}, now_ms=1),))
    again = pickle.loads(pickle.dumps(cmd))
    assert type(again).__module__ == "tidelog.controller.state" and again == cmd
    s = mastered()
    assert s.apply(again).ok
    assert ControllerState.from_dict(copy.deepcopy(s.to_dict())).topics.keys() == {"t"}


def test_create_topics_and_list_them_a_page_at_a_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (_node, client):
            await SimBroker(client, "broker-a", 0).register()
            names = ["orders-"] + [f"orders-{i:03d}" for i in range(24)] + ["refunds"]
            requests = [pb.CreateTopicRequest(name=n, queues={"broker-a": 2}) for n in names]
            requests.append(pb.CreateTopicRequest(name="orders-000", queues={"broker-a": 2}))
            results = await client.create_topics(requests)
            assert [r.name for r in results] == [*names, "orders-000"]
            assert all(not r.error_code and r.topic.name == r.name for r in results[:-1])
            assert results[-1].error_code == "TOPIC_EXISTS"
            assert await pages(client, prefix="orders-", limit=10) == [names[:10], names[10:20], names[20:25]]
            assert await pages(client, prefix="ref", limit=10) == [["refunds"]]
            assert await pages(client, prefix="orders-02", limit=0) == [names[21:25]]
            assert await pages(client, prefix="", limit=100) == [names]
            assert [t.name for t in await client.list_topics()] == names
            with pytest.raises(InvalidArgumentError):
                await client.create_topics([])
            with pytest.raises(InvalidArgumentError):
                await client.list_topics_page(limit=-1)

    asyncio.run(scenario())


async def pages(client: ControllerClient, *, prefix: str, limit: int) -> list[list[str]]:
    out, after = [], ""
    while True:
        page, after = await client.list_topics_page(prefix=prefix, start_after=after, limit=limit)
        out.append([t.name for t in page])
        if not after:
            return out


def test_creates_past_max_topics_are_refused_with_a_typed_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path, max_topics=5) as (_node, client):
            await SimBroker(client, "broker-a", 0).register()
            requests = [pb.CreateTopicRequest(name=f"t{i}", queues={"broker-a": 1}) for i in range(4)]
            assert not any(r.error_code for r in await client.create_topics(requests))
            with pytest.raises(TopicLimitReachedError, match="max_topics"):
                await client.create_topics(
                    [pb.CreateTopicRequest(name=f"u{i}", queues={"broker-a": 1}) for i in range(2)]
                )
            await client.create_topic("last", {"broker-a": 1})  # the fifth fits
            with pytest.raises(TopicLimitReachedError):
                await client.create_topic("one-too-many", {"broker-a": 1})
            assert len(await client.list_topics()) == 5

    asyncio.run(scenario())


def test_metadata_creates_past_max_metadata_entries_are_refused_with_a_typed_error(tmp_path: Path) -> None:
    """Ledgers (and group assignments) are metadata entries: the controllers hold at most
    `max_metadata_entries` of them, and a create past it is refused, not stored."""

    async def scenario() -> None:
        async with single_node(tmp_path, max_metadata_entries=3) as (_node, client):
            for i in range(3):
                await client.meta_create(f"k/{i}", b"v")
            with pytest.raises(MetadataLimitReachedError, match="max_metadata_entries is 3"):
                await client.meta_create("k/3", b"v")
            with pytest.raises(MetadataNotFoundError):
                await client.meta_get("k/3")
            with pytest.raises(MetadataExistsError):  # what racing creators wait for, limit or not
                await client.meta_create("k/1", b"v")
            await client.meta_delete("k/0")
            await client.meta_create("k/3", b"v")  # room again

    asyncio.run(scenario())


def test_the_metadata_limit_is_a_positive_controller_setting() -> None:
    base = {"data_dir": "/tmp/x", "nodes": [{"id": "c1", "raft": "127.0.0.1:1", "grpc": "127.0.0.1:2"}]}
    assert parse(base).max_metadata_entries == 2_000_000
    with pytest.raises(ConfigError, match="max_metadata_entries"):
        parse({**base, "max_metadata_entries": 0})
