"""The event loop every tidelog process runs: uvloop when it is installed, else asyncio's own.

uvloop implements the loop, its transports and its streams in C (on libuv): the brokers'
produce and pull frames, the HA stream and the clients' connections spend less of their time
in the loop itself (measured in bench/RESULTS.md, "Record batches"). `TIDELOG_EVENT_LOOP=asyncio`
turns it off for one process (to compare, or to rule it out when something misbehaves).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
ENV = "TIDELOG_EVENT_LOOP"


def _uvloop() -> Any:
    if os.environ.get(ENV, "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def name() -> str:
    """Which loop `run` and `new_event_loop` use: "uvloop" or "asyncio"."""
    return "uvloop" if _uvloop() is not None else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    uv = _uvloop()
    return uv.new_event_loop() if uv is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `name()` says."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
