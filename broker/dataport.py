"""The broker's data port: produce and pull frames (tidelog/dataframes.py) over plain TCP.

One task per connection reads frames; each request runs as its own task (a long poll does not
hold up the produce behind it) and answers with its request id, so replies may overtake each
other. The request itself goes through the same functions as the gRPC service
(`broker.service.produce_batch`, `pull_encoded`): one set of checks, one error convention — a
TidelogError is answered with its code (and the master's address for NOT_MASTER), anything
else is logged and answered INTERNAL. A frame that breaks the layout closes its connection only.

Limits: at most MAX_IN_FLIGHT requests of one connection run at once (the reader stops reading
until one finishes, so a client cannot queue unbounded work); a frame is at most
dataframes.MAX_FRAME bytes, checked before its body is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from crc32c import crc32c

from tidelog import dataframes as df
from tidelog.broker.replica import Replica
from tidelog.broker.service import produce_batch, pull_encoded
from tidelog.errors import InvalidArgumentError, TidelogError
from tidelog.invariants import stop_if_violated
from tidelog.tasks import cancel_and_wait
from tidelog.wire import leader_of

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
# named as the gRPC calls they stand for, so that dashboards see one Produce and one Pull
_METHODS = {df.OP_PRODUCE: "Produce", df.OP_PULL: "Pull"}


class DataPort:
    """Serves one replica's produce and pull frames."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.address = ""
        # (method, seconds, error code or "OK") of each answered request, for the broker's metrics
        self.observe_call: Callable[[str, float, str], None] | None = None

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (port 0: any free one); returns the address bound."""
        self._server = await asyncio.start_server(self._connection, host, port, limit=1 << 20)
        bound = self._server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        return self.address

    async def close(self) -> None:
        """Stop listening and end every connection: closing its transport ends its reader with
        EOF, so each connection task finishes on its own (a cancelled one would be reported by
        asyncio's server as an error)."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._connections)
        for writer in list(self._writers):
            writer.close()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        await cancel_and_wait(*tasks)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._connections.add(me)
        self._writers.add(writer)
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()
        try:
            await self._read_frames(reader, writer, slots, running)
        except df.FrameError as exc:
            log.warning("%s data port: closing a connection: %s", self.replica.ctx, exc.message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            await cancel_and_wait(*running)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._writers.discard(writer)
            if me is not None:
                self._connections.discard(me)

    async def _read_frames(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        slots: asyncio.Semaphore,
        running: set[asyncio.Task[None]],
    ) -> None:
        while True:
            head = await reader.readexactly(df.HEAD_SIZE)
            length, op, rid = df.HEAD.unpack(head)
            body = await reader.readexactly(df.body_length(length))
            await slots.acquire()
            task = asyncio.ensure_future(self._answer(op, rid, body, writer))
            running.add(task)
            task.add_done_callback(running.discard)
            task.add_done_callback(lambda _t: slots.release())

    async def _answer(self, op: int, rid: int, body: bytes, writer: asyncio.StreamWriter) -> None:
        started = time.monotonic()
        code = "OK"
        try:
            parts = await self._serve(op, body)
            writer.writelines(df.frame(df.OK, rid, *parts))
        except TidelogError as err:
            code = err.code
            writer.writelines(df.frame(df.ERROR, rid, df.error_body(err, leader_of(err))))
        except Exception as exc:  # a bug: log it, answer, keep serving (unless an invariant broke)
            stop_if_violated(exc)
            log.exception("%s data port: op %d failed unexpectedly", self.replica.ctx, op)
            err = TidelogError(f"internal error: {type(exc).__name__}: {exc}")
            code = "INTERNAL"
            writer.writelines(df.frame(df.ERROR, rid, df.error_body(err, None)))
        if self.observe_call is not None:
            self.observe_call(_METHODS.get(op, "Unknown"), time.monotonic() - started, code)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _serve(self, op: int, body: bytes) -> list[Any]:
        if op == df.OP_PRODUCE:
            call = df.parse_produce(body)
            bs, first, phys = await produce_batch(
                self.replica, call.topic, call.queue, call.records, call.count, call.crc
            )
            return [df.produced(bs, first, phys)]
        if op == df.OP_PULL:
            pull = df.parse_pull(body)
            data, count, offsets = await pull_encoded(self.replica, pull)
            head = df.pulled_head(pull.offset + count, df.Offsets(*offsets), count, crc32c(data))
            return [head, data]
        raise InvalidArgumentError(f"unknown data-port operation {op}")
