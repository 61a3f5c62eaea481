"""The producer: sends batched per queue, retried within a time budget.

A send retries within a total time budget on answers that say "not here / not now"
(NOT_MASTER, UNAVAILABLE, IN_SYNC_REPLICAS_NOT_ENOUGH, FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT)
and gives up with SendFailedError naming the last cause. Answers about the request itself
(invalid, too large, unknown topic after a refresh) are raised at once. A retried send whose
first attempt timed out after the broker stored it can be delivered twice: at-least-once.
It needs only the transport (client/transport.py), which is how the broker's RocketMQ endpoint
forwards sends with it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from tidelog import dataport_frames as df
from tidelog.client.batching import (
    KEYLESS_IN_FLIGHT,
    Accumulator,
    BatchLimits,
    Pending,
    message_bytes,
    split_keyless,
)
from tidelog.client.routing import TopicRoute, queue_for_key, queue_round_robin
from tidelog.client.transport import OutMessage, Receipt, Transport
from tidelog.commitlog.batch import cut_batch, encode_batch
from tidelog.errors import (
    DiskFullError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    InSyncReplicasNotEnoughError,
    InvalidArgumentError,
    MessageTooLargeError,
    NotMasterError,
    SendFailedError,
    StoreError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)

log = logging.getLogger(__name__)

_RETRY_SEND = (
    NotMasterError,
    UnavailableError,
    InSyncReplicasNotEnoughError,
    FlushSlaveTimeoutError,
    FlushDiskTimeoutError,
    DiskFullError,
    StoreError,
)


class AsyncProducer:
    """Sends messages; concurrent `send` calls are batched per queue (client/batching.py)."""

    def __init__(self, client: Transport, send_timeout: float, limits: BatchLimits | None = None) -> None:
        self.client = client
        self.send_timeout = send_timeout
        self.limits = limits or BatchLimits()
        self._rr = itertools.count()
        self._accumulators: dict[tuple[str, tuple[str, int] | None], Accumulator] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._order: dict[str, asyncio.Lock] = {}
        self._slow: dict[str, int] = {}  # sends per topic still waiting for their route, in order
        self.requests = 0  # Produce requests sent by send()/send_async() batches (for tests and benches)

    def send(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Receipt]:
        """Send one message: `await producer.send(...)` gives its receipt once acknowledged.

        The same as `send_async` (a future, not a coroutine: one frame less per message on the
        hot path); concurrent sends share requests."""
        return self.send_async(topic, body, key, tags, properties)

    def send_async(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Receipt]:
        """Queue one message; the future gives its receipt or its own error."""
        if not isinstance(body, bytes | bytearray):
            raise InvalidArgumentError("message bodies must be bytes")
        item = OutMessage(body if body.__class__ is bytes else bytes(body), key, tags, properties)
        fut: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        route = self.client.cached_route(topic) if key else None
        if not self._slow.get(topic) and (not key or (route is not None and route.queue_list)):
            # The common case needs no task: nothing to look up, and no earlier send still waiting
            # for the route (it would have to go first).
            self._append(topic, queue_for_key(route, key) if route is not None and key else None, item, fut)
        else:
            self._slow[topic] = self._slow.get(topic, 0) + 1
            self._spawn(self._enqueue(topic, item, fut))
        return fut

    async def flush(self) -> None:
        """Wait until every message queued so far has its outcome."""
        while True:
            waiting = [p.future for acc in self._accumulators.values() for p in acc.pending]
            tasks = [t for t in self._tasks if not t.done()]
            if not waiting and not tasks:
                return
            await asyncio.gather(*waiting, *tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _enqueue(self, topic: str, item: OutMessage, fut: asyncio.Future[Receipt]) -> None:
        # Sends reach their accumulator in the order they were made, even when the first ones
        # wait for the route: asyncio's lock hands itself over first come, first served.
        lock = self._order.get(topic)
        if lock is None:
            lock = self._order[topic] = asyncio.Lock()
        async with lock:
            try:
                target = None
                if item.key:
                    route = await self.client.route(topic, need="produce")
                    if not route.queue_list:
                        raise TopicNotFoundError(f"topic {topic!r} has no queues")
                    target = queue_for_key(route, item.key)
                self._append(topic, target, item, fut)
            except TidelogError as exc:
                if not fut.done():
                    fut.set_exception(exc)
            except Exception as exc:  # a bug: the caller still gets an answer, and it is loud
                if not fut.done():
                    fut.set_exception(exc)
                raise
            finally:
                self._slow[topic] -= 1

    def _append(
        self, topic: str, target: tuple[str, int] | None, item: OutMessage, fut: asyncio.Future[Receipt]
    ) -> None:
        acc = self._accumulators.get((topic, target))
        if acc is None:
            acc = self._accumulators[(topic, target)] = Accumulator(topic, target)
        acc.pending.append(Pending(item, message_bytes(item), fut))
        self._drain(acc)

    def _drain(self, acc: Accumulator) -> None:
        if acc.lingering:
            return
        if acc.in_flight == 0 and self.limits.linger_ms and len(acc.pending) < self.limits.batch_max_messages:
            acc.lingering = True

            def release() -> None:
                acc.lingering = False
                self._drain(acc)

            asyncio.get_running_loop().call_later(self.limits.linger_ms / 1000, release)
            return
        # Keyless sends promise no order: let a few requests overlap whatever max_in_flight says.
        limit = (
            self.limits.max_in_flight
            if acc.target is not None
            else max(self.limits.max_in_flight, KEYLESS_IN_FLIGHT)
        )
        while acc.pending and acc.in_flight < limit:
            batch = acc.take(self.limits)
            acc.in_flight += 1
            self._spawn(self._send_batch(acc, batch))

    async def _send_batch(self, acc: Accumulator, batch: list[Pending]) -> None:
        try:
            live = [p for p in batch if not p.future.done()]  # a caller may have given up
            if live:
                await self._deliver(acc, live)
        finally:
            acc.in_flight -= 1
            self._drain(acc)

    async def _deliver(self, acc: Accumulator, batch: list[Pending]) -> None:
        receipts: list[Receipt | None] = [None] * len(batch)
        try:
            self.requests += 1
            await self._send_group(
                acc.topic, acc.target, [p.item for p in batch], list(range(len(batch))), receipts
            )
        except MessageTooLargeError as exc:
            if len(batch) == 1:
                _fail(batch[0].future, exc)
                return
            # One of them is over the broker's limit: send them one by one, so only it fails.
            # A batch sent as several requests may have stored its first ones: those are done.
            for p, r in zip(batch, receipts, strict=True):
                if r is not None:
                    _settle([p], [r])
                else:
                    await self._deliver(acc, [p])
            return
        except TidelogError as exc:
            _fail_all(batch, exc)
            return
        except Exception as exc:  # a bug: every caller still gets an answer
            _fail_all(batch, exc)
            raise
        _settle(batch, receipts)

    async def send_batch(self, topic: str, messages: Sequence[OutMessage | bytes]) -> list[Receipt]:
        """Send messages; those with the same key keep their order, in one request per queue.
        Keyless messages promise no order: a large share of them travels as a few concurrent
        requests (`batching.split_keyless`), so that the broker sets replicate one while the
        next arrives."""
        items = cast(
            list[OutMessage], [m if m.__class__ is OutMessage else _out_message(m) for m in messages]
        )
        if not items:
            return []
        route = await self.client.route(topic, need="produce")
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
        # Keyed messages are placed once, so retries keep them on their queue; keyless ones may move.
        receipts: list[Receipt | None] = [None] * len(items)
        keyed: dict[tuple[str, int], list[int]] = {}
        keyless: list[int] = []
        for i, m in enumerate(items):
            if m.body.__class__ is not bytes and not isinstance(m.body, bytes | bytearray):
                raise InvalidArgumentError("message bodies must be bytes")
            if m.key:
                keyed.setdefault(queue_for_key(route, m.key), []).append(i)
            else:
                keyless.append(i)
        groups: list[tuple[tuple[str, int] | None, list[int]]] = [(q, idx) for q, idx in keyed.items()]
        groups += [(None, piece) for piece in split_keyless(keyless)]
        await asyncio.gather(
            *(
                self._send_group(topic, target, [items[i] for i in idx], idx, receipts)
                for target, idx in groups
            )
        )
        return [r for r in receipts if r is not None]

    async def _send_group(
        self,
        topic: str,
        target: tuple[str, int] | None,
        items: list[OutMessage],
        indexes: list[int],
        receipts: list[Receipt | None],
    ) -> None:
        deadline = time.monotonic() + self.send_timeout
        avoid: set[str] = set()
        last: TidelogError | None = None
        attempts = 0
        backoff = 0.05
        refresh = False
        while True:
            attempts += 1
            route, not_now = await self._send_route(topic, refresh)
            name = target[0] if target else ""
            try:
                if route is None:
                    raise not_now or UnavailableError("no route")
                refresh = False
                name, queue = target or queue_round_robin(route, next(self._rr), frozenset(avoid))
                if attempts > 1:  # an earlier attempt may have stored its first requests
                    items, indexes = _unsent(items, indexes, receipts)
                await self._produce(topic, route, name, queue, items, indexes, receipts, deadline)
                return
            except _RETRY_SEND as exc:
                last = exc
                refresh = True
                if target is None and name:
                    avoid.add(name)  # a keyless message may go to another broker set
            except TopicNotFoundError as exc:
                # the controller knows the topic but a broker's heartbeat may not have brought it yet
                last = exc
                refresh = True
            if time.monotonic() + backoff >= deadline:
                raise SendFailedError(
                    f"gave up sending {len(items)} message(s) to {topic} after {attempts} "
                    f"attempt(s) in {self.send_timeout:.0f}s; last error: {last}"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    async def _send_route(self, topic: str, refresh: bool) -> tuple[TopicRoute | None, TidelogError | None]:
        """The topic's route for one send attempt, or (None, the "not here / not now" answer to
        retry on). The controller not knowing the topic is an answer, not a passing state: it is
        raised at once (only a broker's TOPIC_NOT_FOUND is waited out, in `_send_group`)."""
        try:
            route = await self.client.route(topic, refresh=refresh, need="produce")
        except _RETRY_SEND as exc:
            return None, exc
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
        return route, None

    async def _produce(
        self,
        topic: str,
        route: TopicRoute,
        name: str,
        queue: int,
        items: list[OutMessage],
        indexes: list[int],
        receipts: list[Receipt | None],
        deadline: float,
    ) -> None:
        """`items` to queue `queue` of broker set `name` in one Produce request, or in several when
        they exceed what one request carries (`dataport_frames.produce_room`, MAX_PRODUCE_RECORDS); fills
        `receipts` as each is acknowledged. The requests go one after another, never together, so
        the queue keeps the items' order; a retry sends only those without a receipt."""
        bs = route.broker_set(name)
        if bs is None or not bs.master_address:
            raise UnavailableError(f"broker set {name} has no master right now")
        records = encode_batch(topic.encode(), queue, items, int(time.time() * 1000))
        parts = cut_batch(records, len(items), df.produce_room(topic), df.MAX_PRODUCE_RECORDS)
        done = 0
        for start, end, count in parts:
            part = records if count == len(items) else records[start:end]
            timeout = max(0.5, min(self.client.rpc_timeout, deadline - time.monotonic()))
            name, qoff, phys = await self.client.call_master_with(
                topic,
                bs,
                lambda address, part=part, count=count, timeout=timeout: self.client.produce_records(
                    address, topic, queue, part, count, timeout
                ),
            )
            if len(phys) != count:
                raise SendFailedError(f"the broker acknowledged {len(phys)} of {count} records")
            make = tuple.__new__
            for n, (i, p) in enumerate(zip(indexes[done : done + count], phys, strict=True)):
                receipts[i] = make(Receipt, (topic, name, queue, qoff + n, p))
            done += count


def _unsent(
    items: list[OutMessage], indexes: list[int], receipts: Sequence[Receipt | None]
) -> tuple[list[OutMessage], list[int]]:
    """The items (and their indexes) that have no receipt yet."""
    keep = [n for n, i in enumerate(indexes) if receipts[i] is None]
    return [items[n] for n in keep], [indexes[n] for n in keep]


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _fail_all(batch: Sequence[Pending], exc: BaseException) -> None:
    for p in batch:
        _fail(p.future, exc)


def _settle(batch: Sequence[Pending], receipts: Sequence[Receipt | None]) -> None:
    """Give each still-waiting sender its receipt (or an error if the reply had none for it)."""
    for p, r in zip(batch, receipts, strict=True):
        if not p.future.done():
            if r is None:
                p.future.set_exception(SendFailedError("the broker's reply had no receipt for this message"))
            else:
                p.future.set_result(r)


def _out_message(m: object) -> OutMessage:
    if isinstance(m, OutMessage):
        return m
    if not isinstance(m, bytes | bytearray):
        raise InvalidArgumentError("send_batch takes OutMessage objects or bytes")
    return OutMessage(bytes(m))
