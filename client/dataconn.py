"""The client side of the data port: produce and pull frames (tidelog/dataport_frames.py) over TCP or TLS.

`DataPlane` keeps, per broker (by its gRPC address), where that broker's data port is — asked
once through gRPC `Status`, which names it — and one `DataConnection` to it. A connection
carries many requests at once, each with its own id; one reader task hands every reply to its
caller. A broker without a data port, or one whose data port cannot be reached, is used through
gRPC as before (`address_for` answers None for a while), so the data port is never the only way
in.

Replies are read by a buffered protocol (`ReplyReader`): small frames through one scratch buffer,
and the body of a large one (a pull's megabytes) straight into a buffer of its own size, so the
bytes are copied once from the socket, not through a stream's buffer and out again.

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
from typing import cast

from tidelog import dataport_frames as df
from tidelog.errors import TidelogError, UnavailableError
from tidelog.tasks import within
from tidelog.tlsconfig import ClientTls, create_connection
from tidelog.wire import make_error

log = logging.getLogger(__name__)

#: The metadata that signs a connection (tidelog/credentials.py's `Signer`), made afresh each time.
Signing = Callable[[], tuple[tuple[str, str], ...]]

#: How long a broker whose data port failed is used through gRPC before the data port is tried again.
RETRY_AFTER_S = 5.0
#: Frames up to this size are read through the scratch buffer; a larger body gets a buffer of its own.
SCRATCH_BYTES = 64 << 10
LARGE_BODY = 16 << 10


class ReplyReader(asyncio.BufferedProtocol):
    """Reads reply frames off the socket and hands each to `on_frame(status, rid, body)`; a broken
    frame or a lost connection ends in `on_lost(why)`, once."""

    def __init__(
        self,
        on_frame: Callable[[int, int, bytes | bytearray], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self.on_frame = on_frame
        self.on_lost = on_lost  # its owner closes the transport
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0  # unparsed bytes are scratch[_start:_end]
        self._end = 0
        # a large body being read into a buffer of its own: the buffer, the bytes in it so far,
        # and the frame's (status, rid)
        self._body: bytearray | None = None
        self._got = 0
        self._head: tuple[int, int] = (0, 0)
        self._ended = False

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._got :]
        if self._end == len(self._scratch):  # a small frame's start is at the end: move it down
            kept = self._end - self._start
            self._scratch[:kept] = self._scratch[self._start : self._end]
            self._start, self._end = 0, kept
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._ended:
            return  # a broken frame ended it: the rest is not read
        if self._body is not None:
            self._got += nbytes
            if self._got == len(self._body):
                body, self._body = self._body, None
                self.on_frame(*self._head, body)
            return
        self._end += nbytes
        try:
            self._parse()
        except df.FrameError as exc:
            self._lose(str(exc))

    def _parse(self) -> None:
        scratch = self._scratch
        while self._end - self._start >= df.HEAD_SIZE:
            length, status, rid = df.HEAD.unpack_from(scratch, self._start)
            size = df.body_length(length)
            first = self._start + df.HEAD_SIZE
            have = self._end - first
            if have >= size:
                self._start = first + size
                self.on_frame(status, rid, bytes(scratch[first : self._start]))
            elif size > LARGE_BODY:
                body = bytearray(size)
                body[:have] = scratch[first : self._end]
                self._body, self._got, self._head = body, have, (status, rid)
                self._start = self._end = 0
                return
            else:
                break  # a small frame not whole yet: the rest comes into the scratch buffer
        if self._start == self._end:
            self._start = self._end = 0

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost says why

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(str(exc) if exc else "closed by the broker")

    def _lose(self, why: str) -> None:
        if not self._ended:
            self._ended = True
            self.on_lost(why)


def reply_error(body: bytes | bytearray) -> TidelogError:
    """The typed error an error reply's body names (with the master's address for NOT_MASTER)."""
    code, leader, message = df.parse_error(body)
    return make_error(code, message, **({"leader": leader} if leader else {}))


class DataConnection:
    """One TCP (or TLS) connection to a broker's data port, shared by concurrent calls."""

    def __init__(self, address: str, tls: ClientTls | None = None, auth: Signing | None = None) -> None:
        self.address = address
        self.tls = tls
        # the metadata of the AUTH frame that starts the connection (the broker's auth on); None: none
        self.auth = auth
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[tuple[int, bytes | bytearray]]] = {}
        self._ids = itertools.count(1)
        self._connecting: asyncio.Lock = asyncio.Lock()
        self.closed = False

    async def _connect(self, timeout: float) -> asyncio.Transport:
        async with self._connecting:
            if self._transport is None:
                host, _, port = self.address.rpartition(":")
                transport, _ = await within(
                    create_connection(
                        lambda: ReplyReader(self._on_frame, self._on_lost), host, int(port), self.tls
                    ),
                    timeout,
                )
                if self.closed:  # lost already (a reset during the handshake)
                    transport.close()
                    raise OSError("the connection was lost as it opened")
                self._transport = cast(asyncio.Transport, transport)
                if self.auth is not None:
                    # signed afresh for each connection; a refusal is the caller's typed error
                    await self._send(self._transport, df.OP_AUTH, [df.auth_request(self.auth())], timeout)
            return self._transport

    async def call(self, op: int, parts: list[bytes], timeout: float) -> bytes | bytearray:
        """Send one request and wait for its reply body; a typed error for an error reply."""
        if self.closed:
            raise UnavailableError(f"the data connection to {self.address} is closed")
        try:
            # once connected, no lock to take: the connection is made once and then only read
            transport = self._transport or await self._connect(timeout)
        except (OSError, TimeoutError) as exc:
            self.closed = True
            raise UnavailableError(f"cannot reach the data port {self.address}: {exc}") from None
        return await self._send(transport, op, parts, timeout)

    async def _send(
        self, transport: asyncio.Transport, op: int, parts: list[bytes], timeout: float
    ) -> bytes | bytearray:
        if self.closed:
            raise UnavailableError(f"the data connection to {self.address} is closed")
        rid = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[tuple[int, bytes | bytearray]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            transport.writelines(df.frame(op, rid, *parts))
            try:
                status, body = await within(fut, timeout)
            except TimeoutError:
                raise UnavailableError(
                    f"no answer from the data port {self.address} within {timeout:.1f}s"
                ) from None
        finally:
            self._pending.pop(rid, None)
        if status != df.OK:
            raise reply_error(body)
        return body

    def _on_frame(self, status: int, rid: int, body: bytes | bytearray) -> None:
        fut = self._pending.get(rid)
        if fut is not None and not fut.done():
            fut.set_result((status, body))

    def _on_lost(self, why: str) -> None:
        # a reset, or with TLS an ssl.SSLError (such as a refused client certificate), or a
        # frame that breaks the layout: every call on the connection fails, and the plane
        # replaces it
        self.closed = True
        if self._transport is not None:
            self._transport.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(UnavailableError(f"the data connection to {self.address} was lost: {why}"))

    async def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


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
