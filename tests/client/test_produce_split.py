"""A produce larger than one request carries is cut into several (client/aio.py `_produce`).

In process, on real sockets: the client talks to a broker's data port (broker/dataport.py) whose
replica is a stand-in keeping one queue's records in memory, with a frame limit (MAX_FRAME) made
small on both ends. A send_batch several frames long:
- succeeds, every message stored once and in order, each request within one frame;
- leaves the shared connection alone: a long poll in flight on it is answered, not failed;
- sent again after a request of it failed with a retryable error, stores nothing twice;
- with one message that alone exceeds a frame, fails with MessageTooLargeError and sends
  nothing, while `send` of the same messages fails only that one;
- sent by concurrent `send` calls, with one message the broker refuses in a later request of the
  batch, fails only that message and stores every other one once, in order.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog import dataport_frames as df
from tidelog.broker.dataport import DataPort
from tidelog.client.aio import AsyncClient, OutMessage
from tidelog.client.routing import BrokerSetRoute, Replica, TopicRoute
from tidelog.commitlog import QueueOffsets
from tidelog.commitlog.batch import RecordView, walk
from tidelog.errors import InSyncReplicasNotEnoughError, MessageTooLargeError

FRAME = 20_000
MASTER = "master:1"  # the gRPC address the route names; its data port is the in-process one


class InMemoryReplica:
    """The part of a broker replica the data port calls: one queue's records, in memory."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(
            broker_set="bs",
            data_max_connections=8,
            data_partial_frame_bytes=64 << 20,
            max_message_bytes=1 << 20,
            max_pull_bytes=1 << 20,
            max_pull_messages=1000,
        )
        self.ctx = "[test]"
        self.observe_traffic = None
        self.bodies: list[bytes] = []
        self.requests: list[int] = []  # the record bytes of each produce
        self.fail_request: int | None = None  # this produce (by number) fails once, storing nothing

    async def produce_encoded(
        self, topic: str, queue: int, records: bytearray, count: int
    ) -> tuple[int, list[int]]:
        self.requests.append(len(records))
        if len(self.requests) == self.fail_request:
            self.fail_request = None
            raise InSyncReplicasNotEnoughError("not now")
        got = [RecordView(bytes(records), p, "bs").body for p in walk(records, "produce", 0, False)]
        if any(b.startswith(b"BAD") for b in got):  # as the broker's max_message_bytes would
            raise MessageTooLargeError("a record of the batch is too large")
        first = len(self.bodies)
        self.bodies += got
        return first, list(range(first, len(self.bodies)))

    async def pull_encoded(self, *args: Any) -> tuple[bytes, int, QueueOffsets]:
        await asyncio.sleep(args[-1] / 1000)  # a long poll that finds nothing
        return b"", 0, QueueOffsets(0, 0, 0)


async def client_of(port: DataPort, send_timeout: float = 3.0) -> AsyncClient:
    """A client whose route names MASTER, whose data port is `port` (in this process)."""
    client = AsyncClient("127.0.0.1:1", send_timeout=send_timeout, rpc_timeout=2.0)
    route = TopicRoute.build("t", [BrokerSetRoute("bs", 1, MASTER, 1, (Replica(1, MASTER, True),))])

    async def fixed_route(topic: str, *, refresh: bool = False, need: str | None = None) -> TopicRoute:
        return route

    client.route = fixed_route  # type: ignore[method-assign]
    client.data._where[MASTER] = (port.address, time.monotonic())
    return client


@pytest.fixture
def small_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(df, "MAX_FRAME", FRAME)


def test_a_batch_over_one_frame_goes_as_several_requests_in_order(small_frames: None) -> None:
    replica = InMemoryReplica()
    bodies = [b"m%04d-" % i + b"x" * 900 for i in range(100)]  # about 100 KB: 6 frames or more

    async def main() -> None:
        port = DataPort(replica)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = await client_of(port)
        try:
            conn = await client.data.connection(MASTER)
            assert conn is not None
            poll = asyncio.ensure_future(
                client.pull_records(MASTER, df.PullCall("t", 0, 0, 10, 0, 1000), timeout=5.0)
            )
            await asyncio.sleep(0.1)
            receipts = await client.producer().send_batch("t", [OutMessage(b, key="k") for b in bodies])
            assert (await poll).count == 0  # the long poll on the same connection was answered
            assert not conn.closed and await client.data.connection(MASTER) is conn
            assert [r.queue_offset for r in receipts] == list(range(len(bodies)))
        finally:
            await client.close()
            await port.close()

    asyncio.run(main())
    assert replica.bodies == bodies
    assert len(replica.requests) > 1 and max(replica.requests) <= df.produce_room("t") <= FRAME


def test_a_retried_batch_sends_only_what_was_not_stored(small_frames: None) -> None:
    replica = InMemoryReplica()
    replica.fail_request = 3  # the first two requests are stored, the third fails once
    bodies = [b"r%04d-" % i + b"y" * 900 for i in range(100)]

    async def main() -> None:
        port = DataPort(replica)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = await client_of(port)
        try:
            receipts = await client.producer().send_batch("t", [OutMessage(b, key="k") for b in bodies])
            assert [r.queue_offset for r in receipts] == list(range(len(bodies)))
        finally:
            await client.close()
            await port.close()

    asyncio.run(main())
    assert replica.bodies == bodies  # nothing twice, nothing out of order


def test_a_message_over_one_frame_fails_alone(small_frames: None) -> None:
    replica = InMemoryReplica()
    big = b"B" * (FRAME + 1)

    async def main() -> None:
        port = DataPort(replica)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = await client_of(port)
        try:
            producer = client.producer()
            with pytest.raises(MessageTooLargeError):
                await producer.send_batch("t", [OutMessage(b"a", key="k"), OutMessage(big, key="k")])
            assert replica.requests == []  # nothing of that batch was sent
            sends = [producer.send("t", b, key="k") for b in (b"a", big, b"c")]
            results = await asyncio.gather(*sends, return_exceptions=True)
            assert isinstance(results[1], MessageTooLargeError)
            assert [r.queue_offset for r in (results[0], results[2])] == [0, 1]  # type: ignore[union-attr]
        finally:
            await client.close()
            await port.close()

    asyncio.run(main())
    assert replica.bodies == [b"a", b"c"]


def test_a_message_the_broker_refuses_in_a_later_request_fails_alone(small_frames: None) -> None:
    replica = InMemoryReplica()
    bodies = [(b"BAD" if i == 70 else b"ok") + b"%04d-" % i + b"z" * 900 for i in range(100)]

    async def main() -> list[Any]:
        port = DataPort(replica)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = await client_of(port)
        try:
            producer = client.producer(batch_max_bytes=1 << 20)
            return await asyncio.gather(
                *(producer.send("t", b, key="k") for b in bodies), return_exceptions=True
            )
        finally:
            await client.close()
            await port.close()

    results = asyncio.run(main())
    assert isinstance(results[70], MessageTooLargeError)
    assert replica.bodies == bodies[:70] + bodies[71:]  # the others once each, in order
    assert [r.queue_offset for r in results[:70] + results[71:]] == list(range(99))
