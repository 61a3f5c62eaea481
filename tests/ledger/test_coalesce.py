"""Several ledgers' add batches bound for one broker share a frame (ledger/coalesce.py): the rule
that cuts frames, and the coalescer against a scripted broker (the real one is in
tests/ledger/test_batch_adds.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import dataport_frames as df
from tidelog.errors import InvalidArgumentError, LedgerFencedError, UnavailableError
from tidelog.ledger.coalesce import AddCoalescer, frames_of


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 100), max_size=40), st.integers(1, 5), st.integers(1, 200))
def test_frames_take_batches_in_order_within_both_limits(sizes, max_groups, room):
    counts = frames_of(sizes, max_groups, room)
    assert sum(counts) == len(sizes) and all(n >= 1 for n in counts)
    at = 0
    for n in counts:
        frame = sizes[at : at + n]
        assert n <= max_groups
        assert n == 1 or sum(frame) <= room  # a batch over the room goes alone
        if at + n < len(sizes):  # greedy: the next batch did not fit
            assert n == max_groups or sum(frame) + sizes[at + n] > room
        at += n


def add(ledger_id: int) -> list[bytes]:
    return df.ledger_add_request(ledger_id, b"pw", [df.LedgerEntry(0, -1, 1, b"d", b"x")])


class Broker:
    """Answers frames as a data port would: ledger 13 is fenced, every other add is taken."""

    def __init__(self, *, data_port: bool = True, fail: bool = False, old: bool = False) -> None:
        self.frames: list[tuple[str, int, int]] = []  # (address, op, ledgers in it)
        self.data_port = data_port
        self.fail = fail
        self.old = old  # a broker from before LEDGER_ADDS

    @staticmethod
    def outcome(call: df.LedgerAddCall) -> tuple[int, bytes]:
        if call.ledger_id == 13:
            return df.ERROR, df.error_body(LedgerFencedError("ledger 13 is fenced"), None)
        return df.OK, df.ledger_added(0, 0, 1, [1, 2])

    async def send(self, address: str, op: int, parts: list[bytes], timeout: float) -> bytes | None:
        await asyncio.sleep(0)
        if not self.data_port:
            return None
        if self.fail:
            raise UnavailableError("the data connection was lost")
        body = b"".join(parts)
        if op == df.OP_LEDGER_ADD:
            self.frames.append((address, op, 1))
            status, reply = self.outcome(df.parse_ledger_add(body))
            if status != df.OK:
                raise LedgerFencedError("ledger 13 is fenced")
            return reply
        if self.old:
            self.frames.append((address, op, 0))
            raise InvalidArgumentError(f"{df.UNKNOWN_OP} {op}")
        calls = df.parse_ledger_adds(body)
        self.frames.append((address, op, len(calls)))
        return b"".join(df.ledger_adds_reply([self.outcome(c) for c in calls]))


def test_batches_of_one_turn_share_a_frame_per_broker_and_each_gets_its_own_answer():
    async def main() -> None:
        broker = Broker()
        adds = AddCoalescer(broker.send)
        calls = [adds.send("a:1", add(i), 5.0) for i in (10, 11, 12, 13)] + [adds.send("b:1", add(20), 5.0)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert sorted(broker.frames) == [("a:1", df.OP_LEDGER_ADDS, 4), ("b:1", df.OP_LEDGER_ADD, 1)]
        assert adds.frames == 1 and adds.grouped == 4
        for r in results[:3] + results[4:]:
            assert df.parse_ledger_added(r) == df.LedgerAdded(0, 0, 1, (1, 2))
        assert isinstance(results[3], LedgerFencedError)  # the fenced ledger's alone
        # the next turn's batches make the next frame
        assert df.parse_ledger_added(await adds.send("a:1", add(10), 5.0)).replicas == (1, 2)
        assert broker.frames[-1] == ("a:1", df.OP_LEDGER_ADD, 1)

    asyncio.run(main())


def test_a_failed_frame_fails_every_batch_in_it_and_no_data_port_answers_none():
    async def main() -> None:
        adds = AddCoalescer(Broker(fail=True).send)
        results = await asyncio.gather(
            *(adds.send("a:1", add(i), 5.0) for i in (1, 2)), return_exceptions=True
        )
        assert all(isinstance(r, UnavailableError) for r in results)
        adds = AddCoalescer(Broker(data_port=False).send)
        assert await asyncio.gather(*(adds.send("a:1", add(i), 5.0) for i in (1, 2))) == [None, None]

    asyncio.run(main())


def test_a_batch_whose_caller_gave_up_before_its_frame_left_is_not_sent():
    async def main() -> None:
        broker = Broker()
        adds = AddCoalescer(broker.send)
        gone = asyncio.ensure_future(adds.send("a:1", add(1), 5.0))
        kept = asyncio.ensure_future(adds.send("a:1", add(2), 5.0))
        await asyncio.sleep(0)  # both queued
        gone.cancel()
        assert df.parse_ledger_added(await kept).replicas == (1, 2)
        assert broker.frames == [("a:1", df.OP_LEDGER_ADD, 1)]
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(main())


def test_a_broker_older_than_shared_frames_gets_each_batch_alone_from_then_on():
    """A rolling upgrade: a broker that answers LEDGER_ADDS as an unknown operation stored none of
    it; every batch of that frame is sent again alone, each caller gets its own answer, and later
    batches for that broker go alone from the start."""

    async def main() -> None:
        broker = Broker(old=True)
        adds = AddCoalescer(broker.send)
        results = await asyncio.gather(
            *(adds.send("a:1", add(i), 5.0) for i in (1, 2, 13)), return_exceptions=True
        )
        assert [df.parse_ledger_added(r).replicas for r in results[:2]] == [(1, 2), (1, 2)]
        assert isinstance(results[2], LedgerFencedError)
        assert broker.frames == [("a:1", df.OP_LEDGER_ADDS, 0)] + [("a:1", df.OP_LEDGER_ADD, 1)] * 3
        await asyncio.gather(*(adds.send("a:1", add(i), 5.0) for i in (3, 4)))
        assert broker.frames[4:] == [("a:1", df.OP_LEDGER_ADD, 1)] * 2

    asyncio.run(main())
