"""OffsetWaiters: registration before the first suspension, timeouts that clean up, `reached`."""

from __future__ import annotations

import asyncio

import pytest

from tidelog.commitlog.waiters import OffsetWaiters


def test_a_release_right_after_the_call_is_not_missed() -> None:
    # The caller checks, calls wait(), and the release comes before the loop runs anything else
    # of the waiter (an ack handled in the same iteration): it must still complete the waiter.
    async def main() -> int:
        w = OffsetWaiters()
        fut = asyncio.ensure_future(w.wait(10, timeout=5.0))
        await asyncio.sleep(0)  # the waiter's first step runs and registers
        w.release(10)
        return await fut

    assert asyncio.run(main()) == 10


def test_reached_completes_a_waiter_whose_release_came_before_it_registered() -> None:
    async def main() -> int:
        w = OffsetWaiters()
        # another thread already advanced past 10 and released before this waiter existed
        return await w.wait(10, timeout=1.0, reached=lambda: 12)

    assert asyncio.run(main()) == 12


def test_timeout_removes_the_waiter() -> None:
    async def main() -> int:
        w = OffsetWaiters()
        with pytest.raises(TimeoutError):
            await w.wait(10, timeout=0.01)
        return len(w)

    assert asyncio.run(main()) == 0


def test_on_new_target_is_not_asked_for_an_offset_already_reached() -> None:
    asked: list[int] = []

    async def main() -> None:
        w = OffsetWaiters(asked.append)
        await w.wait(5, reached=lambda: 5)
        w2 = OffsetWaiters(asked.append)
        t = asyncio.ensure_future(w2.wait(7))
        await asyncio.sleep(0)
        w2.release(7)
        await t

    asyncio.run(main())
    assert asked == [7]
