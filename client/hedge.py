"""Calls to peers that may have gone silent: speculative reads, and master calls that give up
once a newer master exists.

A replica that went silent (stopped, or cut off with its datacenter) keeps its connection open
and never answers, and gRPC keepalive does not fail a call already waiting on such a connection
before its deadline. A reader that asks replicas one after the other spends a whole RPC timeout
on it. BookKeeper's clients answer this with speculative reads (`speculativeReadTimeout`): the
next replica is asked once the current one has not answered within a short delay, the first
good answer wins and the others are cancelled. Only reads go through here: asking two replicas
for the same confirmed data costs a duplicate read, never a duplicate write.

`first_answer` is the one implementation; the consumer's pull, ledger reads and the Spark
source's range reads use it. Writes cannot be asked twice; `until_superseded` instead watches
the controllers' view while a call to a master is slow and abandons it once another master was
elected (producers and ledger handles use it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from tidelog.errors import UnavailableError
from tidelog.tasks import Interruption

__all__ = [
    "ROUTE_POLL_S",
    "SPECULATIVE_READ_S",
    "STALE_AFTER_S",
    "AllFailed",
    "first_answer",
    "until_superseded",
]

K = TypeVar("K")
T = TypeVar("T")

# Long enough that a healthy replica on a loaded machine is rarely doubled, short enough that a
# silent one costs less than a heartbeat interval.
SPECULATIVE_READ_S = 0.5
# A call to a master slower than this starts watching for a newer master (until_superseded).
STALE_AFTER_S = 0.5
ROUTE_POLL_S = 0.25


class AllFailed(Exception, Generic[K]):
    """Every candidate failed; `errors` holds each one's exception, in the order they were asked."""

    def __init__(self, errors: dict[K, BaseException]) -> None:
        super().__init__(f"{len(errors)} candidate(s) failed")
        self.errors = errors


async def first_answer(
    candidates: Sequence[K],
    attempt: Callable[[K], Awaitable[T]],
    *,
    after_s: float,
    give_up: Callable[[BaseException], bool] = lambda _exc: False,
) -> tuple[K, T]:
    """Ask `candidates[0]`; ask the next one as soon as every asked one has failed or `after_s` has
    passed without an answer. Returns (candidate, result) of the first success; raises AllFailed
    once all have failed, or at once the first exception `give_up` says is final."""
    pending: dict[asyncio.Future[T], K] = {}
    errors: dict[K, BaseException] = {}
    queue = list(candidates)
    try:
        while queue or pending:
            if queue:
                key = queue.pop(0)
                pending[asyncio.ensure_future(attempt(key))] = key
            # Wait for an answer; with candidates left, only `after_s` before asking the next.
            done, _ = await asyncio.wait(
                pending, timeout=after_s if queue else None, return_when=asyncio.FIRST_COMPLETED
            )
            for fut in done:
                key = pending.pop(fut)
                exc = fut.exception()
                if exc is None:
                    return key, fut.result()
                if give_up(exc):
                    raise exc
                errors[key] = exc
            # Failures leave no one in flight: ask the next candidate at once.
        raise AllFailed(errors)
    finally:
        for fut in pending:
            fut.cancel()


async def until_superseded(
    call: Awaitable[T],
    broker_set: str,
    address: str,
    epoch: int,
    newer_epoch: Callable[[], Awaitable[int | None]],
) -> T:
    """Await `call` to the master of `broker_set` at `epoch`, abandoning it once a newer master exists.

    A master that went silent (stopped, or cut off with its datacenter) keeps its connection
    open and never answers; waiting out the deadline would stall every send for it. Once the
    call has taken `STALE_AFTER_S`, `newer_epoch()` (the controllers' view) is asked again
    every `ROUTE_POLL_S` beside the call; a newer master epoch means the old master can no
    longer acknowledge (its lease is gone), so the call is abandoned with UNAVAILABLE and the
    caller retries at the new master. A master that is merely slow keeps its call: no retry,
    no duplicate. Producers and ledger handles both go through here.

    The call runs in the caller's own task, and the watch starts from a timer: a call answered
    within `STALE_AFTER_S` (nearly all of them) costs one timer, not a task of its own and a
    turn of the loop to start it. The watch abandons the call by cancelling the caller's task
    and answers UNAVAILABLE in place of that cancellation; a cancellation from anyone else
    still propagates as one.
    """
    loop = asyncio.get_running_loop()
    caller = asyncio.current_task()
    if caller is None:  # not inside a task (a bare coroutine driven by hand): nothing to cancel
        return await call
    stop = Interruption(caller)
    watcher: list[asyncio.Task[None]] = []

    async def watch() -> None:
        while True:
            try:
                newer = await newer_epoch()
            except Exception:  # no answer from the controllers: the call is kept
                newer = None
            if newer is not None and newer > epoch:
                stop.interrupt(
                    UnavailableError(
                        f"broker set {broker_set} has a new master (epoch {newer}) while {address} was silent"
                    )
                )
                return
            await asyncio.sleep(ROUTE_POLL_S)

    timer = loop.call_later(STALE_AFTER_S, lambda: watcher.append(loop.create_task(watch())))
    try:
        return await call
    except asyncio.CancelledError:
        stop.raise_if_mine()  # only the watch's own cancellation becomes UNAVAILABLE
        raise
    finally:
        timer.cancel()
        for w in watcher:
            w.cancel()
