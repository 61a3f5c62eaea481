"""Acknowledgements of one queue in the shared mode share one replicated write when they arrive
together (broker/shared.py `SharedSubscriptions.ack`), each call still all or nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.fuzz.replica import TOPIC, master
from tidelog.broker.shared import SHARED_TOPIC
from tidelog.commitlog import Message
from tidelog.errors import ReceiptInvalidError

KEY = ("g", TOPIC, 0)


def test_concurrent_acks_are_written_together_and_a_bad_one_fails_alone() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> list[object]:
            replica.queue_offsets(TOPIC, 0)  # served first: its generation marker goes before the messages
            await replica.write([Message(TOPIC, 0, b"m%d" % i) for i in range(20)])
            _, count, receipts, _ = await replica.shared.receive(
                KEY, max_messages=20, invisible_ms=60_000, max_attempts=5, start_latest=False, wait_ms=0
            )
            assert count == 20
            calls = [replica.shared.ack(KEY, [r]) for r in receipts]
            calls.insert(7, replica.shared.ack(KEY, ["3e7.1.1"]))  # offset 999: never given
            return await asyncio.gather(*calls, return_exceptions=True)

        results = m.run(go(), 20.0)
        assert [type(r) for r in results if r is not None] == [ReceiptInvalidError]
        assert results.count(None) == 20
        records = [
            json.loads(r.body) for r in replica.log.read(SHARED_TOPIC, 0, 0, 100, confirmed_only=False)
        ]
        acks = [r for r in records if "a" in r]
        assert sorted(o for r in acks for o in r["a"]) == list(range(20))
        assert len(acks) <= 3, f"{len(acks)} ack records for 20 acks arriving together"
        state = replica.shared.states.get(KEY)
        assert state is not None and state.floor == 20 and not state.leases


def test_an_ack_naming_one_bad_receipt_finishes_none_of_its_messages() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> None:
            replica.queue_offsets(TOPIC, 0)
            await replica.write([Message(TOPIC, 0, b"m%d" % i) for i in range(3)])
            _, _, receipts, _ = await replica.shared.receive(
                KEY, max_messages=3, invisible_ms=60_000, max_attempts=5, start_latest=False, wait_ms=0
            )
            with pytest.raises(ReceiptInvalidError):
                await replica.shared.ack(KEY, [receipts[0], "3e7.1.1"])
            await replica.shared.ack(KEY, receipts[1:])

        m.run(go(), 20.0)
        state = replica.shared.states.get(KEY)
        assert state is not None and sorted(state.leases) == [0], "the first call finished nothing"
