"""Heartbeats carry a broker set's topic lists only when they changed (controller/service.py): with
many topics, rebuilding and sending every list on every heartbeat was most of an idle
controller's CPU (bench.scale)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.controller.inproc import single_node
from tests.controller.simbroker import SimBroker
from tidelog.controller import topics
from tidelog.controller.state import HANDLERS


def test_every_command_handled_by_the_topics_module_moves_the_topic_views() -> None:
    handled_there = {cmd for cmd, handler in HANDLERS.items() if handler.__module__ == topics.__name__}
    assert handled_there and handled_there == set(topics.TOPIC_COMMANDS)


def test_a_heartbeat_carries_the_topics_once_and_again_after_each_change(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (_node, client):
            broker = SimBroker(client, "broker-a", 0)
            await broker.register()
            await client.create_topic("orders", {"broker-a": 4})
            first = await client.heartbeat("broker-a", broker.broker_id or 0, epoch=-1, max_offset=0)
            assert not first.topics_unchanged and [t.name for t in first.topics] == ["orders"]
            again = await client.heartbeat(
                "broker-a", broker.broker_id or 0, epoch=-1, max_offset=0, topics_version=first.topics_version
            )
            assert (
                again.topics_unchanged and not again.topics and again.topics_version == first.topics_version
            )
            await client.create_topic("refunds", {"broker-a": 2})
            after = await client.heartbeat(
                "broker-a", broker.broker_id or 0, epoch=-1, max_offset=0, topics_version=first.topics_version
            )
            assert not after.topics_unchanged and after.topics_version != first.topics_version
            assert sorted(t.name for t in after.topics) == ["orders", "refunds"]
            await client.delete_topic("orders")
            deleted = await client.heartbeat(
                "broker-a", broker.broker_id or 0, epoch=-1, max_offset=0, topics_version=after.topics_version
            )
            assert [t.name for t in deleted.topics] == ["refunds"]
            assert [t.name for t in deleted.deleted_topics] == ["orders"]
            # a broker that has adopted nothing yet (or an older broker) always gets the lists
            fresh = await client.heartbeat("broker-a", broker.broker_id or 0, epoch=-1, max_offset=0)
            assert [t.name for t in fresh.topics] == ["refunds"]

    asyncio.run(scenario())
