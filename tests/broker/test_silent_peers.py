"""Clients that survive a silent peer: a SIGSTOPped master or slave answers nothing, not a reset.

A killed broker refuses connections and the client moves on at once; a stopped one (like a
datacenter cut off by the network) keeps its sockets open and simply never answers. The client
must notice (gRPC keepalive, per-attempt deadlines a fraction of the budget) and ask the
controllers again instead of spending its whole budget on one call.

Bounded waits for liveness, not speed: with a 30 s send budget and a 10 s RPC timeout, the
first send after the master stops must complete within a few seconds of the controller electing
its successor (before: one full RPC timeout, 10 s); a read from a stopped slave must fall back to
the master within a few seconds (before: 10 s).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import TOPIC, BrokerCluster
from tests.brokers import pause, resume, status_of
from tests.procs import wait_until
from tidelog.client.aio import AsyncClient

pytestmark = pytest.mark.slow

AFTER_ELECTION_S = 4.0  # keepalive notices a silent peer within ~2 s; the rest is slack for a busy machine


def test_a_send_moves_to_the_new_master_soon_after_the_election(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    old = bs.wait_master()
    epoch = bs.clients[old].status().master_epoch
    elected_at: list[float] = []

    def watch() -> None:
        wait_until(lambda: (s := status_of(bs, 1 - old)) is not None and s.role == "master"
                   and s.master_epoch > epoch, 30, 0.05, what="the slave to be elected")
        elected_at.append(time.monotonic())

    async def main() -> float:
        async with AsyncClient(cluster.controllers, send_timeout=30.0, rpc_timeout=10.0) as client:
            producer = client.producer()
            await producer.send(TOPIC, b"before")
            pause(bs.procs[old])
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            receipt = await producer.send(TOPIC, b"during")
            done = time.monotonic()
            await asyncio.to_thread(watcher.join, 30)
            assert receipt.broker_set == "broker-a"
            return done

    try:
        done = asyncio.run(main())
    finally:
        resume(bs.procs[old])
    assert elected_at, "the controller never elected the slave"
    late = done - elected_at[0]
    assert late <= AFTER_ELECTION_S, f"the send completed {late:.1f}s after the new master was elected"


def test_a_read_falls_back_from_a_silent_slave(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()

    async def main() -> tuple[list[bytes], float]:
        async with AsyncClient(cluster.controllers, rpc_timeout=10.0) as client:
            producer = client.producer()
            for i in range(5):
                await producer.send(TOPIC, b"m%d" % i, key="k")
            route = await client.route(TOPIC)
            bs_route = route.broker_sets[0]
            queue = -1
            for q in range(bs_route.queues):
                if (await client.queue_offsets(bs_route, TOPIC, q)).confirmed >= 5:
                    queue = q
            pause(bs.procs[1 - master])
            t0 = time.monotonic()
            reader = client.reader(TOPIC, queue, 0)
            got = await reader.read(max_messages=10, timeout=0.1)
            return [m.body for m in got], time.monotonic() - t0

    try:
        bodies, took = asyncio.run(main())
    finally:
        resume(bs.procs[1 - master])
    assert bodies == [b"m%d" % i for i in range(5)]
    assert took <= AFTER_ELECTION_S, f"the read took {took:.1f}s with the slave stopped"
