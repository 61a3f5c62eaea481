"""A shared-mode receive that waits (broker/shared.py `SharedSubscriptions.receive`) answers as soon
as there is something to hand out: a message written during its wait, or a message whose invisible
time another call shortened during its wait (a push consumer's listener that failed on it)."""

from __future__ import annotations

import asyncio
import time

from tests.fuzz.replica import TOPIC, master
from tidelog.commitlog import Message

KEY = ("g", TOPIC, 0)
WAIT_MS = 8000


def test_a_waiting_receive_answers_a_message_written_during_its_wait() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> tuple[float, int, list[int]]:
            replica.queue_offsets(TOPIC, 0)
            t0 = time.monotonic()
            waiting = asyncio.ensure_future(
                replica.shared.receive(
                    KEY,
                    max_messages=5,
                    invisible_ms=60_000,
                    max_attempts=5,
                    start_latest=False,
                    wait_ms=WAIT_MS,
                )
            )
            await asyncio.sleep(0.3)
            await replica.write([Message(TOPIC, 0, b"late")])
            _, count, _, attempts = await waiting
            return time.monotonic() - t0, count, attempts

        took, count, attempts = m.run(go(), 20.0)
        assert (count, attempts) == (1, [1])
        assert took < 2.0, f"the receive answered after {took:.1f}s, not when the message came"


def test_a_waiting_receive_answers_a_message_given_back_during_its_wait() -> None:
    with master() as m:
        replica = m.replica

        async def go() -> tuple[float, list[int]]:
            replica.queue_offsets(TOPIC, 0)
            await replica.write([Message(TOPIC, 0, b"retried")])
            _, _, (receipt,), _ = await replica.shared.receive(
                KEY, max_messages=1, invisible_ms=60_000, max_attempts=5, start_latest=False, wait_ms=0
            )
            t0 = time.monotonic()
            waiting = asyncio.ensure_future(
                replica.shared.receive(
                    KEY,
                    max_messages=1,
                    invisible_ms=60_000,
                    max_attempts=5,
                    start_latest=False,
                    wait_ms=WAIT_MS,
                )
            )
            await asyncio.sleep(0.3)  # the receive waits for the lease's 60 s, or its own 8 s
            await replica.shared.change_invisible(KEY, [receipt], 500)
            _, count, _, attempts = await waiting
            assert count == 1
            return time.monotonic() - t0, attempts

        took, attempts = m.run(go(), 20.0)
        assert attempts == [2]
        assert 0.7 <= took < 2.5, f"given back for 0.5 s at 0.3 s, delivered again after {took:.1f}s"
