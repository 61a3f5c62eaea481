"""Deadlines and cancellation (tidelog/tasks.py): a cancellation is never lost.

On Python 3.11, `asyncio.wait_for` returns its inner result when a cancellation arrives in the
same loop iteration, and the cancelled task carries on. A replica resumed after a pause met
exactly that in its HA slave loop (the connection to the deposed master completed as the role
change cancelled the loop): the loop never ended, the role change waited for it forever, and the
replica kept following the deposed master. These tests make that race on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from tidelog.commitlog import CommitLog
from tidelog.ha.slave import HaSlave
from tidelog.tasks import cancel_and_wait, within


def test_within_delivers_a_cancellation_that_races_the_result() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        rounds = []

        async def worker() -> None:
            while True:  # like a reconnect loop: only a cancellation ends it
                rounds.append(await within(fut if not rounds else asyncio.sleep(0.01), 5))

        task = asyncio.ensure_future(worker())
        await asyncio.sleep(0.01)
        fut.set_result("connected")
        task.cancel()  # same iteration as the result
        with pytest.raises(asyncio.CancelledError):
            await within(task, 5)
        assert rounds == [], "the cancelled loop went on after its cancellation"

    asyncio.run(main())


def test_within_times_out_and_passes_results() -> None:
    async def main() -> None:
        assert await within(asyncio.sleep(0, "done"), 1) == "done"
        assert await within(asyncio.sleep(0, "no limit"), None) == "no limit"
        with pytest.raises(TimeoutError):
            await within(asyncio.sleep(10), 0.05)

    asyncio.run(main())


def test_nested_deadlines_each_answer_for_their_own() -> None:
    """The inner deadline passing is a TimeoutError the outer wait sees as an error, not as its
    own expiry; the outer one passing cancels the inner wait and is the outer's TimeoutError."""

    async def main() -> None:
        async def inner(seconds: float) -> str:
            try:
                await within(asyncio.sleep(10), seconds)
            except TimeoutError:
                return "inner expired"
            return "slept"

        assert await within(inner(0.02), 5) == "inner expired"
        with pytest.raises(TimeoutError):
            await within(inner(5), 0.02)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(main())


@pytest.mark.parametrize("cancel_after", [0.01, 0.09], ids=["cancel first", "deadline first"])
def test_a_cancellation_at_the_deadline_stays_a_cancellation(cancel_after: float) -> None:
    """When the deadline passes and someone else cancels the same task in the same iteration, in
    either order, the task ends cancelled: the deadline must not turn the other cancellation into
    a TimeoutError."""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def waiter() -> None:
            await within(asyncio.sleep(10), 0.05)

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)  # the waiter's deadline is set
        loop.call_later(cancel_after, task.cancel)
        time.sleep(0.15)  # the loop is held: both timers are due when it next runs, together
        with pytest.raises(asyncio.CancelledError):
            await within(task, 5)

    asyncio.run(main())


def test_a_deadline_in_cleanup_after_a_cancellation_is_still_a_timeout() -> None:
    """Cleanup code in a task being cancelled (closing a connection in a `finally`) may bound a
    wait with `within`: its deadline passing is a TimeoutError there too, which the cleanup
    handles before going on, not a second cancellation that skips the rest of it."""

    async def main() -> None:
        cleanup: list[str] = []

        async def worker() -> None:
            try:
                await asyncio.sleep(10)
            finally:
                try:
                    await within(asyncio.sleep(10), 0.02)
                except TimeoutError:
                    cleanup.append("timed out")
                cleanup.append("went on")

        task = asyncio.ensure_future(worker())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(task, 5)
        assert cleanup == ["timed out", "went on"]

    asyncio.run(main())


def test_cancel_and_wait_ends_a_task_that_swallowed_one_cancellation() -> None:
    async def main() -> None:
        swallowed = []

        async def stubborn() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed.append(True)  # what 3.11's wait_for does by accident
            await asyncio.sleep(10)

        task = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0.01)
        await within(cancel_and_wait(task, None), 5)
        assert swallowed == [True] and task.cancelled()

    asyncio.run(main())


def test_cancel_and_wait_lets_the_callers_cancellation_through() -> None:
    async def main() -> None:
        deafness = [True]

        async def deaf() -> None:
            while deafness:  # swallows every cancellation until told not to
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(10)

        victim = asyncio.ensure_future(deaf())
        waiter = asyncio.ensure_future(cancel_and_wait(victim))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        deafness.clear()
        victim.cancel()
        await asyncio.wait({victim})

    asyncio.run(main())


class _Writer:
    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_slave_stops_when_its_connection_completes_as_it_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race of the resumed replica, at unit level: the connect resolves in the same loop
    iteration as stop() cancels the slave; stop() must still return."""
    log = CommitLog.open(tmp_path, flush_interval_ms=10**6, checkpoint_interval_ms=10**6)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        connecting: list[asyncio.Future[tuple[asyncio.StreamReader, _Writer]]] = []

        def open_connection(host: str, port: int) -> asyncio.Future[tuple[asyncio.StreamReader, _Writer]]:
            connecting.append(loop.create_future())
            return connecting[-1]

        monkeypatch.setattr(asyncio, "open_connection", open_connection)
        slave = HaSlave(
            log,
            broker_set="bs",
            broker_id=2,
            master_id=1,
            master_address="127.0.0.1:1",
            master_epoch=1,
            retry_ms=10,
            secret="s" * 32,
        ).start()
        await asyncio.sleep(0.01)
        assert len(connecting) == 1
        reader = asyncio.StreamReader()
        reader.feed_eof()  # the session fails at once and the loop would reconnect
        connecting[0].set_result((reader, _Writer()))
        await within(slave.stop(), 5)
        await asyncio.sleep(0.05)
        assert len(connecting) == 1, "the stopped slave connected again"

    try:
        asyncio.run(main())
    finally:
        log.close()
