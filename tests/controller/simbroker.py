"""A simulated broker for controller tests: registers over gRPC and heartbeats until stopped.

It does what a real broker's controller loop does and nothing else (no log, no HA): register,
heartbeat every interval with its (epoch, max offset), remember the role the replies carry.
"""

from __future__ import annotations

import asyncio
import contextlib

from tidelog.client.controllers import ControllerClient
from tidelog.proto import controller_pb2 as pb


class SimBroker:
    def __init__(
        self,
        client: ControllerClient,
        broker_set: str,
        n: int,
        *,
        epoch: int = 0,
        max_offset: int = 0,
        interval: float = 0.3,
    ) -> None:
        self.client = client
        self.broker_set = broker_set
        self.address = f"127.0.0.1:{40000 + n}"  # never dialled: the controller only records it
        self.ha_address = f"127.0.0.1:{41000 + n}"
        self.identity = f"{broker_set}-identity-{n}"
        self.epoch = epoch
        self.max_offset = max_offset
        self.interval = interval
        self.broker_id: int | None = None
        self.role: pb.RoleAssignment | None = None
        self.beats = 0
        self._task: asyncio.Task[None] | None = None

    async def register(self) -> int:
        reply = await self.client.register_broker(
            self.broker_set, self.address, self.ha_address, identity=self.identity, broker_id=self.broker_id
        )
        self.broker_id = reply.broker_id
        self.role = reply.role
        return reply.broker_id

    async def beat_once(self) -> pb.HeartbeatReply:
        assert self.broker_id is not None
        reply = await self.client.heartbeat(
            self.broker_set, self.broker_id, epoch=self.epoch, max_offset=self.max_offset, total_timeout=2.0
        )
        self.role = reply.role
        self.beats += 1
        return reply

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a controller failover: keep beating, like a broker
                await self.beat_once()
            await asyncio.sleep(self.interval)

    def start(self) -> SimBroker:
        assert self._task is None
        self._task = asyncio.ensure_future(self._loop())
        return self

    async def stop(self) -> None:
        """Stop heartbeating (the broker 'dies' as far as the controller can tell)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Async polling: await `predicate()` until truthy or fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await predicate()
            if value:
                return value
        except Exception as exc:
            last = exc
        if loop.time() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting for {what}"
                + (f" (last error: {last!r})" if last else "")
            )
        await asyncio.sleep(interval)
