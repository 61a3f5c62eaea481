"""A pull reply whose next offset is not its start plus its count is refused (client/aio.py
`reply_records`), never followed: a reader that moved to it would skip messages it never got.

With fake replies: the consumer's and reader's pull (`AsyncClient.pull`) and the Spark source's
range read (spark/fetch.py `RangeReader`) raise CorruptRecordError for such a reply, and take
the same range from another replica when one answers correctly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from crc32c import crc32c

from tidelog import dataport_frames as df
from tidelog.client.aio import AsyncClient, OutMessage, reply_records
from tidelog.client.routing import BrokerSetRoute, Replica
from tidelog.commitlog.batch import encode_batch
from tidelog.errors import CorruptRecordError
from tidelog.spark.fetch import RangeReader

GOOD, SKIPS = "good:1", "skips:1"


def _stored(first: int, n: int) -> bytes:
    """`n` records as a broker stores them, with queue offsets from `first` (the offset is the
    one field of the stored header the readers here look at)."""
    data = bytearray(encode_batch(b"t", 0, [OutMessage(b"m%d" % i) for i in range(n)], 1))
    pos = 0
    for i in range(n):
        size = int.from_bytes(data[pos : pos + 4], "big")
        data[pos + 24 : pos + 32] = (first + i).to_bytes(8, "big")  # queue offset
        pos += size
    return bytes(data)


def _reply(offset: int, count: int, next_offset: int) -> df.Pulled:
    data = _stored(offset, count)
    return df.Pulled(next_offset, df.Offsets(0, 100, 100), count, data, crc32c(data))


def test_a_reply_must_move_the_offset_by_its_count() -> None:
    assert reply_records(_reply(10, 3, 13), "b", 10)
    assert reply_records(_reply(10, 0, 10), "b", 10) == b""
    for count, nxt in ((3, 20), (0, 12), (3, 10)):
        with pytest.raises(CorruptRecordError, match="next offset"):
            reply_records(_reply(10, count, nxt), "b", 10)


def _client(answers: dict[str, df.Pulled], asked: list[str]) -> AsyncClient:
    client = AsyncClient("127.0.0.1:1", rpc_timeout=1.0)

    async def pull_records(address: str, call: df.PullCall, timeout: float) -> Any:
        asked.append(address)
        return answers[address]

    client.pull_records = pull_records  # type: ignore[method-assign]
    return client


def test_the_consumers_pull_refuses_a_skipping_reply_and_asks_another_replica() -> None:
    route = BrokerSetRoute("bs", 1, "", 0, (Replica(1, SKIPS, False), Replica(2, GOOD, False)))

    async def main() -> None:
        asked: list[str] = []
        client = _client({SKIPS: _reply(5, 2, 9), GOOD: _reply(5, 2, 7)}, asked)
        msgs, nxt = await client.pull(route, "t", 0, 5, max_messages=10, wait_ms=0)
        assert (len(msgs), nxt, asked) == (2, 7, [SKIPS, GOOD])
        alone = BrokerSetRoute("bs", 1, "", 0, (Replica(1, SKIPS, False),))
        with pytest.raises(CorruptRecordError, match="next offset 9"):
            await client.pull(alone, "t", 0, 5, max_messages=10, wait_ms=0)
        await client.close()

    asyncio.run(main())


def test_the_spark_range_read_refuses_a_skipping_reply_and_asks_another_replica() -> None:
    async def main() -> None:
        asked: list[str] = []
        client = _client({SKIPS: _reply(5, 2, 9), GOOD: _reply(5, 2, 7)}, asked)
        with pytest.raises(CorruptRecordError, match="next offset 9"):
            await RangeReader(client, "t", "bs", 0, 5, 7, [SKIPS])._pull(
                SKIPS, df.PullCall("t", 0, 5, 2, 0, 0)
            )
        reader = RangeReader(client, "t", "bs", 0, 5, 7, [SKIPS, GOOD], timeout=5.0)
        chunk = await reader.next_chunk()
        assert len(chunk) == 2 and reader.position == 7 and GOOD in asked
        await client.close()

    asyncio.run(main())
