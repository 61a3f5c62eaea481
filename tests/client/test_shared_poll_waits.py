"""A shared consumer's long poll (client/sharedconsumer.py): a wait an earlier poll left going
ends by that poll's deadline, empty; the next poll must then wait on that broker set again for the
rest of its own timeout, not return empty at once. Unit level: the broker's receive is a stand-in
that answers as a broker would (empty at its wait's end, or a message)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tidelog.client.sharedconsumer import AsyncSharedConsumer


def test_a_poll_after_a_short_one_still_waits_for_its_message() -> None:
    async def go() -> tuple[list[Any], list[Any], list[int]]:
        route = SimpleNamespace(queue_list=[("broker-a", 0)])

        async def lookup(*_args: Any, **_kw: Any) -> Any:
            return route

        consumer = AsyncSharedConsumer(SimpleNamespace(route=lookup), "g", "t")  # type: ignore[arg-type]

        async def carry_on() -> None:
            return None

        asked: list[int] = []
        long_waits = 0

        async def receive(_route: Any, _q: Any, _max: int, wait_ms: int) -> list[Any]:
            nonlocal long_waits
            asked.append(wait_ms)
            if wait_ms == 0:
                return []
            long_waits += 1
            if long_waits == 1:
                await asyncio.sleep(0.5)  # the first poll's wait: ends after that poll returned
                return []
            await asyncio.sleep(0.2)
            return ["message"]  # a message arrives while the second poll waits

        consumer.rebalance_or_carry_on = carry_on  # type: ignore[method-assign]
        consumer._receive = receive  # type: ignore[method-assign]
        first = await consumer.poll(timeout=0.1)
        second = await consumer.poll(timeout=5.0)
        return first, second, asked

    first, second, asked = asyncio.run(go())
    assert first == []
    assert second == ["message"], "the second poll returned before its timeout, empty"
    assert asked[0] == 0 and asked[1] == 100 and len(asked) == 3  # the set asked again, once
