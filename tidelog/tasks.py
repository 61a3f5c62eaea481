"""Deadlines and cancellation for asyncio code, done the one way that is safe on Python 3.11.

Python 3.11's `asyncio.wait_for` swallows a cancellation that arrives in the same loop iteration
as its inner awaitable's result: it returns the result and the task carries on as if nobody had
cancelled it. A loop such as the HA slave's (connect, read, retry) then never stops, and whoever
awaited its end (a role change waiting for the old slave to stop) waits forever. That is how a
replica resumed after a pause kept following a deposed master for good. So nothing in tidelog
calls `asyncio.wait_for` (ruff bans it); `within` bounds a wait the way `asyncio.timeout` does,
which delivers every cancellation, and `cancel_and_wait` ends a task without swallowing the caller's
own cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["Interruption", "cancel_and_wait", "within"]

T = TypeVar("T")


class Interruption:
    """Cancels a task on someone's behalf and tells that cancellation from anyone else's.

    `interrupt(error)` cancels the task; in the task's `except CancelledError`, `raise_if_mine()`
    raises `error` instead when this was the only new cancellation, and returns (the caller
    re-raises) when someone else cancelled too. Counted against the cancellations already
    requested when it was made, as asyncio.timeout counts: cleanup code in a task being cancelled
    still gets its own error. `within` (a deadline) and `client/hedge.py::until_superseded` (a
    newer master) are its two uses."""

    __slots__ = ("_before", "_error", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self._before = task.cancelling()
        self._error: BaseException | None = None

    def interrupt(self, error: BaseException) -> None:
        self._error = error
        self.task.cancel()

    def raise_if_mine(self) -> None:
        if self._error is not None and self.task.uncancel() <= self._before:
            raise self._error from None


async def within(aw: Awaitable[T], seconds: float | None) -> T:
    """Await `aw` for at most `seconds` (None: no limit); TimeoutError past it. Unlike 3.11's
    `wait_for`, a cancellation of the caller always propagates.

    What `asyncio.timeout` does, by hand: a timer interrupts the caller's task (`Interruption`),
    and that cancellation becomes TimeoutError. It bounds every frame read and reply wait on the
    brokers' hot paths, several per message, where asyncio.timeout's context manager cost twice
    this (bench/RESULTS.md)."""
    if seconds is None:
        return await aw
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("within() must be awaited inside a task")
    stop = Interruption(task)
    timer = asyncio.get_running_loop().call_later(
        seconds, lambda: stop.interrupt(TimeoutError(f"no answer within {seconds:g}s"))
    )
    try:
        return await aw
    except asyncio.CancelledError:
        stop.raise_if_mine()
        raise  # someone else's cancellation (too): it goes on
    finally:
        timer.cancel()


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel `tasks` and wait until each has ended, whatever it ended with (its error, if any, is
    retrieved so that it is not reported as never retrieved). A task that caught a cancellation
    and went on is cancelled again until it ends. The caller's own cancellation propagates."""
    pending = {t for t in tasks if t is not None and not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if task is not None and task.done() and not task.cancelled():
            task.exception()
