"""The ledger API for synchronous callers: `Ledgers(client)` and `SegmentedLog(client, name)`,
given a sync `tidelog.client.Client`.

Each class is a `SyncFacade` (client/runner.py) of its async counterpart: every coroutine method
runs on the client's event loop thread (`client.runner`) and is waited for; properties read
through. The handles `Ledgers` returns are sync too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tidelog.client.runner import SyncFacade
from tidelog.ledger.ledgers import AsyncLedgers
from tidelog.ledger.reader import AsyncReadHandle
from tidelog.ledger.seglog import AsyncSegmentedLog
from tidelog.ledger.seglog_record import START, LogEntry, Position, check_position
from tidelog.ledger.writer import AsyncWriteHandle

if TYPE_CHECKING:
    from tidelog.client import Client

__all__ = ["Ledgers", "ReadHandle", "SegmentedLog", "WriteHandle"]


class WriteHandle(SyncFacade):
    """`AsyncWriteHandle` for synchronous callers; `add_entry_async` returns a
    `concurrent.futures.Future` of the entry id."""

    _target: AsyncWriteHandle

    def add_entry_async(self, data: bytes) -> concurrent.futures.Future[int]:
        async def start() -> concurrent.futures.Future[int]:
            inner = self._target.add_entry_async(data)
            outer: concurrent.futures.Future[int] = concurrent.futures.Future()
            outer.set_running_or_notify_cancel()

            def copy(f: asyncio.Future[int]) -> None:
                if f.cancelled():
                    outer.cancel()
                elif f.exception() is not None:
                    outer.set_exception(f.exception())
                else:
                    outer.set_result(f.result())

            inner.add_done_callback(copy)
            return outer

        return self._runner.run(start())

    def __enter__(self) -> WriteHandle:
        return self


class ReadHandle(SyncFacade):
    """`AsyncReadHandle` for synchronous callers."""

    _target: AsyncReadHandle

    def __enter__(self) -> ReadHandle:
        return self


class Ledgers(SyncFacade):
    """`AsyncLedgers` for synchronous callers: `Ledgers(client, **options)` with a sync `Client`
    (options as `AsyncLedgers`: `add_timeout`, `rpc_timeout`, `max_entry_bytes`)."""

    _target: AsyncLedgers

    def __init__(self, client: Client, **options: Any) -> None:
        self.aio = AsyncLedgers(client.aio, **options)
        super().__init__(client.runner, self.aio)

    def create_ledger(self, *args: Any, **kwargs: Any) -> WriteHandle:
        return WriteHandle(self._runner, self._runner.run(self._target.create_ledger(*args, **kwargs)))

    def open_ledger(self, *args: Any, **kwargs: Any) -> ReadHandle:
        return ReadHandle(self._runner, self._runner.run(self._target.open_ledger(*args, **kwargs)))


class SegmentedLog(SyncFacade):
    """The synchronous face of `AsyncSegmentedLog`: `SegmentedLog(client, name, ...)` with a `Client`.

    Every coroutine method of the async log runs on the client's event loop and is waited for;
    its properties read through.
    """

    _target: AsyncSegmentedLog

    def __init__(self, client: Client, name: str, **options: Any) -> None:
        self.aio = AsyncSegmentedLog(client.aio, name, **options)
        super().__init__(client.runner, self.aio)

    def entries(self, from_position: Position = START, *, batch: int = 100) -> Iterator[LogEntry]:
        """Every entry confirmed now from `from_position` on (no following; use the async API to tail)."""
        position = check_position(from_position)
        while True:
            got, position = self.read_from(position, batch)
            if not got:
                return
            yield from got
