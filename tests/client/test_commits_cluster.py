"""Group commits end to end on a real `tide cluster up` cluster (two replicas, sync replication):
the group members of one client commit at once through its commit pace (client/commitpace.py) as
COMMITS frames through the master's data port. Proven here: every group's stored offset is the
position its member reached; the master counted a few commit calls, not one per group; and a
commit the master refuses (an offset past a queue's end) fails only its own member, the others'
commits of the same moment stored."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, tide
from tests.client.test_metrics_cluster import scrape
from tidelog.client.aio import AsyncClient, AsyncConsumer
from tidelog.errors import InvalidArgumentError
from tidelog.proto import broker_pb2 as pb

pytestmark = pytest.mark.slow

TOPIC = "commits-e2e"
GROUPS = 12
MESSAGES = 40


def _master_metrics(cluster: LocalCluster, address: str) -> str:
    return next(p["metrics"] for p in cluster.state()["processes"] if p.get("address") == address)


async def _stored(client: AsyncClient, master: str, group: str, queue: int) -> int | None:
    reply = await client.call_broker(
        master, "FetchOffset", pb.FetchOffsetRequest(group=group, topic=TOPIC, queue=queue)
    )
    return reply.offset if reply.found else None


async def _read_all(consumer: AsyncConsumer) -> int:
    got = 0
    for _ in range(60):
        got += len(await consumer.poll(max_messages=100, timeout=0.5))
        if got >= MESSAGES:
            break
    return got


async def _scenario(cluster: LocalCluster) -> dict[str, Any]:
    async with AsyncClient(cluster.controllers) as client:
        producer = client.producer()
        await asyncio.gather(*(producer.send(TOPIC, f"m{i}".encode()) for i in range(MESSAGES)))
        consumers = [client.consumer(f"group-{i}", TOPIC) for i in range(GROUPS)]
        read = await asyncio.gather(*(_read_all(c) for c in consumers))
        route = await client.route(TOPIC)
        master = route.broker_set("broker-a").master_address
        metrics = _master_metrics(cluster, master)
        before = scrape(metrics, "tidelog_rpc_duration_seconds_count", method="CommitOffsets") or 0
        frames_before = client.commits.frames
        await asyncio.gather(*(c.commit() for c in consumers))
        calls = (scrape(metrics, "tidelog_rpc_duration_seconds_count", method="CommitOffsets") or 0) - before
        positions = [dict(c.positions) for c in consumers]
        stored = [
            {q: await _stored(client, master, f"group-{i}", q[1]) for q in positions[i]}
            for i in range(GROUPS)
        ]
        # at one moment: three groups' commits, one of them past the end of queue 0
        end = (
            await client.call_broker(master, "GetOffsets", pb.GetOffsetsRequest(topic=TOPIC, queue=0))
        ).offsets.max
        offsets = {"late-a": end, "late-b": 10**9, "late-c": 0}
        answers = await asyncio.gather(
            *(client.commits.commit(master, [(g, TOPIC, 0, o)]) for g, o in offsets.items()),
            return_exceptions=True,
        )
        late = {g: await _stored(client, master, g, 0) for g in offsets}
        frames = client.commits.frames - frames_before
        for c in consumers:
            await c.close()
    return dict(
        read=read,
        calls=calls,
        frames=frames,
        positions=positions,
        stored=stored,
        answers=answers,
        late=late,
        end=end,
    )


def test_many_groups_of_one_client_commit_in_few_calls_through_the_data_port(cluster: LocalCluster) -> None:
    assert (
        tide("topic", "create", TOPIC, "--queues", "2", "--controllers", cluster.controllers).returncode == 0
    )
    out = asyncio.run(_scenario(cluster))
    assert out["read"] == [MESSAGES] * GROUPS
    for positions, stored in zip(out["positions"], out["stored"], strict=True):
        assert sum(positions.values()) == MESSAGES
        assert stored == positions  # every group's offsets, as its member reached them
    # one call found the master idle, the rest waited for it and went together: not one per group
    assert 1 <= out["calls"] <= 3, out["calls"]
    assert out["frames"] >= 2  # the commits and the late ones went as COMMITS frames
    a, b, c = out["answers"]
    assert a is None and c is None
    assert isinstance(b, InvalidArgumentError) and "beyond the end" in str(b)
    assert out["late"] == {"late-a": out["end"], "late-b": None, "late-c": 0}
