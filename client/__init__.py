"""The Python client: producer, consumer group member, reader and admin.

    from tidelog.client import Client
    with Client("127.0.0.1:9701") as client:
        client.admin().create_topic("orders", queues=4)
        receipt = client.producer().send("orders", b"hello", key="customer-1")
        with client.consumer(group="billing", topic="orders") as consumer:
            for message in consumer.poll(max_messages=100, timeout=1.0):
                ...
            consumer.commit()

The synchronous API runs the asyncio implementation (`tidelog.client.aio`) on one background
event loop per Client: every method of the sync objects is the async method, run there. Code
that already runs an event loop uses `tidelog.client.aio.AsyncClient` directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tidelog.client.aio import (
    AsyncAdmin,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    AsyncReader,
    ConsumedMessage,
    OutMessage,
    Receipt,
)

if TYPE_CHECKING:
    from tidelog.ledger.client import Ledgers

T = TypeVar("T")

__all__ = ["AsyncClient", "Client", "ConsumedMessage", "OutMessage", "Receipt"]


class _Loop:
    """One event loop on a daemon thread; `run` executes a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tidelog-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("synchronous tidelog calls cannot run on the client's own loop")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class _Sync:
    """A synchronous face of an async object: coroutine methods run on the client's loop."""

    def __init__(self, loop: _Loop, target: Any) -> None:
        self._loop = loop
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if asyncio.iscoroutinefunction(attr):
            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return self._loop.run(attr(*args, **kwargs))
            return call
        return attr

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        close = getattr(self._target, "close", None)
        if close is not None:
            self._loop.run(close())


class Producer(_Sync):
    _target: AsyncProducer

    def send(self, topic: str, body: bytes, key: str | None = None, tags: str | None = None,
             properties: Mapping[str, str] | None = None) -> Receipt:
        """Send one message and wait for its receipt; sends from many threads share requests."""
        return self.send_async(topic, body, key, tags, properties).result()

    def send_async(self, topic: str, body: bytes, key: str | None = None, tags: str | None = None,
                   properties: Mapping[str, str] | None = None) -> concurrent.futures.Future[Receipt]:
        """Queue one message from any thread; the future gives its receipt or its own error."""
        async def send() -> Receipt:
            return await self._target.send_async(topic, body, key, tags, properties)

        return asyncio.run_coroutine_threadsafe(send(), self._loop.loop)


class Consumer(_Sync):
    _target: AsyncConsumer


class Reader(_Sync):
    _target: AsyncReader


class Admin(_Sync):
    _target: AsyncAdmin


class Client:
    """Synchronous client for a tidelog cluster, given its controller addresses."""

    def __init__(self, controllers: str | Iterable[str] | None = None, **options: Any) -> None:
        self._loop = _Loop()

        async def make() -> AsyncClient:
            return AsyncClient(controllers, **options)

        try:
            self.aio: AsyncClient = self._loop.run(make())
        except BaseException:
            self._loop.stop()
            raise

    def producer(self, **kw: Any) -> Producer:
        return Producer(self._loop, self.aio.producer(**kw))

    def consumer(self, group: str, topic: str, **kw: Any) -> Consumer:
        return Consumer(self._loop, self.aio.consumer(group, topic, **kw))

    def reader(self, topic: str, queue: int, start_offset: int = 0, **kw: Any) -> Reader:
        return Reader(self._loop, self.aio.reader(topic, queue, start_offset, **kw))

    def admin(self) -> Admin:
        return Admin(self._loop, self.aio.admin())

    def ledgers(self, **kw: Any) -> Ledgers:
        """The ledger API, blocking (`tidelog.ledger.client.Ledgers`)."""
        from tidelog.ledger.client import Ledgers  # the ledger package builds on this one

        return Ledgers(self._loop, self.aio.ledgers(**kw))

    def close(self) -> None:
        try:
            self._loop.run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
