"""The single-queue reader, and the pulls a reader keeps under way ahead of it (`ReadAhead`).

Reads go to any replica of the queue's broker set (slaves first) and never see past its
confirm offset; a failed replica is skipped for the next one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tidelog.client.routing import BrokerSetRoute
from tidelog.client.transport import ConsumedMessage
from tidelog.errors import (
    InvalidArgumentError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

log = logging.getLogger(__name__)

T = TypeVar("T")


#: Pulls a reader keeps under way after a full batch: the broker reads the next while the client
#: checks and decodes the last (three measured faster than one or two on 2 cores; bench/RESULTS.md).
READ_AHEAD = 3


class ReadAhead(Generic[T]):
    """Pulls started ahead of a reader at the offsets where full batches would start, in order
    (the consumer API's reader and the Spark source's range reader). A pull is used only when it
    starts exactly at the reader's position; otherwise every pull ahead is dropped."""

    def __init__(self, client: AsyncClient, depth: int = READ_AHEAD) -> None:
        self.client = client
        self.depth = depth
        self._pulls: collections.deque[tuple[int, asyncio.Future[T]]] = collections.deque()

    def fill(self, position: int, batch: int, end: int | None, pull: Callable[[int], Awaitable[T]]) -> None:
        """Start `pull(offset)` for the batches after the last one under way (from `position`
        when none is), up to `depth` of them and below `end` (None: no end)."""
        start = self._pulls[-1][0] + batch if self._pulls else position
        while len(self._pulls) < self.depth and (end is None or start < end):
            self._pulls.append((start, self.client.background(pull(start))))
            start += batch

    async def take(self, position: int) -> asyncio.Future[T] | None:
        """The first pull, when it starts at `position`; else None, and every pull is dropped."""
        if not self._pulls:
            return None
        if self._pulls[0][0] != position:
            await self.drop()
            return None
        return self._pulls.popleft()[1]

    async def drop(self, *also: asyncio.Future[Any]) -> None:
        """Cancel every pull ahead (and `also`), and wait until they have ended."""
        pulls = [f for _, f in self._pulls]
        self._pulls.clear()
        await cancel_and_wait(*also, *pulls)


class AsyncReader:
    """Reads one queue from an offset, without a group."""

    def __init__(
        self, client: AsyncClient, topic: str, queue: int, start_offset: int, broker_set: str | None
    ) -> None:
        self.client = client
        self.topic = topic
        self.queue = queue
        self.position = start_offset
        self.broker_set = broker_set
        # pulls started ahead of the caller
        self._ahead: ReadAhead[tuple[list[ConsumedMessage], int]] = ReadAhead(client)

    async def _route(self, refresh: bool = False) -> BrokerSetRoute:
        route = await self.client.route(self.topic, refresh=refresh, need="consume")
        names = [b.name for b in route.broker_sets if b.queues > self.queue]
        if self.broker_set is None:
            if len(route.broker_sets) > 1:
                raise InvalidArgumentError(f"topic {self.topic} spans broker sets {names}; name one")
            if not names:
                raise InvalidArgumentError(f"queue {self.queue} does not exist in topic {self.topic}")
            self.broker_set = names[0]
        bs = route.broker_set(self.broker_set)
        if bs is None:
            raise TopicNotFoundError(f"topic {self.topic} has no queues in broker set {self.broker_set}")
        return bs

    async def read(self, max_messages: int = 100, timeout: float = 0.0) -> list[ConsumedMessage]:
        """The next messages from the position (at most `max_messages`), waiting up to `timeout`
        for some. A full batch keeps `READ_AHEAD` pulls under way (read-ahead): the first from the
        new position, the next from where a full batch would end, so that the broker reads them
        while the caller works on this one. A read-ahead that does not start exactly at the
        position (an earlier batch came back short) is dropped, never used."""
        msgs = await self._ahead_batch()
        if msgs is None:
            msgs, nxt = await self._pull(self.position, max_messages, int(timeout * 1000))
            self.position = nxt
        if len(msgs) >= max_messages:
            self._ahead.fill(self.position, max_messages, None, lambda at: self._pull(at, max_messages, 0))
        return msgs

    async def _ahead_batch(self) -> list[ConsumedMessage] | None:
        """The first read-ahead's messages, if it starts at the position and brought any; else None
        (and every read-ahead is dropped: pull as usual)."""
        ahead = await self._ahead.take(self.position)
        if ahead is None:
            return None
        try:
            msgs, nxt = await ahead
        except TidelogError:
            msgs = []  # the pull made now will meet (and raise) whatever it was, or succeed
        if not msgs:
            await self._ahead.drop()
            return None
        self.position = nxt
        return msgs

    async def _pull(self, offset: int, max_messages: int, wait_ms: int) -> tuple[list[ConsumedMessage], int]:
        bs = await self._route()
        try:
            return await self.client.pull(
                bs, self.topic, self.queue, offset, max_messages=max_messages, wait_ms=wait_ms
            )
        except UnavailableError:
            bs = await self._route(refresh=True)
            return await self.client.pull(
                bs, self.topic, self.queue, offset, max_messages=max_messages, wait_ms=wait_ms
            )

    async def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[ConsumedMessage]:
        return await self.read(max_messages, timeout)

    async def close(self) -> None:
        await self._ahead.drop()
