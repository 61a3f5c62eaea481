"""Concurrent sends are batched per queue, each caller keeps its own receipt or error, keyed order holds.

Against a real local cluster (`tide cluster up`, real processes): 2,000 concurrent asyncio sends
and sends from 8 threads on the sync client; every receipt's message reads back byte for byte at
its (queue, offset); per-key order is the order of the sends; far fewer Produce requests than
sends; an oversize message fails alone while its batch-mates succeed.
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.client.conftest import LocalCluster
from tidelog.client import AsyncClient, Client
from tidelog.errors import MessageTooLargeError

pytestmark = pytest.mark.slow


def _read_back(client: Client, topic: str, queues: int) -> dict[tuple[int, int], tuple[bytes, str | None]]:
    out = {}
    for q in range(queues):
        reader = client.reader(topic, q, 0)
        while True:
            batch = reader.read(max_messages=1000, timeout=0.2)
            if not batch:
                break
            for m in batch:
                out[(m.queue, m.offset)] = (m.body, m.key)
    return out


def test_concurrent_asyncio_sends_share_requests(cluster: LocalCluster) -> None:
    async def main() -> tuple[list, int]:
        async with AsyncClient(cluster.controllers) as client:
            await client.admin().create_topic("batched", queues=4)
            producer = client.producer()
            sends = [(f"k{i % 10}", b"body-%05d-" % i + b"z" * 200) for i in range(2000)]
            receipts = await asyncio.gather(*(producer.send("batched", body, key=key) for key, body in sends))
            return list(zip(sends, receipts, strict=True)), producer.requests

    pairs, requests = asyncio.run(main())
    assert requests < len(pairs) / 5, f"{requests} Produce requests for {len(pairs)} sends"
    with Client(cluster.controllers) as client:
        stored = _read_back(client, "batched", 4)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for (key, body), r in pairs:
        assert stored[(r.queue, r.queue_offset)] == (body, key)
        by_key[key].append(r.queue_offset)
    for key, offsets in by_key.items():  # the order of the sends is the order in the log
        assert offsets == sorted(offsets), key


def test_threads_on_the_sync_client_and_an_oversize_message(cluster: LocalCluster) -> None:
    with Client(cluster.controllers) as client:
        client.admin().create_topic("threaded", queues=2)
        producer = client.producer()

        def work(t: int) -> list[tuple[bytes, object]]:
            out = []
            for i in range(100):
                body = b"t%d-%03d" % (t, i)
                out.append((body, producer.send("threaded", body)))
            return out

        with ThreadPoolExecutor(8) as pool:
            results = [x for chunk in pool.map(work, range(8)) for x in chunk]
        stored = _read_back(client, "threaded", 2)
        for body, receipt in results:
            assert stored[(receipt.queue, receipt.queue_offset)][0] == body
        # an oversize message among ordinary ones: it fails alone
        futures = [producer.send_async("threaded", b"small-%d" % i) for i in range(20)]
        huge = producer.send_async("threaded", b"x" * (5 << 20))
        futures += [producer.send_async("threaded", b"small-%d" % i) for i in range(20, 40)]
        with pytest.raises(MessageTooLargeError):
            huge.result(timeout=30)
        receipts = [f.result(timeout=30) for f in futures]
        stored = _read_back(client, "threaded", 2)
        assert sorted(stored[(r.queue, r.queue_offset)][0] for r in receipts) == sorted(
            b"small-%d" % i for i in range(40)
        )
        producer.flush()
