"""The Spark source's I/O: asking the cluster for queue offsets, and reading one planned range.

Both run inside Spark's Python worker processes (never the driver's), each with an event loop
and a client of its own for the duration of the call: nothing here may outlive a task, because
Spark pickles readers and partitions and forks workers.

A range `[start, end)` was planned below the confirmed offset, so every replica of the broker
set holds the same bytes for it. `read_range` reads from the replicas in order (slaves first,
as planned), and when one fails or lags behind the planned end it continues from the same offset
on the next: the rows are identical whichever replica serves them. It never returns an offset at
or past `end`, and checks that offsets arrive contiguous, so a retried task reads the same rows.

A pull answers with the stored bytes of whole records (commitlog/FORMAT.md "Record batches"),
which stay as they are: a `Chunk` is that buffer and where each record of the range starts in
it, checked (length, magic, CRC) but not decoded; spark/rows.py turns it into Arrow columns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog.client.aio import AsyncClient
from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import RecordView, walk
from tidelog.dataframes import PullCall
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


class Chunk:
    """Records of one pull, in queue-offset order: the reply's bytes (`data`) and where each record
    of the range starts in them (`starts`; records past the range's end are left out).

    Iterating gives each record as a lazily decoded `RecordView` (tests and tools); the Spark
    source reads the buffer directly (spark/rows.py)."""

    __slots__ = ("data", "starts", "broker_set")

    def __init__(self, data: bytes, starts: list[int], broker_set: str) -> None:
        self.data = data
        self.starts = starts
        self.broker_set = broker_set

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[RecordView]:
        data, bs = self.data, self.broker_set
        return (RecordView(data, pos, bs) for pos in self.starts)

    def offset_at(self, index: int) -> int:
        """The queue offset of record `index`."""
        return int(rec.HEADER.unpack_from(self.data, self.starts[index])[7])


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

    async def next_chunk(self) -> Chunk:
        """The next records of the range (at least one), or an empty chunk once the range is done.

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
            call = PullCall(
                self.topic,
                self.queue,
                self.position,
                min(self.max_messages, self.end - self.position),
                PULL_MAX_BYTES,
                int(min(PULL_WAIT_MS, remaining * 1000)),
            )
            try:
                address, chunk = await first_answer(
                    order,
                    lambda a, c=call: self._pull(a, c),
                    after_s=call.wait_ms / 1000 + SPECULATIVE_READ_S,
                    give_up=lambda exc: not isinstance(exc, _REPLICA_ERRORS),
                )
            except AllFailed as failed:
                last = await self._all_failed(failed)
                continue
            if chunk is None:  # below the replica's retention floor
                floor = await self._min_offset(address)
                self.position = check_start(
                    self.position, floor, self.end, fail_on_data_loss=self.fail_on_data_loss, where=self.where
                )
                continue
            self._check_contiguous(chunk, address)
            self.served_by.append((address, self.position, len(chunk)))
            self.position += len(chunk)
            return chunk
        return Chunk(b"", [], self.broker_set)

    async def _all_failed(self, failed: AllFailed[Any]) -> BaseException:
        """No replica served this pull: the next pull starts at another replica, with the
        controllers' current list. Returns the last error, for the timeout's message."""
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
        return last

    async def _pull(self, address: str, call: PullCall) -> Chunk | None:
        """The records of the range one replica holds from `call.offset`, None below its
        retention floor; a replica with nothing there yet raises (another may have it), as does
        one whose reply fails its checks (length, magic, CRC, count)."""
        try:
            reply = await self.client.pull_records(
                address, call, self.client.rpc_timeout + PULL_WAIT_MS / 1000
            )
        except OffsetBelowRetentionError:
            return None
        data = reply.records
        starts = walk(data, f"pull reply from {address}", 0)
        if len(starts) != reply.count:
            raise CorruptRecordError(
                f"pull reply from {address}", -1, f"{len(starts)} records, {reply.count} announced"
            )
        if not starts:
            # This replica's confirmed offset is still below the planned end (a slave a push
            # behind, or a new master finishing its dispatch): the data is confirmed, so
            # another replica, or this one a moment later, has it.
            raise UnavailableError(f"{address} has nothing at {call.offset} yet")
        # A reply may run past the planned end (the broker does not know it): those records
        # belong to a later range, and whether they are contiguous is checked by the caller.
        del starts[max(0, self.end - call.offset) :]
        return Chunk(data, starts, self.broker_set)

    def _check_contiguous(self, chunk: Chunk, address: str) -> None:
        n = len(chunk)
        first, last = chunk.offset_at(0), chunk.offset_at(n - 1)
        if first != self.position or last != self.position + n - 1:
            raise TidelogError(
                f"{self.where}: {address} returned offsets {first}..{last} for a read at "
                f"{self.position} ({n} messages); queue offsets must be contiguous"
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
) -> Iterator[Chunk]:
    """Chunks of records of `[start, end)`, in offset order; a synchronous generator for Spark's `read()`."""
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
