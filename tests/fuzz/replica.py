"""An in-process master replica for the fuzzers that drive real handlers (the gRPC services, the
data port): one broker set of one broker, elected master of epoch 1, serving topic "t" with four
queues, on a commit log in a temporary directory. Built as tests/broker/test_metrics.py builds
its master; everything runs on one `asyncio.Runner`, so that a synchronous check can call an
async handler (`Master.run`) and the replica's tasks run meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from tidelog.broker import config
from tidelog.broker.replica import Replica, Role
from tidelog.commitlog import CommitLog
from tidelog.tasks import within

SET = "broker-a"
TOPIC = "t"
QUEUES = 4
T = TypeVar("T")


class Master:
    """The replica and the loop it runs on."""

    def __init__(self, runner: asyncio.Runner, replica: Replica) -> None:
        self.runner = runner
        self.replica = replica

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the replica's loop, at most `timeout` seconds (TimeoutError past it)."""
        # The lease runs out after a minute; a fuzz run is longer, and NOT_MASTER for everything
        # would leave the handlers' other paths untried.
        self.replica.lease.renew(self.replica.clock_ms(), 80_000, epoch=1, unclean_elections=True)
        return self.runner.run(within(coro, timeout))


async def _start(root: Path) -> Replica:
    cfg = config.from_mapping(
        {
            "broker_set": SET,
            "data_dir": str(root),
            "controllers": "127.0.0.1:1",  # never called: the role is given below
            "secret": "a-real-secret-for-the-fuzzers-0123456789",
            "flush": "async",
            "max_message_bytes": 1 << 20,
        }
    )
    log = CommitLog.open(root, segment_bytes=1 << 20, flush="async")
    replica = Replica(cfg, log, broker_id=1)
    await replica.apply_role(Role(True, 1, "127.0.0.1:1", "127.0.0.1:2", 1, frozenset({1}), 1))
    replica.lease.renew(replica.clock_ms(), 80_000, epoch=1, unclean_elections=True)
    replica.topic_table.update(SET, [SimpleNamespace(name=TOPIC, queues={SET: QUEUES}, generation=1)], [])
    return replica


@contextlib.contextmanager
def master() -> Iterator[Master]:
    root = Path(tempfile.mkdtemp(prefix="tidelog-fuzz-broker-"))
    runner = asyncio.Runner()
    try:
        replica = runner.run(_start(root))
        try:
            yield Master(runner, replica)
        finally:
            runner.run(replica.close())
            replica.log.close()
    finally:
        runner.close()
        shutil.rmtree(root, ignore_errors=True)
