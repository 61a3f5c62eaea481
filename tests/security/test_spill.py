"""A data-port frame body over SPILL_BYTES waits in a spill file while it arrives
(broker/dataport.py): once whole it is served as any other, byte for byte, and the file is gone.

In process, on real sockets: the tidelog client sends batches to a data port whose replica is a
stand-in keeping one queue's records in memory, with SPILL_BYTES made small so that every
request spills."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.client.test_produce_split import InMemoryReplica, client_of
from tidelog.broker import dataport
from tidelog.broker.dataport import DataPort
from tidelog.client.aio import OutMessage


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
    replica = InMemoryReplica()
    bodies = [b"s%04d-" % i + bytes(range(256)) * 40 for i in range(50)]  # ~10 KiB each

    async def main() -> None:
        port = DataPort(replica, spill_dir=tmp_path)  # type: ignore[arg-type]
        await port.start("127.0.0.1", 0)
        client = await client_of(port, send_timeout=5.0)
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
