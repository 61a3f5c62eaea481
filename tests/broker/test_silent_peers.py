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
from tests.brokers import BrokerSetProcs, pause, resume, status_of
from tests.procs import wait_until
from tidelog.client.aio import AsyncClient
from tidelog.client.routing import BrokerSetRoute
from tidelog.ledger import AsyncLedgers

pytestmark = pytest.mark.slow

AFTER_ELECTION_S = 4.0  # keepalive notices a silent peer within ~2 s; the rest is slack for a busy machine


class ElectionWatch:
    """Notes when the slave of a 2-replica set is elected after the master at `old` stops."""

    def __init__(self, bs: BrokerSetProcs, old: int) -> None:
        self.bs, self.old = bs, old
        self.epoch = bs.clients[old].status().master_epoch
        self.elected_at: list[float] = []
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        wait_until(
            lambda: (
                (s := status_of(self.bs, 1 - self.old)) is not None
                and s.role == "master"
                and s.master_epoch > self.epoch
            ),
            30,
            0.05,
            what="the slave to be elected",
        )
        self.elected_at.append(time.monotonic())

    def stop_master(self) -> None:
        pause(self.bs.procs[self.old])
        self._thread.start()

    async def join(self) -> None:
        await asyncio.to_thread(self._thread.join, 30)

    def assert_soon_after(self, done: float, what: str) -> None:
        assert self.elected_at, "the controller never elected the slave"
        late = done - self.elected_at[0]
        assert late <= AFTER_ELECTION_S, f"{what} completed {late:.1f}s after the new master was elected"


def test_a_send_moves_to_the_new_master_soon_after_the_election(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    old = bs.wait_master()
    watch = ElectionWatch(bs, old)

    async def main() -> float:
        async with AsyncClient(cluster.controllers, send_timeout=30.0, rpc_timeout=10.0) as client:
            producer = client.producer()
            await producer.send(TOPIC, b"before")
            watch.stop_master()
            receipt = await producer.send(TOPIC, b"during")
            done = time.monotonic()
            await watch.join()
            assert receipt.broker_set == "broker-a"
            return done

    try:
        done = asyncio.run(main())
    finally:
        resume(bs.procs[old])
    watch.assert_soon_after(done, "the send")


async def five_keyed_messages(client: AsyncClient) -> tuple[BrokerSetRoute, int]:
    """Send m0..m4 with one key; the broker set's route and the queue that holds them."""
    producer = client.producer()
    for i in range(5):
        await producer.send(TOPIC, b"m%d" % i, key="k")
    bs_route = (await client.route(TOPIC)).broker_sets[0]
    for q in range(bs_route.queues):
        if (await client.queue_offsets(bs_route, TOPIC, q)).confirmed >= 5:
            return bs_route, q
    raise AssertionError("no queue holds the five messages")


def test_a_read_falls_back_from_a_silent_slave(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()

    async def main() -> tuple[list[bytes], float]:
        async with AsyncClient(cluster.controllers, rpc_timeout=10.0) as client:
            bs_route, queue = await five_keyed_messages(client)
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


def test_a_ledger_add_moves_to_the_new_master_soon_after_the_election(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    old = bs.wait_master()
    watch = ElectionWatch(bs, old)

    async def main() -> tuple[float, list[bytes]]:
        async with AsyncClient(cluster.controllers, rpc_timeout=10.0) as client:
            ledgers = AsyncLedgers(client, add_timeout=30.0)
            w = await ledgers.create_ledger(2, 2, 1, b"pw")
            assert await w.add_entry(b"before") == 0
            watch.stop_master()
            assert await w.add_entry(b"during") == 1
            done = time.monotonic()
            await watch.join()
            tail = await ledgers.open_ledger(w.ledger_id, b"pw", recovery=False)
            return done, [e.data for e in await tail.read_entries(0, tail.last_add_confirmed)]

    try:
        done, read = asyncio.run(main())
    finally:
        resume(bs.procs[old])
    assert read[:2] == [b"before", b"during"]
    watch.assert_soon_after(done, "the ledger add")


def test_ledger_and_spark_reads_fall_back_from_a_silent_slave(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    from tidelog.spark.fetch import RangeReader

    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()

    async def main() -> tuple[list[bytes], list[bytes], float, float]:
        async with AsyncClient(cluster.controllers, rpc_timeout=10.0) as client:
            ledgers = AsyncLedgers(client)
            w = await ledgers.create_ledger(2, 2, 2, b"pw")
            for i in range(5):
                await w.add_entry(b"e%d" % i)
            bs_route, queue = await five_keyed_messages(client)
            tail = await ledgers.open_ledger(w.ledger_id, b"pw", recovery=False)
            pause(bs.procs[1 - master])
            t0 = time.monotonic()
            entries = [e.data for e in await tail.read_entries(0, 4)]
            ledger_took = time.monotonic() - t0
            # The Spark source's reader, given the slave first as its plan does.
            reader = RangeReader(
                client,
                TOPIC,
                bs_route.name,
                queue,
                0,
                5,
                [bs.clients[1 - master].address, bs.clients[master].address],
            )
            t0 = time.monotonic()
            rows: list[bytes] = []
            while chunk := await reader.next_chunk():
                rows.extend(m.body for m in chunk)
            return entries, rows, ledger_took, time.monotonic() - t0

    try:
        entries, rows, ledger_took, spark_took = asyncio.run(main())
    finally:
        resume(bs.procs[1 - master])
    assert entries == [b"e%d" % i for i in range(5)]
    assert rows == [b"m%d" % i for i in range(5)]
    assert ledger_took <= AFTER_ELECTION_S, f"the ledger read took {ledger_took:.1f}s with the slave stopped"
    assert spark_took <= AFTER_ELECTION_S, (
        f"the Spark range read took {spark_took:.1f}s with the slave stopped"
    )
