"""A data-port frame body over SPILL_BYTES waits in a spill file while it arrives
(broker/dataport.py): once whole it is served as any other, byte for byte, and the file is gone.

In process, on real sockets: the tidelog client sends batches to a data port whose replica is a
stand-in keeping one queue's records in memory, with SPILL_BYTES made small so that every
request spills."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog.broker import dataport
from tidelog.broker.dataport import DataPort
from tidelog.client.aio import AsyncClient, OutMessage
from tidelog.client.routing import BrokerSetRoute, Replica, TopicRoute
from tidelog.commitlog.batch import RecordView, walk

MASTER = "master:1"


class _Replica:
    """The part of a broker replica the data port calls for a produce: records kept in memory."""

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

    async def produce_encoded(
        self, topic: str, queue: int, records: bytearray, count: int
    ) -> tuple[int, list[int]]:
        got = [RecordView(bytes(records), p, "bs").body for p in walk(records, "produce", 0, False)]
        first = len(self.bodies)
        self.bodies += got
        return first, list(range(first, len(self.bodies)))


def test_spilled_bodies_arrive_whole_and_leave_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataport, "SPILL_BYTES", 1000)
    spilled: list[int] = []
    real = dataport._read_spilled

    async def counting(reader: asyncio.StreamReader, size: int, spill_dir: Path | None) -> bytes:
        spilled.append(size)
        return await real(reader, size, spill_dir)

    monkeypatch.setattr(dataport, "_read_spilled", counting)
    replica = _Replica()
    bodies = [b"s%04d-" % i + bytes(range(256)) * 40 for i in range(50)]  # ~10 KiB each

    async def main() -> None:
        port = DataPort(replica, spill_dir=tmp_path)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = AsyncClient("127.0.0.1:1", send_timeout=5.0, rpc_timeout=5.0)
        route = TopicRoute.build("t", [BrokerSetRoute("bs", 1, MASTER, 1, (Replica(1, MASTER, True),))])

        async def fixed_route(topic: str, *, refresh: bool = False, need: str | None = None) -> Any:
            return route

        client.route = fixed_route  # type: ignore[method-assign]
        client.data._where[MASTER] = (port.address, time.monotonic())
        try:
            producer = client.producer()
            receipts = await producer.send_batch("t", [OutMessage(b, key="k") for b in bodies[:25]])
            receipts += await producer.send_batch("t", [OutMessage(b, key="k") for b in bodies[25:]])
            assert [r.queue_offset for r in receipts] == list(range(len(bodies)))
        finally:
            await client.close()
            await port.close()

    asyncio.run(main())
    assert replica.bodies == bodies
    assert len(spilled) >= 2 and min(spilled) > 1000  # both requests went through a spill file
    assert list(tmp_path.iterdir()) == []  # unlinked from the start
