"""The Spark source's I/O: asking the cluster for queue offsets, and reading one planned range.

Both run inside Spark's Python worker processes (never the driver's), each with an event loop
and a client of its own for the duration of the call: nothing here may outlive a task, because
Spark pickles readers and partitions and forks workers.

A range `[start, end)` was planned below the confirmed offset, so every replica of the broker
set holds the same bytes for it. `read_range` reads from the replicas in order (slaves first,
as planned), and when one fails or lags behind the planned end it continues from the same offset
on the next: the rows are identical whichever replica serves them. It never returns an offset at
or past `end`, and checks that offsets arrive contiguous, so a retried task reads the same rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tidelog.client.aio import AsyncClient
from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.errors import (
    CorruptRecordError,
    OffsetBelowRetentionError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb
from tidelog.spark.plan import QueueState, check_start, queue_name

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "this replica, not now": the next replica, or a later try, may answer.
_REPLICA_ERRORS = (UnavailableError, TopicNotFoundError, CorruptRecordError)  # another replica has it
PULL_MAX_BYTES = 8 << 20
PULL_WAIT_MS = 1000


def run(coro_fn: Callable[[AsyncClient], Awaitable[T]], controllers: str, *, rpc_timeout: float = 5.0) -> T:
    """Run `coro_fn(client)` on a fresh event loop with a client that is closed afterwards."""

    async def main() -> T:
        client = AsyncClient(controllers, rpc_timeout=rpc_timeout)
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


@dataclass(frozen=True)
class ClusterView:
    """What planning learned: each queue's offsets, and where its broker set can be read."""

    states: list[QueueState]
    replicas: dict[tuple[str, str], tuple[str, ...]]  # (topic, broker set) -> addresses, slaves first


async def cluster_view(client: AsyncClient, topics: Sequence[str], *, timeout: float = 30.0) -> ClusterView:
    """Offsets (min, confirmed) of every queue of `topics`, retried through a failover.

    A master that just died, or a broker that has not learned a new topic yet (brokers learn
    topics from their next heartbeat), answers with an error for a few seconds; planning waits
    that out (up to `timeout`) instead of failing a job. The controller saying that a topic does
    not exist is final.
    """
    deadline = time.monotonic() + timeout
    refresh = False
    while True:
        routes = await _routes(client, topics, refresh=refresh, deadline=deadline)
        if routes is not None:
            try:
                return await _queue_offsets(client, routes)
            except _REPLICA_ERRORS as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("queue offsets of %s not available yet (%s); retrying", ",".join(topics), exc)
                await asyncio.sleep(0.2)
        refresh = True


async def _routes(
    client: AsyncClient, topics: Sequence[str], *, refresh: bool, deadline: float
) -> dict[str, TopicRoute] | None:
    """The route of every topic; None (after a pause) while the controllers are unavailable and
    there is time left to ask again. A topic without queues is TopicNotFoundError."""
    routes: dict[str, TopicRoute] = {}
    for topic in topics:
        try:
            routes[topic] = await client.route(topic, refresh=refresh)
        except UnavailableError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)
            return None
        if not routes[topic].broker_sets:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
    return routes


async def _queue_offsets(client: AsyncClient, routes: dict[str, TopicRoute]) -> ClusterView:
    """Every queue's offsets, asked of its broker set, and where each broker set can be read."""
    states: list[QueueState] = []
    replicas: dict[tuple[str, str], tuple[str, ...]] = {}
    for topic, route in routes.items():
        pairs = [(bs, q) for bs in route.broker_sets for q in range(bs.queues)]
        offsets = await asyncio.gather(*(client.queue_offsets(bs, topic, q) for bs, q in pairs))
        for (bs, q), o in zip(pairs, offsets, strict=True):
            states.append(QueueState(topic, bs.name, q, int(o.min), int(o.confirmed)))
        for bs in route.broker_sets:
            replicas[(topic, bs.name)] = tuple(bs.read_addresses())
    return ClusterView(states, replicas)


class RangeReader:
    """Reads `[start, end)` of one queue in chunks, from whichever replica answers."""

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        broker_set: str,
        queue: int,
        start: int,
        end: int,
        replicas: Sequence[str],
        *,
        fail_on_data_loss: bool = True,
        max_messages: int = 4096,
        timeout: float = 60.0,
    ) -> None:
        self.client = client
        self.topic = topic
        self.broker_set = broker_set
        self.queue = queue
        self.position = start
        self.end = end
        self.replicas = list(replicas)
        self.fail_on_data_loss = fail_on_data_loss
        self.max_messages = max_messages
        self.timeout = timeout
        self.served_by: list[tuple[str, int, int]] = []  # (address, first offset, count), for tests and logs
        self._turn = 0
        self.where = f"{topic} {queue_name(broker_set, queue)}"

    async def _refresh_replicas(self) -> None:
        try:
            route = await self.client.route(self.topic, refresh=True)
        except TidelogError as exc:
            log.info("%s: route refresh failed: %s", self.where, exc)
            return
        bs: BrokerSetRoute | None = route.broker_set(self.broker_set)
        if bs is not None and bs.read_addresses():
            # Keep the planned order's spirit (slaves first) with what the controller says now.
            self.replicas = bs.read_addresses()

    async def _min_offset(self, address: str) -> int:
        reply = await self.client.call_broker(
            address, "GetOffsets", bpb.GetOffsetsRequest(topic=self.topic, queue=self.queue)
        )
        return int(reply.offsets.min)

    async def next_chunk(self) -> list[bpb.PulledMessage]:
        """The next messages of the range (at least one), or [] once the range is done.

        Replicas are asked in turn, speculatively (client/hedge.py): one that has not answered
        within the pull's wait plus SPECULATIVE_READ_S (a silent replica) is passed over."""
        deadline = time.monotonic() + self.timeout
        last: BaseException | None = None
        while self.position < self.end:
            if not self.replicas:
                await self._refresh_replicas()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UnavailableError(
                    f"{self.where}: could not read offsets {self.position}..{self.end} within "
                    f"{self.timeout:.0f}s from {self.replicas}; last error: {last}",
                    hint="check the broker set's replicas; the range is confirmed, so "
                    "a retried task will read the same rows",
                )
            turn = self._turn % len(self.replicas) if self.replicas else 0
            order = self.replicas[turn:] + self.replicas[:turn]
            request = bpb.PullRequest(
                topic=self.topic,
                queue=self.queue,
                offset=self.position,
                max_messages=min(self.max_messages, self.end - self.position),
                max_bytes=PULL_MAX_BYTES,
                wait_ms=int(min(PULL_WAIT_MS, remaining * 1000)),
            )
            try:
                address, msgs = await first_answer(
                    order,
                    lambda a, r=request: self._pull(a, r),
                    after_s=request.wait_ms / 1000 + SPECULATIVE_READ_S,
                    give_up=lambda exc: not isinstance(exc, _REPLICA_ERRORS),
                )
            except AllFailed as failed:
                errors = list(failed.errors.values())
                last = (
                    errors[-1]
                    if errors
                    else UnavailableError(f"broker set {self.broker_set} has no replica to read from")
                )
                log.info(
                    "%s: no replica could serve offset %d (%s); asking the controllers again",
                    self.where,
                    self.position,
                    last,
                )
                self._turn += 1
                await asyncio.sleep(0.2)
                await self._refresh_replicas()
                continue
            if msgs is None:  # below the replica's retention floor
                floor = await self._min_offset(address)
                self.position = check_start(
                    self.position, floor, self.end, fail_on_data_loss=self.fail_on_data_loss, where=self.where
                )
                continue
            self._check_contiguous(msgs, address)
            self.served_by.append((address, self.position, len(msgs)))
            self.position += len(msgs)
            return msgs
        return []

    async def _pull(self, address: str, request: bpb.PullRequest) -> list[bpb.PulledMessage] | None:
        """The messages of the range one replica holds from `request.offset`, None below its
        retention floor; a replica with nothing there yet raises (another may have it)."""
        try:
            reply = await self.client.call_broker(
                address, "Pull", request, timeout=self.client.rpc_timeout + PULL_WAIT_MS / 1000
            )
        except OffsetBelowRetentionError:
            return None
        msgs = [m for m in reply.messages if m.offset < self.end]
        if not msgs:
            # This replica's confirmed offset is still below the planned end (a slave a push
            # behind, or a new master finishing its dispatch): the data is confirmed, so
            # another replica, or this one a moment later, has it.
            raise UnavailableError(f"{address} has nothing at {request.offset} yet")
        return msgs

    def _check_contiguous(self, msgs: Sequence[bpb.PulledMessage], address: str) -> None:
        first, last = msgs[0].offset, msgs[-1].offset
        if first != self.position or last != self.position + len(msgs) - 1:
            raise TidelogError(
                f"{self.where}: {address} returned offsets {first}..{last} for a read at "
                f"{self.position} ({len(msgs)} messages); queue offsets must be contiguous"
            )


def read_range(
    controllers: str,
    topic: str,
    broker_set: str,
    queue: int,
    start: int,
    end: int,
    replicas: Sequence[str],
    *,
    fail_on_data_loss: bool = True,
    max_messages: int = 4096,
    timeout: float = 60.0,
) -> Iterator[list[bpb.PulledMessage]]:
    """Chunks of messages of `[start, end)`, in offset order; a synchronous generator for Spark's `read()`."""
    loop = asyncio.new_event_loop()
    client = AsyncClient(controllers, rpc_timeout=5.0)
    try:
        reader = RangeReader(
            client,
            topic,
            broker_set,
            queue,
            start,
            end,
            replicas,
            fail_on_data_loss=fail_on_data_loss,
            max_messages=max_messages,
            timeout=timeout,
        )
        while True:
            chunk = loop.run_until_complete(reader.next_chunk())
            if not chunk:
                break
            yield chunk
        if len(reader.served_by) > 1 and len({a for a, _, _ in reader.served_by}) > 1:
            log.info("%s [%d, %d) was served by %s", reader.where, start, end, reader.served_by)
    finally:
        loop.run_until_complete(client.close())
        loop.close()
