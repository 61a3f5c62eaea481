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
which stay as they are: a `Chunk` (spark/records.py) is that buffer, checked (length, magic,
CRC), with the header fields of each record of the range; spark/rows.py turns it into Arrow
columns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog import loops
from tidelog.client.aio import READ_AHEAD, AsyncClient, ReadAhead, reply_records
from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.dataport_frames import PullCall
from tidelog.errors import (
    CorruptRecordError,
    OffsetBelowRetentionError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb
from tidelog.spark.plan import (
    Connection,
    QueueState,
    Range,
    ReadOptions,
    check_start,
    offsets_to_json,
    queue_name,
    resolve_ranges,
    split_ranges,
)
from tidelog.spark.records import NO_FIELDS, Chunk, scan
from tidelog.tasks import within

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that say "this replica, not now": the next replica, or a later try, may answer.
_REPLICA_ERRORS = (UnavailableError, TopicNotFoundError, CorruptRecordError)  # another replica has it
PULL_MAX_BYTES = 8 << 20
PULL_WAIT_MS = 1000


def run(
    coro_fn: Callable[[AsyncClient], Awaitable[T]],
    controllers: str,
    *,
    rpc_timeout: float = 5.0,
    connection: Connection = Connection(),
) -> T:
    """Run `coro_fn(client)` on a fresh event loop with a client that is closed afterwards
    (TLS and credentials as `connection` says, else as the environment does)."""

    async def main() -> T:
        client = AsyncClient(controllers, rpc_timeout=rpc_timeout, **connection.client_options())
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return loops.run(main())


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


def batch_plan(view: ClusterView, o: ReadOptions, what: str) -> list[Range]:
    """A batch read's ranges, split into one per Spark partition: every end at or below its
    queue's confirmed offset (plan.resolve_ranges). Logged, as `what` of the topics."""
    ranges = resolve_ranges(view.states, o.starting, o.ending, fail_on_data_loss=o.fail_on_data_loss)
    parts = split_ranges(ranges, o.max_offsets_per_partition)
    log.info(
        "tidelog %s of %s: %d offsets in %d partitions (%s)",
        what,
        ",".join(o.topics),
        sum(len(r) for r in ranges),
        len(parts),
        offsets_to_json({r.qid: r.end for r in ranges}),
    )
    return parts


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
        read_ahead: int = READ_AHEAD,
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
        # Pulls started ahead (as the client's reader does), each answering (replica, chunk): a
        # pull of a confirmed range brings exactly `max_messages` records unless its bytes run
        # out first, so the next one's offset is known.
        self._ahead: ReadAhead[tuple[str, Chunk | None]] = ReadAhead(client, read_ahead)

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
        within the pull's wait plus SPECULATIVE_READ_S (a silent replica) is passed over. After
        each chunk up to `read_ahead` pulls of the chunks that follow are under way, so that the
        replica reads and sends them while the caller turns this one into rows."""
        chunk = await self._ahead_chunk()
        if chunk is None:
            chunk = await self._hedged_chunk()
        self._pull_ahead()
        return chunk

    def _pull_ahead(self) -> None:
        if not self.replicas or self.position >= self.end:
            return
        address = self.replicas[self._turn % len(self.replicas)]

        async def pull(start: int) -> tuple[str, Chunk | None]:
            count = min(self.max_messages, self.end - start)
            return address, await self._pull(
                address, PullCall(self.topic, self.queue, start, count, PULL_MAX_BYTES, 0)
            )

        self._ahead.fill(self.position, self.max_messages, self.end, pull)

    async def _ahead_chunk(self) -> Chunk | None:
        """The first read-ahead's chunk when it starts at the position and brought records in time;
        else None, and every read-ahead is dropped (the hedged pull decides, with its retries)."""
        ahead = await self._ahead.take(self.position)
        if ahead is None:
            return None
        got: tuple[str, Chunk | None] | None = None
        with contextlib.suppress(TidelogError, TimeoutError):
            # a replica gone silent is passed over as the hedged pull would pass it over
            got = await within(asyncio.shield(ahead), PULL_WAIT_MS / 1000 + SPECULATIVE_READ_S)
        address, chunk = got if got is not None else ("", None)
        if not chunk:  # failed, late, below retention, or empty
            await self._ahead.drop(ahead)
            return None
        self._check_contiguous(chunk, address)
        self.served_by.append((address, self.position, len(chunk)))
        self.position += len(chunk)
        return chunk

    async def close(self) -> None:
        """Drop the pulls started ahead (a reader given up before its range ends)."""
        await self._ahead.drop()

    async def _hedged_chunk(self) -> Chunk:
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
        return Chunk(b"", NO_FIELDS, self.broker_set)

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
        data = reply_records(reply, address, call.offset)
        fields = scan(data, f"pull reply from {address}", verify_crc=False)
        if len(fields.starts) != reply.count:
            raise CorruptRecordError(
                f"pull reply from {address}", -1, f"{len(fields.starts)} records, {reply.count} announced"
            )
        if not fields.starts:
            # This replica's confirmed offset is still below the planned end (a slave a push
            # behind, or a new master finishing its dispatch): the data is confirmed, so
            # another replica, or this one a moment later, has it.
            raise UnavailableError(f"{address} has nothing at {call.offset} yet")
        # A reply may run past the planned end (the broker does not know it): those records
        # belong to a later range. Whether the rest are contiguous is checked by the caller.
        keep = self.end - call.offset
        return Chunk(data, fields.head(keep) if len(fields.starts) > keep else fields, self.broker_set)

    def _check_contiguous(self, chunk: Chunk, address: str) -> None:
        offsets = chunk.fields.offsets
        if tuple(offsets) != tuple(range(self.position, self.position + len(offsets))):
            raise TidelogError(
                f"{self.where}: {address} returned offsets {offsets[0]}..{offsets[-1]} for a read at "
                f"{self.position} ({len(offsets)} messages); queue offsets must be contiguous"
            )


class _LoopThread:
    """An event loop running in a thread of its own, so that a pull is under way while the
    caller's thread turns the previous chunk into rows and Spark sends them on."""

    def __init__(self) -> None:
        self.loop = loops.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tidelog-range-read", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


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
    connection: Connection = Connection(),
) -> Iterator[Chunk]:
    """Chunks of records of `[start, end)`, in offset order; a synchronous generator for Spark's
    `read()`. The next chunk is pulled while the caller handles the current one (one pull ahead:
    at most two chunks are held)."""
    runner = _LoopThread()
    client = AsyncClient(controllers, rpc_timeout=5.0, **connection.client_options())
    pending: concurrent.futures.Future[Chunk] | None = None
    reader: RangeReader | None = None
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
        pending = runner.submit(reader.next_chunk())
        while chunk := pending.result():
            pending = runner.submit(reader.next_chunk())
            yield chunk
        if len(reader.served_by) > 1 and len({a for a, _, _ in reader.served_by}) > 1:
            log.info("%s [%d, %d) was served by %s", reader.where, start, end, reader.served_by)
    finally:
        if pending is not None and not pending.done():
            # The caller stopped early (a limit, a failed task): the pull under way is not wanted.
            pending.cancel()
            with contextlib.suppress(concurrent.futures.CancelledError, Exception):
                pending.result()
        if reader is not None:
            runner.submit(reader.close()).result()
        runner.submit(client.close()).result()
        runner.stop()
