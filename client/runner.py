"""The event loop that synchronous tidelog code runs its asyncio calls on.

Every client is written once, in asyncio (`tidelog.client.aio`, `tidelog.ledger`). Synchronous
callers reach it through a `LoopThread`: one event loop running for ever on a daemon thread.
`LoopThread` owns that loop and that thread, and nothing else: it does not know about clients,
connections or ledgers. Whatever is created on its loop (an `AsyncClient`'s channels, a ledger
handle's pending adds) belongs to the caller, who closes it with `run(obj.close())` before `stop()`.

From synchronous code:

    runner = LoopThread()
    try:
        reply = runner.run(controller.describe_broker_sets())   # blocks until the coroutine is done
        future = runner.submit(producer.send_async(...))         # a concurrent.futures.Future
    finally:
        runner.stop()

`tidelog.client.Client` holds one as `client.runner`; code that has a sync `Client` and needs an
async call the sync API does not offer runs it there: `client.runner.run(client.aio.route(topic))`.
`run` refuses to be called from the loop's own thread (it would wait for itself for ever).

`SyncFacade` is the other half: a synchronous face of one async object, whose coroutine methods
run on a `LoopThread` and are waited for. The sync producer, consumer, reader and admin are
facades, and so are the ledger API's sync classes (`tidelog.ledger.sync`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tidelog import loops

T = TypeVar("T")

__all__ = ["LoopThread", "SyncFacade"]


class LoopThread:
    """One asyncio event loop on a daemon thread, for running coroutines from synchronous code."""

    def __init__(self, name: str = "tidelog-client") -> None:
        self._loop = loops.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop: for `asyncio.run_coroutine_threadsafe` and `call_soon_threadsafe`."""
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the loop and return at once with a future of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (or its exception, raised here)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("synchronous tidelog calls cannot run on the client's own loop")
        return self.submit(coro).result()

    def stop(self) -> None:
        """Stop the loop and its thread; the loop is closed once the thread has ended. Tasks still
        running (a call its caller stopped waiting for, as Ctrl-C does) are cancelled and ended
        first, as `asyncio.run` does: a loop stopped under them printed "Task was destroyed but it
        is pending!" when they were collected."""
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


async def _cancel_others() -> None:
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class SyncFacade:
    """A synchronous face of an async object: its coroutine methods run on `runner` and are waited
    for; everything else (properties, plain methods) reads through. `with` closes the object."""

    def __init__(self, runner: LoopThread, target: Any) -> None:
        self._runner = runner
        self._target = target

    @property
    def runner(self) -> LoopThread:
        return self._runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if asyncio.iscoroutinefunction(attr):

            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._runner.run(attr(*args, **kwargs))

            return call
        return attr

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        close = getattr(self._target, "close", None)
        if close is not None:
            self._runner.run(close())
