"""Adds of several ledgers bound for one broker, sent in one data-port frame.

Each writer batches its own ledger's adds (ledger/writer.py); a client writing many ledgers on
one broker set would still send one LEDGER_ADD frame per ledger per round trip. Here the
batches handed to `AddCoalescer.send` during one turn of the event loop for the same broker
leave together, as one LEDGER_ADDS frame (tidelog/dataport_frames.py), at the end of that turn: no
add waits for a timer, and a batch alone goes as the LEDGER_ADD it was. The broker checks,
appends and answers each ledger's batch on its own, so each caller gets its own reply or its
own typed error (a fence of one ledger leaves the others' adds alone); a failure of the frame
itself (the connection lost, no answer in time) is every caller's.

A frame takes at most `dataport_frames.MAX_LEDGER_GROUPS` batches and stays within
`dataport_frames.MAX_FRAME`; more go in further frames. A caller that gives up (its timeout, or
a call to a master the controller has replaced) before its frame leaves is not sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from tidelog import dataport_frames as df
from tidelog.client.batching import take_batch
from tidelog.client.dataconn import reply_error
from tidelog.errors import InvalidArgumentError, UnavailableError
from tidelog.tasks import within

__all__ = ["AddCoalescer", "frames_of"]

log = logging.getLogger(__name__)


#: `over_data_port`: a request's reply body from the broker at an address, None without a data port.
Send = Callable[[str, int, list[bytes], float], Awaitable["bytes | bytearray | None"]]

# Room for a frame's header and group count beside its groups.
_FRAME_ROOM = df.MAX_FRAME - 64


class _Queued(NamedTuple):
    parts: list[bytes]
    size: int  # the batch's bytes in a LEDGER_ADDS frame, its length field included
    timeout: float
    future: asyncio.Future[bytes | bytearray | None]


def frames_of(
    sizes: Sequence[int], max_groups: int = df.MAX_LEDGER_GROUPS, room: int = _FRAME_ROOM
) -> list[int]:
    """How many of the queued batches (their sizes, in order) each frame takes: as many as fit
    in `room` bytes and `max_groups`, at least one (a batch over the room goes alone)."""
    counts: list[int] = []
    i = 0
    while i < len(sizes):
        # a frame takes at most max_groups: only those are looked at, not the whole tail again
        counts.append(take_batch(sizes[i : i + max_groups], max_groups, room))
        i += counts[-1]
    return counts


class AddCoalescer:
    """Ledger add batches to brokers' data ports, those of one loop turn to one broker together."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queued: dict[str, list[_Queued]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.frames = 0  # LEDGER_ADDS frames sent (several ledgers' batches in each)
        self.grouped = 0  # batches that went in them
        # brokers that answered a LEDGER_ADDS frame as an unknown operation (older than it): their
        # batches go one LEDGER_ADD each, as they did before it
        self._one_by_one: set[str] = set()

    async def send(self, address: str, parts: list[bytes], timeout: float) -> bytes | bytearray | None:
        """One ledger's add batch (`dataport_frames.ledger_add_request`) to the broker at `address`:
        its LEDGER_ADD reply body, a typed error, or None when the broker has no data port."""
        loop = asyncio.get_running_loop()
        queued = self._queued.get(address)
        if queued is None:
            queued = self._queued[address] = []
            loop.call_soon(self._flush, address)
        fut: asyncio.Future[bytes | bytearray | None] = loop.create_future()
        queued.append(_Queued(parts, df.GROUP_HEAD + sum(len(p) for p in parts), timeout, fut))
        try:
            return await within(fut, timeout)
        except TimeoutError:
            raise UnavailableError(
                f"no answer from the data port of {address} within {timeout:.1f}s"
            ) from None

    def _flush(self, address: str) -> None:
        live = [q for q in self._queued.pop(address, ()) if not q.future.done()]
        at = 0
        # a broker older than LEDGER_ADDS takes one batch per frame: the same cut, one group at most
        max_groups = 1 if address in self._one_by_one else df.MAX_LEDGER_GROUPS
        for n in frames_of([q.size for q in live], max_groups):
            task = asyncio.ensure_future(self._send_frame(address, live[at : at + n]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            at += n

    async def _send_frame(self, address: str, group: list[_Queued]) -> None:
        try:
            outcomes = await self._exchange(address, group)
        except Exception as exc:  # the frame failed: every caller's
            for q in group:
                if not q.future.done():
                    q.future.set_exception(exc)
            return
        except BaseException:  # cancelled (the client is closing): so are its callers
            for q in group:
                q.future.cancel()
            raise
        for q, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, Exception):
                if not q.future.done():
                    q.future.set_exception(outcome)
            else:
                _settle(q.future, outcome)

    async def _exchange(
        self, address: str, group: list[_Queued]
    ) -> Sequence[bytes | bytearray | None | Exception]:
        """Each batch's LEDGER_ADD reply body or error, the batches sent in one frame; a body of
        None: the broker has no data port."""
        timeout = max(q.timeout for q in group)
        if len(group) == 1:
            return [await self._send(address, df.OP_LEDGER_ADD, group[0].parts, timeout)]
        self.frames += 1
        self.grouped += len(group)
        parts = df.ledger_adds_request([q.parts for q in group])
        try:
            body = await self._send(address, df.OP_LEDGER_ADDS, parts, timeout)
        except InvalidArgumentError as exc:
            if df.UNKNOWN_OP not in exc.message:
                raise
            # A broker from before LEDGER_ADDS (a rolling upgrade): nothing of the frame was
            # stored; send each batch as its own LEDGER_ADD, now and from now on.
            log.info("data port %s takes no LEDGER_ADDS frames: sending each ledger's adds alone", address)
            self._one_by_one.add(address)
            sends = (self._send(address, df.OP_LEDGER_ADD, q.parts, timeout) for q in group)
            alone = await asyncio.gather(*sends, return_exceptions=True)
            for r in alone:
                if isinstance(r, BaseException) and not isinstance(r, Exception):
                    raise r from None  # cancelled: the client is closing
            return alone  # type: ignore[return-value]  # (BaseExceptions raised just above)
        if body is None:
            return [None] * len(group)
        return [
            b if status == df.OK else reply_error(b)
            for status, b in df.parse_ledger_adds_reply(body, len(group))
        ]


def _settle(fut: asyncio.Future[bytes | bytearray | None], body: bytes | bytearray | None) -> None:
    if not fut.done():
        fut.set_result(body)
