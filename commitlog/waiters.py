"""Waiters released in offset order when an offset advances (group commit, replica acks).

Any thread may call `release(offset)`; each waiter's asyncio future is completed on its own event
loop. Waiters sit in a SortedList keyed by offset, so one release completes every waiter at or
below the new offset in one pass, however many there are.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable

from sortedcontainers import SortedList

from tidelog.tasks import within


def _resolve(futs: list[asyncio.Future[int]], value: int) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_result(value)


def _fail(fut: asyncio.Future[int], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class OffsetWaiters:
    def __init__(self, on_new_target: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._waiting: SortedList = SortedList()  # (offset, seq, loop, future); seq breaks ties
        self._seq = itertools.count()
        self._on_new_target = on_new_target

    async def wait(
        self, offset: int, timeout: float | None = None, reached: Callable[[], int] | None = None
    ) -> int:
        """Return (the released offset) once `release` reaches `offset`.

        The waiter is registered before this coroutine first suspends, and `timeout` is applied
        here rather than by wrapping the call in `asyncio.wait_for`: wait_for runs the coroutine
        as a task on the next loop iteration, and a release in between (an ack processed first)
        would be missed until the next one, a periodic tick later. `reached()` gives the offset
        already released (e.g. the flushed offset, which another thread advances): checked after
        registering, it closes the window between the caller's own check and registration.
        A waiter that gives up (timeout, cancelled request) removes itself at once, so it does
        not linger until the offset passes.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        entry = (offset, next(self._seq), loop, fut)
        with self._lock:
            self._waiting.add(entry)
        if reached is not None:
            done = reached()
            if done >= offset:
                self.release(done)
        if self._on_new_target is not None and not fut.done():
            self._on_new_target(offset)
        try:
            if timeout is None:
                return await fut
            return await within(fut, timeout)
        except (asyncio.CancelledError, TimeoutError):
            with self._lock:
                self._waiting.discard(entry)
            raise

    def __len__(self) -> int:
        return len(self._waiting)

    def release(self, offset: int) -> int:
        """Complete every waiter at or below `offset`; returns how many."""
        with self._lock:
            if not self._waiting or self._waiting[0][0] > offset:
                return 0
            idx = self._waiting.bisect_left((offset + 1,))
            done = list(self._waiting.islice(0, idx))
            del self._waiting[:idx]
        # one wake-up per event loop, however many waiters it has
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[int]]] = {}
        for _, _, loop, fut in done:
            by_loop.setdefault(loop, []).append(fut)
        for loop, futs in by_loop.items():
            _call(loop, _resolve, futs, offset)
        return len(done)

    def fail_all(self, exc: BaseException) -> None:
        with self._lock:
            done = list(self._waiting)
            self._waiting.clear()
        for _, _, loop, fut in done:
            _call(loop, _fail, fut, exc)


def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        fn(*args)
    elif not loop.is_closed():
        loop.call_soon_threadsafe(fn, *args)
