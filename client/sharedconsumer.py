"""A consumer group member in the shared or key_shared mode: any member receives any message,
each acknowledged (key_shared: a key's messages one at a time, in order).

No member owns a queue. `poll` asks the master of each broker set holding the topic for messages
of any of its queues there (SharedReceive of queue ANY_QUEUE, broker/shared.py): a received message stays invisible to the other receives for
`invisible_duration`; `ack(message)` finishes it, `nack(message)` makes it visible again at once,
`change_invisible_duration(message, seconds)` extends (or shortens) its time. A message that is
not acknowledged in time is delivered again, to any member, with its `delivery_count` one higher;
after `max_delivery_attempts` deliveries it moves to the group's dead-letter topic `%DLQ%<group>`
(created, one queue per broker set, by the first member). The state lives in the broker sets'
logs, so it survives a failover: an acknowledgement that was answered stays.

Members announce themselves like the other modes' (client/assign.py), so that a group reads a
topic in one mode at a time and `tide group describe` lists them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tidelog.client import modes as md
from tidelog.client.consumer import AsyncConsumer
from tidelog.client.receive import SharedMessage, decode_receive_reply
from tidelog.client.routing import TopicRoute
from tidelog.client.transport import ConsumedMessage
from tidelog.errors import (
    InvalidArgumentError,
    NotMasterError,
    TopicExistsError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient

log = logging.getLogger(__name__)

__all__ = ["AsyncSharedConsumer", "SharedMessage", "decode_receive_reply"]

DEFAULT_INVISIBLE_S = 30.0
DEFAULT_MAX_DELIVERY_ATTEMPTS = 16


class AsyncSharedConsumer(AsyncConsumer):
    """A member of a consumer group in the shared mode (see the module's docstring)."""

    def __init__(
        self,
        client: AsyncClient,
        group: str,
        topic: str,
        *,
        member_id: str | None = None,
        start: str = "earliest",
        session_timeout: float = 6.0,
        heartbeat_interval: float = 1.0,
        invisible_duration: float = DEFAULT_INVISIBLE_S,
        max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS,
        mode: str = md.SHARED,
    ) -> None:
        if mode not in md.PER_MESSAGE:
            raise InvalidArgumentError(f"a shared consumer's mode is one of {md.PER_MESSAGE}, not {mode!r}")
        super().__init__(
            client,
            group,
            topic,
            member_id=member_id,
            auto_commit=False,
            start=start,
            session_timeout=session_timeout,
            heartbeat_interval=heartbeat_interval,
            mode=mode,
        )
        self.invisible_ms = _invisible_ms(invisible_duration, low=1)
        if isinstance(max_delivery_attempts, bool) or not 1 <= max_delivery_attempts <= md.MAX_ATTEMPTS:
            raise InvalidArgumentError(f"max_delivery_attempts must be in [1, {md.MAX_ATTEMPTS}]")
        self.max_delivery_attempts = max_delivery_attempts
        self._dlq_ready = False
        self._next = 0  # the broker set the next poll starts with
        # long polls under way, by (broker set, ANY_QUEUE)
        self._waits: dict[tuple[str, int], asyncio.Task[list[ConsumedMessage]]] = {}
        self._buffer: list[ConsumedMessage] = []  # received, not returned by poll yet

    async def rebalance(self, force: bool = False) -> None:
        """Announce this member (no queue changes hands in this mode); create the dead-letter topic."""
        await super().rebalance(force)
        if not self._dlq_ready:
            with contextlib.suppress(TopicExistsError):
                await self.client.admin().create_topic(md.dlq_topic(self.group), queues=1)
            self._dlq_ready = True

    async def poll(self, max_messages: int = 100, timeout: float = 1.0) -> list[ConsumedMessage]:
        """Received messages (each a SharedMessage), from the broker sets in turn (each takes from
        its queues in turn); waits up to `timeout`.

        A long poll waits on every broker set at once. The waits that are still going when one answers
        are kept, not cancelled (a cancelled receive may have leased messages that would then stay
        invisible for their whole duration), and the next poll returns what they got first."""
        if not 1 <= max_messages <= md.MAX_RECEIVE:
            raise InvalidArgumentError(f"max_messages must be in [1, {md.MAX_RECEIVE}]")
        # no queue changes hands in this mode: while the controllers are away a member (even one
        # started then) receives on, and announces itself once they are back
        await self.rebalance_or_carry_on()
        out = self._harvest(max_messages)
        if out:
            return out
        route = await self.client.route(self.topic)
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {self.topic!r} has no queues")
        # one receive per broker set, over every queue of the topic there (the broker takes from
        # them in turn): a message in any queue wakes the poll at once, with one call per set
        sets = sorted({name for name, _ in route.queue_list})
        self._next = (self._next + 1) % len(sets)
        every = [(s, md.ANY_QUEUE) for s in sets[self._next :] + sets[: self._next]]
        order = [q for q in every if q not in self._waits]
        for q in order:
            self._buffer.extend(await self._receive(route, q, max_messages - len(self._buffer), 0))
            if len(self._buffer) >= max_messages:
                break
        if self._buffer or timeout <= 0:
            return self._harvest(max_messages)
        await self._long_poll(route, every, max_messages, timeout)
        return self._harvest(max_messages)

    async def _long_poll(
        self, route: TopicRoute, every: list[tuple[str, int]], max_messages: int, timeout: float
    ) -> None:
        """Wait on every set of `every` for up to `timeout`, until a wait brings messages into
        the buffer. A set with a wait going (an earlier poll's) is waited on as it is; once such
        a wait ends, empty, at that poll's deadline and maybe at once, its set is asked again,
        once, for what is left of this poll (it returned in about 10 ms where it was asked to
        wait)."""
        deadline = time.monotonic() + timeout
        asked: set[tuple[str, int]] = set()  # the sets this poll waits on itself
        while not self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for q in every:
                if q not in self._waits and q not in asked:
                    asked.add(q)
                    wait_ms = max(1, round(remaining * 1000))
                    self._waits[q] = asyncio.ensure_future(self._receive(route, q, max_messages, wait_ms))
            if not self._waits:
                return
            await asyncio.wait(self._waits.values(), timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            self._harvest(0)

    def _harvest(self, max_messages: int) -> list[ConsumedMessage]:
        """Move what finished waits got into the buffer; return up to `max_messages` of it."""
        for q, task in list(self._waits.items()):
            if task.done():
                del self._waits[q]
                if not task.cancelled() and task.exception() is None:
                    self._buffer.extend(task.result())
                elif not task.cancelled():
                    log.info("group %s: a receive from %s failed: %s", self.group, q, task.exception())
        out, self._buffer = self._buffer[:max_messages], self._buffer[max_messages:]
        return out

    async def _receive(
        self, route: TopicRoute, q: tuple[str, int], max_messages: int, wait_ms: int
    ) -> list[ConsumedMessage]:
        bs = route.broker_set(q[0])
        if bs is None or not bs.master_address:
            return []
        req = bpb.SharedReceiveRequest(
            group=self.group,
            topic=self.topic,
            queue=q[1],
            max_messages=max_messages,
            invisible_ms=self.invisible_ms,
            max_attempts=self.max_delivery_attempts,
            start_latest=self.start == "latest",
            wait_ms=wait_ms,
            key_ordered=self.mode == md.KEY_SHARED,
        )
        timeout = self.client.rpc_timeout + wait_ms / 1000
        try:
            reply = await self.client.call_broker(bs.master_address, "SharedReceive", req, timeout=timeout)
        except (NotMasterError, UnavailableError, TopicNotFoundError) as exc:
            log.info("group %s: receive from %s deferred: %s", self.group, q, exc)
            self.client.forget_route(self.topic)
            return []
        return decode_receive_reply(reply, bs.name, bs.master_address)

    async def ack(self, message: ConsumedMessage) -> None:
        """Finish `message`: it is not delivered again. RECEIPT_INVALID if its invisible time ran out
        and it went to another receive."""
        await self.ack_all([message])

    async def ack_all(self, messages: Sequence[ConsumedMessage]) -> None:
        """Finish `messages`, one request per queue."""
        for (bs, queue), receipts in _by_queue(messages).items():
            await self._call(
                bs,
                "SharedAck",
                bpb.SharedAckRequest(group=self.group, topic=self.topic, queue=queue, receipts=receipts),
            )

    async def nack(self, message: ConsumedMessage) -> None:
        """Give `message` back: the next receive (of any member) delivers it again."""
        await self.change_invisible_duration(message, 0.0)

    async def change_invisible_duration(self, message: ConsumedMessage, seconds: float) -> None:
        """`message` stays invisible `seconds` from now (its receipt changes: the message object
        carries the new one)."""
        invisible_ms = _invisible_ms(seconds, low=0)
        m = _shared(message)
        req = bpb.SharedChangeInvisibleRequest(
            group=self.group, topic=self.topic, queue=m.queue, receipts=[m.receipt], invisible_ms=invisible_ms
        )
        reply = await self._call(m.broker_set, "SharedChangeInvisible", req)
        m.receipt = reply.receipts[0]

    async def _call(self, broker_set: str, method: str, req: Any) -> Any:
        route = await self.client.route(self.topic)
        bs = route.broker_set(broker_set)
        if bs is None or not bs.master_address:
            self.client.forget_route(self.topic)
            raise UnavailableError(f"broker set {broker_set} has no master right now")
        return await self.client.call_broker(bs.master_address, method, req)

    async def commit(self) -> None:
        """Nothing to commit in the shared mode: each acknowledgement is stored when it is answered."""

    async def close(self) -> None:
        """Leave the group; messages received and not acknowledged come back after their time."""
        for task in self._waits.values():
            task.cancel()
        await asyncio.gather(*self._waits.values(), return_exceptions=True)
        self._waits.clear()
        await super().close()


def _invisible_ms(seconds: float, *, low: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds * 1000 >= low:
        raise InvalidArgumentError(f"an invisible duration must be a number of seconds, at least {low} ms")
    ms = int(seconds * 1000)
    if ms > md.MAX_INVISIBLE_MS:
        raise InvalidArgumentError("an invisible duration is at most 12 hours")
    return ms


def _shared(message: ConsumedMessage) -> SharedMessage:
    if not isinstance(message, SharedMessage):
        raise InvalidArgumentError("acknowledge messages that a shared consumer's poll returned")
    return message


def _by_queue(messages: Sequence[ConsumedMessage]) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for message in messages:
        m = _shared(message)
        out.setdefault((m.broker_set, m.queue), []).append(m.receipt)
    return out
