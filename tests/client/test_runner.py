"""`tidelog.client.runner`: the loop thread sync code runs coroutines on, and the sync facade."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tidelog.client.runner import LoopThread, SyncFacade


@pytest.fixture
def runner():
    r = LoopThread(name="test-runner")
    yield r
    r.stop()


def test_run_waits_for_the_result_on_the_loop_thread(runner):
    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert runner.run(where()) == "test-runner"


def test_run_raises_the_coroutines_exception(runner):
    async def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        runner.run(fail())


def test_submit_returns_a_future_at_once(runner):
    started = threading.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(0.05)
        return 7

    future = runner.submit(slow())
    assert future.result(timeout=5) == 7 and started.is_set()


def test_run_from_the_loops_own_thread_is_refused(runner):
    async def nested() -> None:
        runner.run(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own loop"):
        runner.run(nested())


def test_stop_ends_the_thread_and_closes_the_loop():
    r = LoopThread()
    loop = r.loop
    r.stop()
    assert loop.is_closed()


class _Target:
    def __init__(self) -> None:
        self.closed = False
        self.size = 3

    async def double(self, x: int) -> int:
        return 2 * x

    def plain(self) -> str:
        return "plain"

    async def close(self) -> None:
        self.closed = True


def test_a_facade_runs_coroutine_methods_and_reads_the_rest_through(runner):
    target = _Target()
    with SyncFacade(runner, target) as face:
        assert face.double(21) == 42
        assert face.plain() == "plain"
        assert face.size == 3
        assert face.runner is runner
    assert target.closed
