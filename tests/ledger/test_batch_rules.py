"""How the writer gathers adds into batches (ledger/writer.py), without a cluster: `take_batch`
as a pure rule, and the handle against the unit tests' fake broker set (one AddBatch per batch)."""

from __future__ import annotations

import asyncio
import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.ledger.test_client_unit import PW, make, run
from tidelog.errors import UnauthorizedAccessError
from tidelog.ledger import LedgerClosedError
from tidelog.ledger import writer as writer_module
from tidelog.ledger.writer import MAX_BATCH_ENTRIES, MAX_IN_FLIGHT_BATCHES, MIN_SPLIT, batch_size, take_batch
from tidelog.proto import ledger_pb2 as lpb


def _add(entry_id: int, size: int) -> writer_module._PendingAdd:  # noqa: SLF001 - the queue's item type
    return writer_module._PendingAdd(  # noqa: SLF001
        entry_id, lpb.Entry(entry_id=entry_id, data=b"x" * size), asyncio.Future(loop=None)
    )


@given(
    sizes=st.lists(st.integers(0, 50), max_size=40),
    dead=st.sets(st.integers(0, 39)),
    max_entries=st.integers(1, 10),
    max_bytes=st.integers(1, 120),
)
def test_take_batch_takes_live_adds_in_order_within_the_caps(
    sizes: list[int], dead: set[int], max_entries: int, max_bytes: int
) -> None:
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        queue = collections.deque(_add(i, s) for i, s in enumerate(sizes))
        live = {i: None for i in range(len(sizes)) if i not in dead}
        taken: list[int] = []
        while queue:
            batch = take_batch(queue, live, max_entries, max_bytes)
            ids = [a.entry_id for a in batch]
            assert all(i in live for i in ids)
            assert ids == sorted(ids) and len(ids) <= max_entries
            if len(batch) > 1:  # a single add larger than the cap still goes, alone
                assert sum(len(a.entry.data) for a in batch) <= max_bytes
            if queue:
                assert batch, "an add is left behind although live ones were queued"
            taken += ids
        assert taken == sorted(live), "every live add goes once, in id order; failed ones never"
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@given(queued=st.integers(1, 5_000), free=st.integers(1, MAX_IN_FLIGHT_BATCHES))
def test_batch_size_shares_a_long_queue_over_the_free_slots(queued: int, free: int) -> None:
    size = batch_size(queued, free)
    assert MIN_SPLIT <= size <= MAX_BATCH_ENTRIES
    if queued <= MIN_SPLIT:
        assert size >= queued, "a short queue goes in one call"
    elif size < MAX_BATCH_ENTRIES:
        assert size * free >= queued > (size - 1) * free or size == MIN_SPLIT


def test_a_refilled_window_goes_as_two_calls_not_one() -> None:
    async def go() -> None:
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        assert await asyncio.gather(*[w.add_entry_async(b"e") for _ in range(500)]) == list(range(500))
        assert fake.batches[:2] == [list(range(250)), list(range(250, 500))]
        assert w.add_requests == 2

    run(go())


def test_adds_made_while_calls_are_in_flight_go_as_the_next_batch() -> None:
    async def go() -> None:
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        fake.hold[0] = asyncio.Event()
        fake.hold[1] = asyncio.Event()
        first = [w.add_entry_async(b"a")]
        await asyncio.sleep(0)  # a free slot: entry 0 goes at once, alone
        first.append(w.add_entry_async(b"b"))
        await asyncio.sleep(0)  # the second slot: entry 1
        queued = [w.add_entry_async(b"c%d" % i) for i in range(50)]  # both slots busy: they wait
        await asyncio.sleep(0.02)
        assert fake.batches == [[0], [1]] and w.add_requests == MAX_IN_FLIGHT_BATCHES == 2
        fake.hold[0].set()
        fake.hold[1].set()
        assert await asyncio.gather(*first, *queued) == list(range(52))
        assert fake.batches == [[0], [1], list(range(2, 52))] and w.add_requests == 3
        assert w.last_add_confirmed == 51

    run(go())


def test_a_batch_is_capped_by_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "MAX_BATCH_ENTRIES", 10)

    async def go() -> None:
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        assert await asyncio.gather(*[w.add_entry_async(b"e") for _ in range(35)]) == list(range(35))
        assert [len(b) for b in fake.batches] == [10, 10, 10, 5]

    run(go())


def test_a_failed_batch_fails_its_adds_and_every_later_one_but_not_earlier_ones() -> None:
    async def go() -> None:
        ledgers, fake, _ = make()
        w = await ledgers.create_ledger(3, 3, 2, PW)
        assert await asyncio.gather(*[w.add_entry_async(b"ok") for _ in range(3)]) == [0, 1, 2]
        fake.hold[3] = asyncio.Event()
        held = w.add_entry_async(b"held")  # entry 3 in a call of its own
        await asyncio.sleep(0)
        fake.fail[("Add", 105)] = [UnauthorizedAccessError("no")] * 2
        refused = [w.add_entry_async(b"r%d" % i) for i in range(3)]  # entries 4..6: one batch
        await asyncio.sleep(0)
        later = [w.add_entry_async(b"l%d" % i) for i in range(3)]  # queued behind it
        await asyncio.sleep(0.02)
        fake.hold[3].set()
        assert await held == 3
        results = await asyncio.gather(*refused, *later, return_exceptions=True)
        assert all(isinstance(r, UnauthorizedAccessError) for r in results), results
        assert w.last_add_confirmed == 3
        assert fake.batches[:4] == [[0, 1, 2], [3], [4, 5, 6], [4, 5, 6]]  # sent again once 3 was through
        with pytest.raises(LedgerClosedError):
            w.add_entry_async(b"refused")

    run(go())
