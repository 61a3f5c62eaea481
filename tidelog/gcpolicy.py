"""How tidelog's long-running processes (brokers, controller nodes) use Python's cyclic collector.

A full (generation 2) collection walks every tracked object of the process. In a broker just
started these are mostly what start-up made and keeps for good: imported modules, protobuf
descriptors, gRPC's objects, the recovered log's structures. On the bench machine one such
collection in a process that has imported the broker took 33 ms (41,000 objects), and 0.0 ms once
they were frozen (bench/RESULTS.md, "Pauses of the garbage collector"). A send in flight meanwhile
waits that long, on a `flush: sync` write once for the master and once for the slave.

`after_start()` is called once a process has started: it collects the young generations (start-up's
recent garbage), then moves every object left into the permanent generation (`gc.freeze`), which
collections do not walk. Objects made afterwards are collected as before; what was frozen is never
freed, which costs nothing for objects that live as long as the process. It does not run a full
collection first: that walked all 42,000 objects of a broker's start for 27 ms of CPU and found
no garbage (the young pass: 0.4 ms), in every broker and controller the suite starts (several
hundred); a cycle left by start-up in an old generation stays frozen, a few objects at most.

A controller's state keeps growing after start (100,000 topics, a million ledgers): each full
collection walks all of it (20 ms for 100,000 topic objects, in the middle of a route lookup).
`Settle` decides when what was made since is moved out of reach too, and `settle()` does it:
the young generations collected first (their cycles freed: a cheap pass over recent objects
only), then everything left frozen. Objects frozen and later dropped are still freed by their
reference counts; only a cycle among them is kept until the process ends.

`paused()` turns the collector off while a bulk build makes millions of objects that all live
on (a controller snapshot's restore): every collection the allocations trigger walks what was
built so far, which cost a restore of 1,000,000 ledgers 7.2 s instead of 4.2 s.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


def after_start(what: str) -> None:
    """Freeze what start-up made (see the module's docstring); `what` names the process in the log."""
    t0 = time.perf_counter()
    settle()
    log.info(
        "%s: %d objects moved out of the collector's reach after start (%.0f ms)",
        what,
        gc.get_freeze_count(),
        (time.perf_counter() - t0) * 1000,
    )


class Settle:
    """When to `settle()`: once the watched state changed (a counter that moves with it) and at
    most every `interval_s` seconds. Time is passed in."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._changes = 0
        self._at = float("-inf")

    def due(self, changes: int, now: float) -> bool:
        """Whether to settle now; when it answers yes, the caller settles."""
        if changes == self._changes or now - self._at < self.interval_s:
            return False
        self._changes, self._at = changes, now
        return True


def settle() -> None:
    """Collect the young generations, then freeze every object left (see the module's docstring)."""
    gc.collect(1)
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off for the block (see the module's docstring); on again after, unless
    it was off before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
