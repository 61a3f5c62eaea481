"""The ledger client API against a real local cluster (`tide cluster up`, deploy/local.yaml: one
broker set of two replicas): what a writer acknowledges is read back byte for byte, a closed
ledger's end is what every reader sees, and a recovery open seals an open ledger at or after
every acknowledged entry while the writer's next add fails with LedgerFencedError."""

from __future__ import annotations

import asyncio

import pytest

from tests.client.conftest import LocalCluster
from tidelog.client import Client
from tidelog.client.aio import AsyncClient
from tidelog.ledger import (
    AsyncLedgers,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
    Ledgers,
    LedgerState,
    NoSuchLedgerExistsError,
    UnauthorizedAccessError,
)

pytestmark = pytest.mark.slow

PASSWORD = b"smoke"


def payload(i: int) -> bytes:
    return (b"%06d:" % i) * (1 + i % 5)


def test_pipelined_adds_read_back_and_close(cluster: LocalCluster) -> None:
    async def run() -> None:
        async with AsyncClient(cluster.controllers) as client:
            ledgers = AsyncLedgers(client)
            w = await ledgers.create_ledger(2, 2, 2, PASSWORD, custom_metadata={"app": b"smoke"})
            futures = [w.add_entry_async(payload(i)) for i in range(100)]
            assert [f.done() for f in futures[:1]] == [False]  # sent, not yet confirmed
            assert await asyncio.gather(*futures) == list(range(100))
            assert w.last_add_confirmed == w.last_add_pushed == 99
            assert w.length == sum(len(payload(i)) for i in range(100))

            tail = await ledgers.open_ledger(w.ledger_id, PASSWORD, recovery=False)
            assert tail.last_add_confirmed == 99  # exact: no one-entry lag
            entries = await tail.read_entries(0, 99)
            assert [e.entry_id for e in entries] == list(range(100))
            assert [e.data for e in entries] == [payload(i) for i in range(100)]
            assert entries[-1].length == w.length
            with pytest.raises(LedgerReadError):
                await tail.read_entries(99, 100)

            await w.close()
            assert w.metadata.state is LedgerState.CLOSED and w.metadata.last_entry_id == 99
            with pytest.raises(LedgerClosedError):
                await w.add_entry(b"after close")

            sealed = await ledgers.open_ledger(w.ledger_id, PASSWORD, recovery=False)
            assert sealed.is_closed and sealed.last_add_confirmed == 99 and sealed.length == w.length
            assert (await ledgers.get_metadata(w.ledger_id)).custom() == {"app": b"smoke"}
            assert w.ledger_id in await ledgers.list_ledgers()

    asyncio.run(run())


def test_recovery_open_fences_the_writer_and_keeps_every_acked_entry(cluster: LocalCluster) -> None:
    with Client(cluster.controllers) as client:
        ledgers = Ledgers(client)
        w = ledgers.create_ledger(2, 2, 1, PASSWORD, digest="mac")
        acked = [w.add_entry(payload(i)) for i in range(20)]
        in_flight = [w.add_entry_async(payload(20 + i)) for i in range(5)]
        for f in in_flight:
            acked.append(f.result(timeout=30))

        with pytest.raises(UnauthorizedAccessError):
            ledgers.open_ledger(w.ledger_id, b"wrong password")
        assert ledgers.get_metadata(w.ledger_id).state is LedgerState.OPEN  # nothing fenced or written

        r = ledgers.open_ledger(w.ledger_id, PASSWORD)  # recovery=True is the default
        assert r.is_closed
        assert r.last_add_confirmed >= max(acked)
        entries = r.read_entries(0, r.last_add_confirmed)
        assert [e.data for e in entries] == [payload(i) for i in range(len(entries))]

        with pytest.raises(LedgerFencedError):
            w.add_entry(b"from the old writer")
        with pytest.raises(LedgerClosedError):
            w.add_entry(b"and again")
        # nothing beyond the acked entries was written, so the recovery sealed it exactly where
        # the writer would have: the writer's close is then a no-op (RULES.md T6)
        assert r.last_add_confirmed == max(acked) == 24
        w.close()
        assert w.metadata.last_entry_id == 24

        again = ledgers.open_ledger(w.ledger_id, PASSWORD)  # a CLOSED ledger: nothing to do
        assert again.last_add_confirmed == r.last_add_confirmed


def test_bad_input_is_refused_before_anything_is_sent(cluster: LocalCluster) -> None:
    with Client(cluster.controllers) as client:
        ledgers = Ledgers(client)
        before = ledgers.list_ledgers()
        for bad in [(2, 2, 3), (3, 3, 2), (2, 1, 1), (0, 0, 0)]:
            with pytest.raises(IncorrectParameterError):
                ledgers.create_ledger(*bad, PASSWORD)
        with pytest.raises(IncorrectParameterError):
            ledgers.create_ledger(2, 2, 2, PASSWORD, digest="sha1")
        assert ledgers.list_ledgers() == before
        with pytest.raises(NoSuchLedgerExistsError):
            ledgers.open_ledger(10**12, PASSWORD)
        w = ledgers.create_ledger(2, 2, 2, PASSWORD)
        for data in ["text", None, b"x" * (8 << 20)]:
            with pytest.raises(IncorrectParameterError):
                w.add_entry(data)
        assert w.last_add_pushed == -1
        w.add_entry(b"ok")
        r = ledgers.open_ledger(w.ledger_id, PASSWORD, recovery=False)
        for first, last in [(-1, 0), (1, 0)]:
            with pytest.raises(IncorrectParameterError):
                r.read_entries(first, last)
        ledgers.delete_ledger(w.ledger_id, PASSWORD)
        with pytest.raises(NoSuchLedgerExistsError):
            ledgers.open_ledger(w.ledger_id, PASSWORD)
