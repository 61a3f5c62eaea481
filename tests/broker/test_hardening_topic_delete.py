"""Deleting a topic deletes its data, over real processes: after `delete` and `create` of the same
name, no replica shows an old message of it, also after both brokers restart and after a
failover; the deleted topic's consume-queue files go at once; a group's old commit does not carry
over to the new topic."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker.conftest import SET, BrokerCluster
from tests.brokers import BrokerClient, BrokerSetProcs, wait_topic
from tests.procs import wait_until
from tidelog.client.controllers import ControllerClient
from tidelog.errors import OffsetBelowRetentionError, TopicDeletionPendingError, TopicNotFoundError

pytestmark = pytest.mark.slow

TOPIC = "ret"
QUEUES = 2


def _admin(controllers: str, action: str) -> None:
    async def run() -> None:
        async with ControllerClient(controllers, rpc_timeout=2.0, total_timeout=5.0) as c:
            if action == "create":
                await c.create_topic(TOPIC, {SET: QUEUES})
            else:
                await c.delete_topic(TOPIC)

    asyncio.run(run())


def _recreate(controllers: str) -> float:
    """Create the topic again as soon as the controller allows it; returns how long that took."""
    t0 = time.monotonic()
    while True:
        try:
            _admin(controllers, "create")
            return time.monotonic() - t0
        except TopicDeletionPendingError:
            assert time.monotonic() - t0 < 20, "the deleted name stayed blocked"
            time.sleep(0.2)


def _bodies(client: BrokerClient, queue: int) -> list[bytes]:
    """Every message of the queue this replica serves, from its first readable offset."""
    start = client.offsets(TOPIC, queue).min
    return [m.body for m in client.pull_all(TOPIC, queue, start)]


def _units(data_dir: Path) -> int:
    """Bytes of consume-queue units of the topic in a replica's data directory."""
    qdir = data_dir / "consumequeue" / TOPIC
    return sum(f.stat().st_size for f in qdir.rglob("*") if f.is_file()) if qdir.exists() else 0


def _all_see(bs: BrokerSetProcs, expected: dict[int, list[bytes]], what: str) -> None:
    live = [i for i, p in enumerate(bs.procs) if p.alive()]

    def seen() -> bool:
        for i in live:
            for q, bodies in expected.items():
                got = _bodies(bs.clients[i], q)
                assert not any(b.startswith(b"old-") for b in got), (
                    f"replica {i} shows old messages of {q}: {got}"
                )
                if got != bodies:
                    return False
        return True

    wait_until(seen, 20, what=what)


def test_delete_and_recreate_shows_no_old_message_on_any_replica(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    c = broker_cluster(2)
    bs = c.bs
    _admin(c.controllers, "create")
    wait_topic(bs, TOPIC)
    m = bs.wait_in_sync(2)
    s = 1 - m
    for i in range(10):
        bs.clients[m].produce(TOPIC, [b"old-%d" % i], queue=i % QUEUES)
    bs.clients[m].commit("g", TOPIC, 0, 3)
    wait_until(
        lambda: all(len(_bodies(bs.clients[i], q)) == 5 for i in (m, s) for q in range(QUEUES)),
        10,
        what="the old messages on both replicas",
    )
    ends = {q: bs.clients[m].offsets(TOPIC, q).max for q in range(QUEUES)}

    _admin(c.controllers, "delete")
    for i in (m, s):
        wait_until(lambda i=i: _refused(bs.clients[i]), 10, what=f"replica {i} to learn of the deletion")
    # the deleted topic's consume-queue units go at once, on the master and on the slave
    wait_until(
        lambda: _units(bs.data_dirs[m]) == 0 and _units(bs.data_dirs[s]) == 0,
        10,
        what="the deleted topic's consume-queue files to go",
    )

    took = _recreate(c.controllers)
    assert took < 15
    wait_topic(bs, TOPIC)
    expected: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    _all_see(bs, expected, "an empty new topic on both replicas")
    for q in range(QUEUES):
        offsets = bs.clients[m].offsets(TOPIC, q)
        assert offsets.min == offsets.max == ends[q], "the new topic starts where the old one ended"
        with pytest.raises(OffsetBelowRetentionError):
            bs.clients[m].pull(TOPIC, q, 0)
    assert bs.clients[m].fetch("g", TOPIC, 0) is None, "an old commit does not carry over to the new topic"
    for i in range(6):
        bs.clients[m].produce(TOPIC, [b"new-%d" % i], queue=i % QUEUES)
        expected[i % QUEUES].append(b"new-%d" % i)
    _all_see(bs, expected, "the new messages, and only them, on both replicas")

    # both brokers restart: nothing old comes back
    for p in bs.procs:
        p.stop()
    for p in bs.procs:
        p.start()
    m = bs.wait_master(timeout=30)
    bs.wait_in_sync(2, timeout=30)
    wait_topic(bs, TOPIC, timeout=20)
    _all_see(bs, expected, "only the new messages after a restart of both brokers")
    assert bs.clients[m].fetch("g", TOPIC, 0) is None

    # failover: the slave takes over and shows the same
    bs.procs[m].kill9()
    new = bs.wait_master(timeout=30, exclude=m)
    wait_topic(bs, TOPIC, [new], timeout=20)
    _all_see(bs, expected, "only the new messages on the new master")
    bs.clients[new].produce(TOPIC, [b"after-failover"], queue=0)
    expected[0].append(b"after-failover")
    bs.procs[m].start()
    bs.wait_in_sync(2, timeout=30)
    wait_topic(bs, TOPIC, timeout=20)
    _all_see(bs, expected, "only the new messages on both replicas after the old master rejoined")


def _refused(client: BrokerClient) -> bool:
    try:
        client.offsets(TOPIC, 0)
    except TopicNotFoundError:
        return True
    return False
