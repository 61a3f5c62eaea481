"""What the peers harness's `send()` loop costs by itself: the ceiling on its 1,000-in-flight figure.

The harness (`bench_tidelog.py`, `produce_throughput_raw`) keeps 1,000 sends in flight on asyncio's
own event loop: one task per send, made with `asyncio.ensure_future`, bounded by a semaphore, each
awaiting `producer.send(topic, message)`. This bench runs that loop, in the same shape, against a
producer that does nothing: each send's future is resolved on the loop's next turn, all the sends
of a turn at once, as one reply's receipts would be. What it reaches is the most any producer can
reach under that harness on this machine; the client's own budget per send is what is left of the
target's per-send time after the loop's. Run from the repository root:

    python -m bench.sendfloor                  # four rounds of 8 s
    python -m bench.sendfloor --target 42024   # and the client's budget against a target rate
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

MESSAGE = b"x" * 1024
IN_FLIGHT = 1000


class NullProducer:
    """A producer whose sends cost nothing: every future made in one turn is resolved in the next."""

    def __init__(self) -> None:
        self._pending: list[asyncio.Future[None]] = []
        self._scheduled = False

    def send(self, topic: str, body: bytes) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._reply)
        return fut

    def _reply(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        for fut in batch:
            fut.set_result(None)


async def harness_loop(
    producer: Any, seconds: float, topic: str = "tp", body: bytes = MESSAGE
) -> tuple[int, float]:
    """The harness's loop, in its shape, for `seconds`: (sends that succeeded, seconds it took).
    Like the harness, a failed send is not counted and does not stop the loop."""
    sem = asyncio.Semaphore(IN_FLIGHT)
    n, t0 = 0, time.perf_counter()

    async def one() -> None:
        nonlocal n
        try:
            await producer.send(topic, body)
            n += 1
        finally:
            sem.release()

    tasks: set[asyncio.Task[None]] = set()
    while time.perf_counter() - t0 < seconds:
        await sem.acquire()
        t = asyncio.ensure_future(one())
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks, return_exceptions=True)
    return n, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--target", type=float, default=None, help="a target rate, sends/s")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or (args.target is not None and args.target <= 0):
        ap.error("--seconds and --target must be positive, --rounds at least 1")
    rates = []
    for i in range(args.rounds):
        n, dt = asyncio.run(harness_loop(NullProducer(), args.seconds))  # asyncio's own loop, as the harness
        rate = n / dt
        rates.append(rate)
        print(f"round {i + 1}: {rate:,.0f} sends/s ({1e6 / rate:.1f} µs of the loop per send)")
    best, median = max(rates), statistics.median(rates)
    print(f"median {median:,.0f} sends/s, best {best:,.0f}")
    if args.target is not None:
        left = 1e6 / args.target - 1e6 / best
        print(
            f"at {args.target:,.0f} sends/s a send may take {1e6 / args.target:.1f} µs in all; "
            f"the loop takes {1e6 / best:.1f} at best, leaving the client {left:.1f} µs per send"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
