"""The broker's data port: produce, pull, ledger add and group commit frames (tidelog/dataport_frames.py) over TCP (TLS with a `tls:` config).

One task per connection reads frames; each request runs as its own task (a long poll does not
hold up the produce behind it) and answers with its request id, so replies may overtake each
other. The request itself goes through the same functions as the gRPC service
(`broker.service.produce_batch`, `pull_encoded`, `commit_batch`, `LedgerReplica.add_batch`): one set of checks, one error convention — a
TidelogError is answered with its code (and the master's address for NOT_MASTER), anything
else is logged and answered INTERNAL. A frame that breaks the layout closes its connection only.

Limits (docs/ARCHITECTURE.md §1.5), so that a client that sends faster than it reads — or never
reads — meets TCP back-pressure instead of filling the broker's memory:
- at most `data_max_connections` connections (broker config); more are closed as they arrive;
- a frame is at most dataport_frames.MAX_FRAME bytes, checked before its body is read;
- at most MAX_IN_FLIGHT requests of one connection run at once, and one connection holds at most
  CONNECTION_BYTES of request bodies and replies: before a body is read the reader takes a slot
  and charges the body's length, and a pull charges the most its reply may hold before it reads
  the log; both stay charged until the reply has been handed to the socket. The reader stops
  reading while either is spent;
- one reply of a connection is written at a time (a lock around write and drain), so at most one
  reply beyond the transport's high-water mark sits in its buffer; a reply its client does not
  take within WRITE_TIMEOUT_S closes the connection;
- a frame's header, once its first byte has arrived, must be whole within HEADER_TIMEOUT_S (and
  an AUTH frame's too, from the connection's start), and its body within FRAME_TIMEOUT_S plus a
  second per MIN_FRAME_RATE bytes, or the connection is closed: a client that trickles frames (a
  slowloris) would otherwise hold one of the `data_max_connections` slots for good. An idle
  connection between frames is not timed: pooled clients keep theirs open;
- all connections together hold at most `data_partial_frame_bytes` (broker config) of bodies
  still arriving: a body's claimed length is reserved from that one budget before it is read (a
  frame larger than the budget is read alone), and the body is read in chunks of READ_CHUNK, so
  memory follows what arrived, never a hostile length;
- a body longer than SPILL_BYTES (larger than any batch a client makes by default) is written,
  as it arrives, to an unlinked file in the broker's data directory and read back once whole:
  until a client has sent its whole frame, it costs the page cache and the disk, not the broker's
  memory. Sixteen clients announcing 64 MiB frames they never finish cost one budget of disk and
  a few MiB of stream buffers (docs/SECURITY.md, probe 3); frames up to SPILL_BYTES, the normal
  data path, are read in memory as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog import acl
from tidelog import dataport_frames as df
from tidelog.broker.replica import Replica
from tidelog.broker.service import checked_pull, commit_batch, produce_batch, pull_encoded
from tidelog.commitlog.crc import crc32c
from tidelog.errors import InvalidArgumentError, PermissionDeniedError, TidelogError, UnauthenticatedError
from tidelog.guard import CREDENTIALS_HINT, Guard
from tidelog.invariants import stop_if_violated
from tidelog.tasks import cancel_and_wait, within
from tidelog.tlsconfig import ServerTls, start_server
from tidelog.wire import leader_of

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256
#: Request bodies and replies one connection may hold at once: two of the largest frames, or
#: eight pulls of the largest reply (max_pull_bytes' default, 16 MiB).
CONNECTION_BYTES = 128 << 20
#: A reply its client has not taken within this long closes the connection (a client that
#: never reads would otherwise hold its requests' memory for good).
WRITE_TIMEOUT_S = 60.0
#: A frame started must be whole within this long, plus a second per MIN_FRAME_RATE body bytes.
FRAME_TIMEOUT_S = 30.0
#: A frame header (9 bytes) that does not arrive whole this long after its first byte closes the
#: connection; so does a connection under auth whose AUTH frame header is not whole this long
#: after it opened.
HEADER_TIMEOUT_S = 5.0
#: Bodies are read this much at a time, each piece as it arrives.
READ_CHUNK = 1 << 20
#: Bodies longer than this are written to a spill file while they arrive (twice the clients'
#: default batch_max_bytes: a normal produce never spills).
SPILL_BYTES = 8 << 20
#: asyncio's stream buffer limit for a connection (it pauses the socket at twice this).
STREAM_LIMIT = 64 << 10
MIN_FRAME_RATE = 1 << 20
#: How long a closing connection may spend handing its last reply to the client.
CLOSE_TIMEOUT_S = 5.0
# the fields of a pull reply besides its records (frame head and pull head), charged with them
_REPLY_FIELDS = 64
# named as the gRPC calls they stand for, so that dashboards see one Produce and one Pull
_METHODS = {
    df.OP_PRODUCE: "Produce",
    df.OP_PULL: "Pull",
    df.OP_LEDGER_ADD: "AddBatch",
    df.OP_LEDGER_ADDS: "AddBatches",
    df.OP_COMMITS: "CommitOffsets",
}
# the gRPC methods whose permission rules (tidelog/acl.py) the frames follow
PRODUCE_METHOD = "/tidelog.broker.v1.Broker/Produce"
PULL_METHOD = "/tidelog.broker.v1.Broker/Pull"
COMMITS_METHOD = "/tidelog.broker.v1.Broker/CommitOffsets"
LEDGER_ADD_METHOD = "/tidelog.ledger.Ledger/AddBatch"
AUTH_FRAME_BYTES = 16 << 10


class ByteBudget:
    """The bytes one connection may hold; takers wait in the order they came (a large one is not
    passed over for ever by small ones). A taking larger than the whole budget goes alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _fits(self, n: int) -> bool:
        return self.used == 0 or self.used + n <= self.limit

    async def take(self, n: int) -> None:
        if not self._waiting and self._fits(n):
            self.used += n
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((n, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give(n)  # granted just before the cancellation: hand it back
            else:
                self._wake()  # it may have held up the takers behind it
            raise

    def give(self, n: int) -> None:
        self.used -= n
        self._wake()

    def charge(self, n: int) -> None:
        """Charge (or, negative, give back) at once, without waiting: a reply whose true size
        differs from what was taken for it."""
        self.used += n
        if n < 0:
            self._wake()

    def _wake(self) -> None:
        while self._waiting:
            n, granted = self._waiting[0]
            if granted.done():  # its taker was cancelled
                self._waiting.popleft()
                continue
            if not self._fits(n):
                return
            self._waiting.popleft()
            self.used += n
            granted.set_result(None)


class _Held:
    """What one request holds of its connection's budget; all of it is given back at its end."""

    __slots__ = ("budget", "n")

    def __init__(self, budget: ByteBudget, n: int) -> None:
        self.budget = budget
        self.n = n

    async def more(self, n: int) -> None:
        await self.budget.take(n)
        self.n += n

    def resize(self, n: int) -> None:
        self.budget.charge(n - self.n)
        self.n = n

    def release(self) -> None:
        self.budget.give(self.n)
        self.n = 0


@dataclass
class _Link:
    """One client connection and its limits."""

    writer: asyncio.StreamWriter
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_IN_FLIGHT))
    budget: ByteBudget = field(default_factory=lambda: ByteBudget(CONNECTION_BYTES))
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: set[asyncio.Task[None]] = field(default_factory=set)
    identity: str = ""  # with auth on: who signed the connection's AUTH frame


class DataPort:
    """Serves one replica's produce and pull frames."""

    def __init__(
        self,
        replica: Replica,
        tls: ServerTls | None = None,
        guard: Guard | None = None,
        spill_dir: Path | None = None,
    ) -> None:
        self.replica = replica
        # where bodies over SPILL_BYTES wait until whole (the broker's data directory: private,
        # and on disk where the temporary directory may be memory); None: the temporary directory
        self.spill_dir = spill_dir
        # with auth on: a connection starts with an AUTH frame, and each request is checked
        # against the permission rules as the gRPC call it stands for (tidelog/guard.py)
        self.guard = guard
        self.tls = tls  # TLS for every connection (tidelog/tlsconfig.py), None: plain text
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        # bytes of frame bodies still arriving, over every connection (data_partial_frame_bytes)
        self.partial = ByteBudget(replica.cfg.data_partial_frame_bytes)
        self.address = ""
        # (method, seconds, error code or "OK") of each answered request, for the broker's metrics
        self.observe_call: Callable[[str, float, str], None] | None = None

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (port 0: any free one); returns the address bound."""
        # the stream's buffer stops reading the socket past twice this: what a connection that
        # is not being read (waiting for budget) can hold
        self._server = await start_server(self._connection, host, port, self.tls, limit=STREAM_LIMIT)
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
        for writer in list(self._writers):
            writer.transport.abort()  # a client that does not read keeps a closing transport open
        await cancel_and_wait(*tasks)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limit = self.replica.cfg.data_max_connections
        if len(self._writers) >= limit:
            log.warning(
                "%s data port: connection from %s refused: %d connections already open",
                self.replica.ctx,
                writer.get_extra_info("peername"),
                len(self._writers),
            )
            writer.close()
            return
        me = asyncio.current_task()
        if me is not None:
            self._connections.add(me)
        self._writers.add(writer)
        link = _Link(writer)
        try:
            await self._read_frames(reader, link)
        except df.FrameError as exc:
            log.warning("%s data port: closing a connection: %s", self.replica.ctx, exc.message)
        except TimeoutError:  # before OSError, of which it is a kind
            log.warning(
                "%s data port: closing a connection from %s: a frame did not arrive whole in time",
                self.replica.ctx,
                writer.get_extra_info("peername"),
            )
        except (asyncio.IncompleteReadError, OSError):
            pass  # the client went away (OSError: with TLS, a broken record is an ssl.SSLError)
        finally:
            await cancel_and_wait(*link.running)
            await _close(writer)
            self._writers.discard(writer)
            if me is not None:
                self._connections.discard(me)

    async def _authenticate(self, reader: asyncio.StreamReader, link: _Link, guard: Guard) -> bool:
        """Read the connection's AUTH frame and answer it; False (the connection closes) when it
        is not one or does not prove a user or the cluster. Bounded in time: a connection that
        never signs does not hold one of the `data_max_connections` for good."""
        head = await within(reader.readexactly(df.HEAD_SIZE), HEADER_TIMEOUT_S)
        length, op, rid = df.HEAD.unpack(head)
        size = df.body_length(length)
        err: TidelogError | None = None
        if op != df.OP_AUTH or size > AUTH_FRAME_BYTES:
            err = UnauthenticatedError("the data port needs an AUTH frame first", hint=CREDENTIALS_HINT)
        else:
            body = await self._read_body(reader, size, FRAME_TIMEOUT_S)
            try:
                link.identity = guard.identify(df.AUTH_METHOD, df.parse_auth(body), None)
            except UnauthenticatedError as exc:
                err = exc
        if err is not None:
            peer = link.writer.get_extra_info("peername")
            guard.log.note(
                f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer),
                str(err.details.get("reason") or err.code.lower()),
                f"{self.replica.ctx} data port connection: {err.message}",
            )
            await self._write(link, df.frame(df.ERROR, rid, df.error_body(err, None)))
            return False
        await self._write(link, df.frame(df.OK, rid))
        return True

    async def _read_frames(self, reader: asyncio.StreamReader, link: _Link) -> None:
        if self.guard is not None and not await self._authenticate(reader, link, self.guard):
            return
        while True:
            first = await reader.readexactly(1)  # an idle connection may wait here for good
            head = first + await within(reader.readexactly(df.HEAD_SIZE - 1), HEADER_TIMEOUT_S)
            length, op, rid = df.HEAD.unpack(head)
            size = df.body_length(length)
            # The slot and the body's bytes are taken before the body is read: while they are
            # spent the socket is not read, and the client's sends stall (TCP back-pressure).
            await link.slots.acquire()
            held = _Held(link.budget, 0)
            await held.more(size)
            if link.writer.is_closing():
                held.release()
                return  # a reply timed out meanwhile: the connection is going
            # the wait for budget above is the broker's, not the client's: the body's clock starts after it
            try:
                body = await self._read_body(reader, size, FRAME_TIMEOUT_S + size / MIN_FRAME_RATE)
            except BaseException:
                held.release()
                link.slots.release()
                raise
            task = asyncio.ensure_future(self._answer(op, rid, body, link, held))
            link.running.add(task)
            task.add_done_callback(link.running.discard)
            task.add_done_callback(lambda _t: link.slots.release())

    async def _read_body(self, reader: asyncio.StreamReader, size: int, timeout: float) -> bytes:
        """A frame body of `size` bytes, read in pieces as they arrive, its length reserved from
        the port's budget for partial frames first (the wait for it is not the client's time),
        then whole within `timeout` or TimeoutError."""
        if size == 0:
            return b""
        await self.partial.take(size)
        try:
            if size <= SPILL_BYTES:
                return await within(_read_pieces(reader, size), timeout)
            return await within(_read_spilled(reader, size, self.spill_dir), timeout)
        finally:
            self.partial.give(size)

    async def _answer(self, op: int, rid: int, body: bytes, link: _Link, held: _Held) -> None:
        started = time.monotonic()
        try:
            reply, code = await self._reply(op, rid, body, held, link.identity)
            if self.observe_call is not None:
                self.observe_call(_METHODS.get(op, "Unknown"), time.monotonic() - started, code)
            await self._write(link, reply)
        finally:
            held.release()

    async def _reply(
        self, op: int, rid: int, body: bytes, held: _Held, identity: str = ""
    ) -> tuple[list[bytes], str]:
        """The reply frame of one request, and its outcome's code for the metrics."""
        try:
            return df.frame(df.OK, rid, *await self._serve(op, body, held, identity)), "OK"
        except Exception as exc:
            err_body, code = self._error(op, exc)
            return df.frame(df.ERROR, rid, err_body), code

    def _error(self, op: int, exc: Exception) -> tuple[bytes, str]:
        """An error reply's body for what a request (or one group of a LEDGER_ADDS) raised, and
        its code: a TidelogError as it is; anything else is a bug, logged and answered INTERNAL
        (the port keeps serving, unless an invariant broke)."""
        if isinstance(exc, TidelogError):
            return df.error_body(exc, leader_of(exc)), exc.code
        stop_if_violated(exc)
        log.error("%s data port: op %d failed unexpectedly", self.replica.ctx, op, exc_info=exc)
        err = TidelogError(f"internal error: {type(exc).__name__}: {exc}")
        return df.error_body(err, None), "INTERNAL"

    async def _write(self, link: _Link, reply: list[bytes]) -> None:
        """Hand one reply to the socket: one at a time per connection, so that replies waiting
        for a slow client stay in their tasks (charged to the budget) and not in the transport."""
        writer = link.writer
        async with link.writing:
            if writer.is_closing():
                return
            writer.writelines(reply)
            try:
                await within(writer.drain(), WRITE_TIMEOUT_S)
            except TimeoutError:
                log.warning(
                    "%s data port: closing a connection whose client took no reply for %.0fs",
                    self.replica.ctx,
                    WRITE_TIMEOUT_S,
                )
                writer.transport.abort()  # close() would wait for the buffer to drain
                me = asyncio.current_task()
                for task in link.running:
                    if task is not me:
                        task.cancel()
            except OSError:
                pass  # the client went away (or its TLS broke); its reader ends the connection

    def _authorize(self, identity: str, method: str, call: Any) -> None:
        """Refuse a request the connection's signer may not make (the table as it is now, so a
        revoked grant or a deleted user takes effect on open connections too)."""
        table = self.replica.acl
        if identity != acl.SUPERUSER and identity not in table.users:
            raise UnauthenticatedError(f"user {identity} no longer exists", hint=CREDENTIALS_HINT)
        why = acl.authorize(identity, table, method, call)
        if why is not None:
            raise PermissionDeniedError(why)

    async def _serve(self, op: int, body: bytes, held: _Held, identity: str = "") -> list[Any]:
        if op == df.OP_PRODUCE:
            call = df.parse_produce(body)
            if self.guard is not None:
                self._authorize(identity, PRODUCE_METHOD, call)
            bs, first, phys = await produce_batch(
                self.replica, call.topic, call.queue, call.records, call.count, call.crc
            )
            return [df.produced(bs, first, phys)]
        if op == df.OP_PULL:
            pull = df.parse_pull(body)
            if self.guard is not None:
                self._authorize(identity, PULL_METHOD, pull)
            _, max_bytes = checked_pull(self.replica, pull)
            # Room for the largest reply is taken before the log is read: the replies of a
            # connection wait for their turn to be written without the budget's knowledge
            # otherwise. One record may exceed max_bytes (it is answered alone).
            room = max(max_bytes, self.replica.cfg.max_message_bytes) + _REPLY_FIELDS
            await held.more(room)
            data, count, offsets = await pull_encoded(self.replica, pull)
            held.resize(len(body) + len(data) + _REPLY_FIELDS)
            head = df.pulled_head(pull.offset + count, df.Offsets(*offsets), count, crc32c(data))
            return [head, data]
        if op == df.OP_LEDGER_ADD:
            return [await self._ledger_add(df.parse_ledger_add(body), identity)]
        if op == df.OP_LEDGER_ADDS:
            return df.ledger_adds_reply(await self._ledger_adds(df.parse_ledger_adds(body), identity))
        if op == df.OP_COMMITS:
            commits = df.parse_commits(body)
            if self.guard is not None:
                self._authorize(identity, COMMITS_METHOD, commits)
            await commit_batch(self.replica, commits.commits)
            return []
        raise InvalidArgumentError(f"{df.UNKNOWN_OP} {op}")

    async def _ledger_adds(self, adds: list[df.LedgerAddCall], identity: str) -> list[tuple[int, bytes]]:
        """Several ledgers' adds (LEDGER_ADDS), each answered on its own: (OK, its reply body) or
        (ERROR, its error's body). Those allowed go to the master together (one append, one fsync,
        one wait for the replicas: `LedgerReplica.add_batches`)."""
        answers: dict[int, bytes | Exception] = {}
        allowed = []
        for i, add in enumerate(adds):
            try:
                if self.guard is not None:
                    self._authorize(identity, LEDGER_ADD_METHOD, add)
                allowed.append(i)
            except TidelogError as exc:
                answers[i] = exc
        ledgers = self.replica.ledgers
        results = await ledgers.add_batches([adds[i] for i in allowed]) if allowed else []
        for i, result in zip(allowed, results, strict=True):
            answers[i] = (
                result if isinstance(result, Exception) else _added(adds[i], ledgers.broker_id, result)
            )
        return [
            (df.ERROR, self._error(df.OP_LEDGER_ADDS, a)[0]) if isinstance(a, Exception) else (df.OK, a)
            for a in (answers[i] for i in range(len(adds)))
        ]

    async def _ledger_add(self, add: df.LedgerAddCall, identity: str) -> bytes:
        """One ledger's batch of adds, checked and appended: its LEDGER_ADD reply body."""
        if self.guard is not None:
            self._authorize(identity, LEDGER_ADD_METHOD, add)
        ledgers = self.replica.ledgers
        return _added(
            add, ledgers.broker_id, await ledgers.add_batch(add.ledger_id, add.password, add.entries)
        )


def _added(add: df.LedgerAddCall, broker_id: int, replicas: list[int]) -> bytes:
    """The LEDGER_ADD reply body for an acknowledged batch."""
    return df.ledger_added(add.entries[0].entry_id, add.entries[-1].entry_id, broker_id, replicas)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection, letting its last reply reach the client for a while (a client that
    does not read would keep a closing transport, and its buffer, for good)."""
    writer.close()
    with contextlib.suppress(Exception):  # whatever it failed with, the connection is gone
        try:
            await within(writer.wait_closed(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            writer.transport.abort()


async def _read_pieces(reader: asyncio.StreamReader, size: int) -> bytes:
    """`size` bytes from `reader`, READ_CHUNK at a time: the stream's own buffer stays small (it
    stops reading the socket past its limit), where `readexactly(size)` would let it grow to
    `size` whatever has been reserved. IncompleteReadError at EOF, as readexactly."""
    pieces: list[bytes] = []
    left = size
    while left:
        piece = await reader.read(min(left, READ_CHUNK))
        if not piece:
            got = b"".join(pieces)
            raise asyncio.IncompleteReadError(got, size)
        pieces.append(piece)
        left -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _read_spilled(reader: asyncio.StreamReader, size: int, spill_dir: Path | None) -> bytes:
    """`size` bytes from `reader`, as `_read_pieces`, kept in an unlinked file (mode 0600, gone
    with its descriptor) while they arrive and read back once all are there: a frame its client
    never finishes holds no memory of the broker's. Each piece is written as it arrives (to the
    page cache: no fsync); the read back runs on a thread, off the event loop."""
    with tempfile.TemporaryFile(dir=spill_dir, buffering=0) as f:
        left = size
        while left:
            piece = await reader.read(min(left, READ_CHUNK))
            if not piece:
                raise asyncio.IncompleteReadError(b"", size)
            try:
                f.write(piece)
            except OSError as exc:  # a full disk: the frame cannot be taken, its connection closes
                log.warning("data port: spilling a %d-byte frame body to %s failed: %s", size, spill_dir, exc)
                raise
            left -= len(piece)
        data = await asyncio.to_thread(os.pread, f.fileno(), size, 0)
    if len(data) != size:  # the file is ours alone: a short read is a broken disk
        raise OSError(f"a spilled frame body read back {len(data)} of {size} bytes")
    return data
