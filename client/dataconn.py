"""The client side of the data port: produce and pull frames (tidelog/dataframes.py) over TCP or TLS.

`DataPlane` keeps, per broker (by its gRPC address), where that broker's data port is — asked
once through gRPC `Status`, which names it — and one `DataConnection` to it. A connection
carries many requests at once, each with its own id; one reader task hands every reply to its
caller. A broker without a data port, or one whose data port cannot be reached, is used through
gRPC as before (`address_for` answers None for a while), so the data port is never the only way
in.

Errors keep the one convention: an error frame becomes the typed error of its code (with the
master's address for NOT_MASTER); a lost connection fails every call on it with UNAVAILABLE, which
the producer and readers already retry elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from tidelog import dataframes as df
from tidelog.errors import TidelogError, UnavailableError
from tidelog.tasks import cancel_and_wait, within
from tidelog.tlsconfig import ClientTls, open_connection
from tidelog.wire import make_error

log = logging.getLogger(__name__)

#: The metadata that signs a connection (tidelog/credentials.py's `Signer`), made afresh each time.
Signing = Callable[[], tuple[tuple[str, str], ...]]

#: How long a broker whose data port failed is used through gRPC before the data port is tried again.
RETRY_AFTER_S = 5.0


class DataConnection:
    """One TCP (or TLS) connection to a broker's data port, shared by concurrent calls."""

    def __init__(self, address: str, tls: ClientTls | None = None, auth: Signing | None = None) -> None:
        self.address = address
        self.tls = tls
        # the metadata of the AUTH frame that starts the connection (the broker's auth on); None: none
        self.auth = auth
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._ids = itertools.count(1)
        self._receiver: asyncio.Task[None] | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        self.closed = False

    async def _connect(self, timeout: float) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None:
                host, _, port = self.address.rpartition(":")
                self._reader, self._writer = await within(
                    open_connection(host, int(port), self.tls, limit=1 << 20), timeout
                )
                self._receiver = asyncio.ensure_future(self._receive(self._reader))
                if self.auth is not None:
                    # signed afresh for each connection; a refusal is the caller's typed error
                    await self._send(self._writer, df.OP_AUTH, [df.auth_request(self.auth())], timeout)
            return self._writer

    async def call(self, op: int, parts: list[bytes], timeout: float) -> bytes:
        """Send one request and wait for its reply body; a typed error for an error reply."""
        if self.closed:
            raise UnavailableError(f"the data connection to {self.address} is closed")
        try:
            writer = await self._connect(timeout)
        except (OSError, TimeoutError) as exc:
            self.closed = True
            raise UnavailableError(f"cannot reach the data port {self.address}: {exc}") from None
        return await self._send(writer, op, parts, timeout)

    async def _send(self, writer: asyncio.StreamWriter, op: int, parts: list[bytes], timeout: float) -> bytes:
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            writer.writelines(df.frame(op, rid, *parts))
            try:
                status, body = await within(fut, timeout)
            except TimeoutError:
                raise UnavailableError(
                    f"no answer from the data port {self.address} within {timeout:.1f}s"
                ) from None
        finally:
            self._pending.pop(rid, None)
        if status != df.OK:
            code, leader, message = df.parse_error(body)
            raise make_error(code, message, **({"leader": leader} if leader else {}))
        return body

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        why = "closed by the broker"
        try:
            while True:
                head = await reader.readexactly(df.HEAD_SIZE)
                length, status, rid = df.HEAD.unpack(head)
                body = await reader.readexactly(df.body_length(length))
                fut = self._pending.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result((status, body))
        # OSError: a reset, or with TLS an ssl.SSLError (such as a refused client certificate)
        except (asyncio.IncompleteReadError, OSError, df.FrameError) as exc:
            why = str(exc) or why
        finally:
            self.closed = True
            # The socket goes with the reader: nobody writes on a closed connection, and the
            # plane replaces it without closing it.
            if self._writer is not None:
                self._writer.close()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(
                        UnavailableError(f"the data connection to {self.address} was lost: {why}")
                    )

    async def close(self) -> None:
        self.closed = True
        if self._writer is not None:
            self._writer.close()
        await cancel_and_wait(self._receiver)


class DataPlane:
    """Data ports of the brokers one client talks to, found through `status(address)`."""

    def __init__(
        self,
        status: Callable[[str], Awaitable[str]],
        enabled: bool = True,
        tls: ClientTls | None = None,
        auth: Signing | None = None,
    ) -> None:
        self.auth = auth  # signs each connection's AUTH frame (DataConnection)
        self._status = status  # gRPC address -> data address ("" when the broker has none)
        self.enabled = enabled
        self.tls = tls  # the data ports speak TLS when the brokers' gRPC ports do
        self._where: dict[str, tuple[str, float]] = {}  # gRPC address -> (data address, when known)
        self._connections: dict[str, DataConnection] = {}

    async def connection(self, address: str) -> DataConnection | None:
        """The data connection for the broker at gRPC `address`, or None: use gRPC."""
        if not self.enabled:
            return None
        known = self._where.get(address)
        if known is None or (not known[0] and time.monotonic() - known[1] > RETRY_AFTER_S):
            try:
                data_address = await self._status(address)
            except TidelogError:
                data_address = ""
            known = self._where[address] = (data_address, time.monotonic())
        if not known[0]:
            return None
        conn = self._connections.get(known[0])
        if conn is None or conn.closed:
            conn = self._connections[known[0]] = DataConnection(known[0], self.tls, self.auth)
        return conn

    def failed(self, address: str) -> None:
        """The data port of the broker at `address` could not be used: ask its Status again later."""
        self._where[address] = ("", time.monotonic())

    async def close(self) -> None:
        conns = list(self._connections.values())
        self._connections.clear()
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
