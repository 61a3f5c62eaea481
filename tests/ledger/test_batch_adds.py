"""Pipelined adds ride batches (one `AddBatch` call per batch, ledger/writer.py) against a real
local cluster (deploy/local.yaml: one broker set of two replicas): every acknowledged entry is
read back byte for byte in id order, far fewer calls than adds are made (over the data port, and
over gRPC for a client without it), and a recovery open in
the middle of a pipelined run fences the writer without losing or adding an acknowledged entry."""

from __future__ import annotations

import asyncio
import collections

import pytest

from tests.client.conftest import LocalCluster
from tidelog.client.aio import AsyncClient
from tidelog.ledger import (
    AsyncLedgers,
    AsyncWriteHandle,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
)

pytestmark = pytest.mark.slow

PASSWORD = b"batch"
WINDOW = 200  # adds in flight, as a pipelined writer keeps them


def payload(i: int) -> bytes:
    return (b"%06d|" % i) * (1 + i % 7)


async def pipeline(w: AsyncWriteHandle, count: int, acked: list[int]) -> None:
    """Add `count` entries keeping WINDOW in flight; the ids acknowledged go to `acked` in order."""
    in_flight: collections.deque[asyncio.Future[int]] = collections.deque()
    for i in range(count):
        if len(in_flight) >= WINDOW:
            acked.append(await in_flight.popleft())
        if w.is_closed:
            # fenced while this loop was awaiting an earlier add that had succeeded: the handle
            # refuses new adds (LedgerClosedError), and the adds in flight say why (LedgerFencedError)
            break
        in_flight.append(w.add_entry_async(payload(i)))
    while in_flight:
        acked.append(await in_flight.popleft())


@pytest.mark.parametrize("data_port", [True, False], ids=["data-port", "grpc"])
def test_pipelined_adds_are_batched_and_read_back_in_order(cluster: LocalCluster, data_port: bool) -> None:
    async def run() -> None:
        async with AsyncClient(cluster.controllers, data_port=data_port) as client:
            ledgers = AsyncLedgers(client)
            w = await ledgers.create_ledger(2, 2, 2, PASSWORD)
            acked: list[int] = []
            await pipeline(w, 2_000, acked)
            assert acked == list(range(2_000))
            assert w.last_add_confirmed == 1_999
            # far fewer calls than adds: the adds made while calls were in flight went together
            assert w.add_requests <= 2_000 // 10, w.add_requests
            # the batches went through the master's data port (tidelog/dataport_frames.py LEDGER_ADD),
            # or, for a client told not to use it, through gRPC
            assert bool(client.data._connections) == data_port
            tail = await ledgers.open_ledger(w.ledger_id, PASSWORD, recovery=False)
            assert tail.last_add_confirmed == 1_999
            entries = await tail.read_entries(0, 1_999)
            assert [e.entry_id for e in entries] == list(range(2_000))
            assert [e.data for e in entries] == [payload(i) for i in range(2_000)]
            assert entries[-1].length == w.length
            await w.close()

    asyncio.run(run())


def test_a_recovery_during_pipelined_batches_fences_the_writer_and_keeps_every_ack(
    cluster: LocalCluster,
) -> None:
    async def run() -> None:
        async with AsyncClient(cluster.controllers) as wc, AsyncClient(cluster.controllers) as rc:
            w = await AsyncLedgers(wc).create_ledger(2, 2, 2, PASSWORD)
            acked: list[int] = []
            writer = asyncio.ensure_future(pipeline(w, 1_000_000, acked))
            while len(acked) < 500:  # well into the run, with batches in flight
                assert not writer.done(), writer
                await asyncio.sleep(0.01)
            r = await AsyncLedgers(rc).open_ledger(w.ledger_id, PASSWORD, recovery=True)
            with pytest.raises(LedgerFencedError):
                await writer
            assert w.add_requests < len(acked)
            last = r.last_add_confirmed
            assert r.is_closed and acked == list(range(len(acked)))
            assert acked[-1] <= last, "every acknowledged entry is within the recovered ledger"
            entries = await r.read_entries(0, last)
            assert [e.data for e in entries] == [payload(i) for i in range(last + 1)]
            with pytest.raises(LedgerReadError):  # nothing is readable beyond the recovered end
                await r.read_entries(last + 1, last + 1)
            with pytest.raises(LedgerClosedError):
                await w.add_entry(b"after the fence")

    asyncio.run(run())


def test_adds_of_many_ledgers_share_frames_and_a_fence_stays_with_its_ledger(cluster: LocalCluster) -> None:
    """Writers of several ledgers on one broker set adding together send their batches in shared
    LEDGER_ADDS frames (ledger/coalesce.py); every acknowledged entry reads back; one ledger
    fenced by a recovery fails its own adds with LedgerFencedError while the other ledgers'
    adds, made in the same turns, are all confirmed."""

    async def run() -> None:
        async with AsyncClient(cluster.controllers) as wc, AsyncClient(cluster.controllers) as rc:
            ledgers = AsyncLedgers(wc)
            writers = [await ledgers.create_ledger(2, 2, 2, PASSWORD) for _ in range(6)]

            async def add_all(first: int, n: int) -> dict[int, list[object]]:
                futures = {
                    w.ledger_id: [w.add_entry_async(payload(i)) for i in range(first, first + n)]
                    for w in writers
                }
                return {lid: await asyncio.gather(*f, return_exceptions=True) for lid, f in futures.items()}

            for w, ids in zip(writers, (await add_all(0, 50)).values(), strict=True):
                assert ids == list(range(50)), (w.ledger_id, ids)
            assert ledgers.adds.frames > 0 and ledgers.adds.grouped >= 2 * ledgers.adds.frames
            victim = writers[0]
            recovered = await AsyncLedgers(rc).open_ledger(victim.ledger_id, PASSWORD, recovery=True)
            assert recovered.last_add_confirmed == 49
            frames = ledgers.adds.frames
            outcome = await add_all(50, 20)
            assert ledgers.adds.frames > frames
            assert all(isinstance(r, LedgerFencedError) for r in outcome[victim.ledger_id])
            for w in writers[1:]:
                assert outcome[w.ledger_id] == list(range(50, 70))
                tail = await ledgers.open_ledger(w.ledger_id, PASSWORD, recovery=False)
                entries = await tail.read_entries(0, 69)
                assert [e.data for e in entries] == [payload(i) for i in range(70)]
            assert [e.data for e in await recovered.read_entries(0, 49)] == [payload(i) for i in range(50)]

    asyncio.run(run())
