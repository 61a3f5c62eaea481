"""The synchronous client: `Client` and its producer, consumer, reader and admin, each running the
asyncio implementation (client/aio.py) on the Client's one background event loop (client/runner.py).

Imported as `tidelog.client.Client` (the package loads this module when that name is first
asked for)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from typing import Any

from tidelog.client.aio import (
    AsyncAdmin,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncReader,
    ConsumedMessage,
    OutMessage,
    RebalanceListener,
    Receipt,
)
from tidelog.client.runner import LoopThread, SyncFacade

__all__ = [
    "AsyncClient",
    "Client",
    "ConsumedMessage",
    "LoopThread",
    "OutMessage",
    "RebalanceListener",
    "Receipt",
]


class Producer(SyncFacade):
    _target: AsyncProducer

    def send(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> Receipt:
        """Send one message and wait for its receipt; sends from many threads share requests."""
        return self.send_async(topic, body, key, tags, properties).result()

    def send_async(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> concurrent.futures.Future[Receipt]:
        """Queue one message from any thread; the future gives its receipt or its own error."""

        async def send() -> Receipt:
            return await self._target.send_async(topic, body, key, tags, properties)

        return self._runner.submit(send())


class Consumer(SyncFacade):
    _target: AsyncConsumer


class Reader(SyncFacade):
    _target: AsyncReader


class Admin(SyncFacade):
    _target: AsyncAdmin


class Client:
    """Synchronous client for a tidelog cluster, given its controller addresses."""

    def __init__(self, controllers: str | Iterable[str] | None = None, **options: Any) -> None:
        #: The event loop thread every call of this client runs on (`tidelog.client.runner`).
        self.runner = LoopThread()

        async def make() -> AsyncClient:
            return AsyncClient(controllers, **options)

        try:
            self.aio: AsyncClient = self.runner.run(make())
        except BaseException:
            self.runner.stop()
            raise

    def producer(self, **kw: Any) -> Producer:
        return Producer(self.runner, self.aio.producer(**kw))

    def consumer(self, group: str, topic: str, **kw: Any) -> Consumer:
        """A member of consumer group `group` reading `topic` (options: `AsyncConsumer`).

        `on_revoked(queues)` is called before this member commits and releases queues it hands
        over, `on_assigned(queues)` after it took queues; both run on the client's event loop
        thread, so they must return promptly and not call this client's blocking methods.
        """
        return Consumer(
            self.runner,
            self.aio.consumer(group, topic, **kw),
        )

    def reader(self, topic: str, queue: int, start_offset: int = 0, **kw: Any) -> Reader:
        return Reader(self.runner, self.aio.reader(topic, queue, start_offset, **kw))

    def admin(self) -> Admin:
        return Admin(self.runner, self.aio.admin())

    def get_message(
        self, topic: str, queue: int, offset: int, *, broker_set: str | None = None
    ) -> ConsumedMessage:
        """The confirmed message at `offset` of a queue (`AsyncClient.get_message`)."""
        return self.runner.run(self.aio.get_message(topic, queue, offset, broker_set=broker_set))

    def get_message_by_id(self, message_id: str) -> ConsumedMessage:
        """The confirmed message a receipt's `message_id` names."""
        return self.runner.run(self.aio.get_message_by_id(message_id))

    def find_messages(
        self,
        topic: str,
        key: str,
        *,
        begin_ts: int | None = None,
        end_ts: int | None = None,
        max_messages: int = 32,
    ) -> list[ConsumedMessage]:
        """The confirmed messages of `topic` with `key`, newest first (`AsyncClient.find_messages`)."""
        return self.runner.run(
            self.aio.find_messages(topic, key, begin_ts=begin_ts, end_ts=end_ts, max_messages=max_messages)
        )

    def close(self) -> None:
        try:
            self.runner.run(self.aio.close())
        finally:
            self.runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
