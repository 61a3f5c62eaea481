"""A shared-mode receive of every queue of a topic (broker/shared.py `receive_any`, RocketMQ's pop
of queue id -1, which the RocketMQ endpoint uses for every ReceiveMessage): it takes from every
queue, starts one queue further on at each call so that no queue waits behind another's backlog,
and a waiting one answers the first message written to any queue."""

from __future__ import annotations

import asyncio
from typing import Any

from crc32c import crc32c

from tests.fuzz.replica import QUEUES, TOPIC, master
from tidelog.client.sharedconsumer import decode_receive_reply
from tidelog.commitlog import Message

OPTIONS: dict[str, Any] = dict(invisible_ms=60_000, max_attempts=5, start_latest=False)


def queues_of(got: tuple[bytes, int, list[str], list[int]]) -> list[int]:
    data, count, receipts, attempts = got
    reply = type(
        "Reply", (), dict(records=data, crc=crc32c(data), count=count, receipts=receipts, attempts=attempts)
    )
    return [m.queue for m in decode_receive_reply(reply, "broker-a", "here")]


def test_every_queue_is_read_each_call_starting_one_queue_further_on() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> tuple[list[list[int]], list[int]]:
            replica.queue_offsets(TOPIC, 0)  # served first: its generation marker goes before the messages
            await replica.write(
                [Message(TOPIC, q, f"{q}-{i}".encode()) for q in range(QUEUES) for i in range(5)]
            )
            firsts = []
            for _ in range(QUEUES):
                got = await replica.shared.receive_any("g", TOPIC, max_messages=1, wait_ms=0, **OPTIONS)
                firsts.append(queues_of(got))
            rest = await replica.shared.receive_any("g", TOPIC, max_messages=100, wait_ms=0, **OPTIONS)
            return firsts, queues_of(rest)

        firsts, rest = m.run(go(), 20.0)
        assert firsts == [[0], [1], [2], [3]]  # one receive each, each from the next queue
        assert sorted(rest) == sorted([q for q in range(QUEUES) for _ in range(4)])  # everything else, once


def test_a_waiting_receive_answers_the_first_message_of_any_queue() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> tuple[list[int], bool]:
            replica.queue_offsets(TOPIC, 0)
            waiting = asyncio.ensure_future(
                replica.shared.receive_any("g", TOPIC, max_messages=5, wait_ms=60_000, **OPTIONS)
            )
            await asyncio.sleep(0)  # the receive is waiting: nothing is there
            assert not waiting.done()
            await replica.write([Message(TOPIC, QUEUES - 1, b"last queue")])
            got = await waiting  # bounded by m.run's timeout, far below the receive's own minute
            await replica.shared.ack(("g", TOPIC, QUEUES - 1), got[2])  # its receipt is that queue's
            return queues_of(got), True

        queues, acked = m.run(go(), 10.0)
        assert queues == [QUEUES - 1] and acked
