"""Reads by position, by message id and by key, on top of the transport.

Lookups (`get_message`, `get_message_by_id`, `find_messages`) read confirmed messages from any
replica: by position and id slaves first, moving on when one is unreachable or has not confirmed
the message yet; by key the master first (its confirm offset leads) and every broker set of the
topic, merged newest first. `pull` is the one read of a queue the consumer and reader share.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from tidelog import dataport_frames as df
from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer
from tidelog.client.routing import BrokerSetRoute
from tidelog.client.transport import ConsumedMessage, Transport, consumed
from tidelog.commitlog.batch import RecordView, walk
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.keyformat import parse_message_id
from tidelog.errors import (
    ControllerBrokerMetadataNotExistError,
    CorruptRecordError,
    InvalidArgumentError,
    MessageNotFoundError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb

log = logging.getLogger(__name__)


class Lookups(Transport):
    """The transport with the reads the consumer and reader share, and the message lookups."""

    # --- reads shared by consumer and reader ---

    async def pull(
        self, route: BrokerSetRoute, topic: str, queue: int, offset: int, *, max_messages: int, wait_ms: int
    ) -> tuple[list[ConsumedMessage], int]:
        """Pull from the first replica that answers; returns (messages, next offset)."""
        call = df.PullCall(topic, queue, offset, max_messages, 0, wait_ms)

        async def pull_checked(address: str) -> tuple[list[ConsumedMessage], int]:
            # checked here, so that a reply that fails its checks is asked of another replica
            reply = await self.pull_records(address, call, self.rpc_timeout + wait_ms / 1000)
            return consumed(reply, route.name, address, offset), reply.next_offset

        try:
            # A long poll may rightly take wait_ms; a replica silent beyond that is passed over.
            _, answer = await first_answer(
                route.read_addresses(),
                pull_checked,
                after_s=wait_ms / 1000 + SPECULATIVE_READ_S,
                # A damaged record on one replica is intact on the others (and is being repaired).
                give_up=lambda exc: (
                    not isinstance(exc, UnavailableError | TopicNotFoundError | CorruptRecordError)
                ),
            )
        except AllFailed as failed:
            errors = list(failed.errors.values())
            raise (
                errors[-1]
                if errors
                else UnavailableError(f"broker set {route.name} has no reachable replica")
            ) from None
        return answer

    # --- lookups ---

    async def get_message(
        self, topic: str, queue: int, offset: int, *, broker_set: str | None = None
    ) -> ConsumedMessage:
        """The confirmed message at `offset` of queue `queue` of `topic` in `broker_set` (which may
        be left out when the topic lives in one broker set)."""
        route = await self.route(topic)
        if broker_set is None:
            if len(route.broker_sets) != 1:
                names = ", ".join(b.name for b in route.broker_sets) or "none"
                raise InvalidArgumentError(
                    f"topic {topic} has queues in several broker sets ({names}): name one",
                    hint="queues are numbered per broker set; pass broker_set=",
                )
            bs = route.broker_sets[0]
        else:
            named = route.broker_set(broker_set)
            if named is None:
                raise InvalidArgumentError(f"topic {topic} has no queues in broker set {broker_set}")
            bs = named
        if not 0 <= queue < bs.queues:
            raise InvalidArgumentError(
                f"queue {queue} does not exist (topic {topic} has {bs.queues} in {bs.name})"
            )
        if offset < 0:
            raise InvalidArgumentError(f"offset must not be negative (got {offset})")
        request = bpb.GetMessageRequest(topic=topic, queue=queue, offset=offset)
        (found,) = await self._lookup(bs.name, bs.read_addresses(), "GetMessage", request)
        return found

    async def get_message_by_id(self, message_id: str) -> ConsumedMessage:
        """The confirmed message a receipt's `message_id` names.

        The broker set's replicas are asked in turn, slaves first; which replicas the set has is
        asked of the controller once per `route_ttl` and set, not on every lookup. A lookup that
        none of the remembered replicas answers asks the controller again before it gives up:
        the set's replicas may have moved since."""
        parsed = parse_message_id(message_id)
        if parsed is None:
            raise InvalidArgumentError(
                f"{message_id!r} is not a message id", hint="an id is <broker set>:<physical offset, hex>"
            )
        name = parsed[0]
        request = bpb.GetMessageByIdRequest(message_id=message_id)
        known = self._set_addresses.get(name)
        if known is not None and time.monotonic() - known[0] < self.route_ttl:
            try:
                (found,) = await self._lookup(name, known[1], "GetMessageById", request)
                return found
            except TidelogError:
                # Asked again below with the replicas the controller knows now: those remembered
                # may be gone, or an address may now serve another set. An error that is not about
                # where the set lives comes back the same from that second lookup.
                pass
        addresses = await self._replica_addresses(name, message_id)
        (found,) = await self._lookup(name, addresses, "GetMessageById", request)
        return found

    async def _replica_addresses(self, name: str, message_id: str) -> list[str]:
        """The addresses of broker set `name`'s replicas, slaves first, from the controller."""
        try:
            reply = await self.controller.describe_broker_sets([name])
        except ControllerBrokerMetadataNotExistError:
            raise MessageNotFoundError(
                f"message id {message_id} names broker set {name}, which does not exist"
            ) from None
        members = [m for b in reply.broker_sets if b.role.broker_set == name for m in b.members if m.address]
        if not members:
            raise MessageNotFoundError(
                f"message id {message_id} names broker set {name}, which does not exist"
            )
        addresses = [m.address for m in members if not m.is_master] + [
            m.address for m in members if m.is_master
        ]
        self._set_addresses[name] = (time.monotonic(), addresses)
        return addresses

    async def find_messages(
        self,
        topic: str,
        key: str,
        *,
        begin_ts: int | None = None,
        end_ts: int | None = None,
        max_messages: int = 32,
    ) -> list[ConsumedMessage]:
        """The confirmed messages of `topic` sent with `key` and stored within [begin_ts, end_ts]
        (ms since the epoch, inclusive; None: unbounded), newest first (by store time across
        broker sets), at most `max_messages`."""
        if not key:
            raise InvalidArgumentError("a key lookup needs a non-empty key")
        if max_messages < 1 or (begin_ts or 0) < 0 or (end_ts is not None and end_ts < (begin_ts or 0)):
            raise InvalidArgumentError("max_messages must be positive and begin_ts..end_ts a range of times")
        route = await self.route(topic)
        request = bpb.FindMessagesRequest(
            topic=topic, key=key, begin_ts=begin_ts or 0, end_ts=end_ts or 0, max_messages=max_messages
        )
        per_set = await asyncio.gather(
            *(
                self._lookup(bs.name, bs.read_addresses(prefer_slaves=False), "FindMessages", request)
                for bs in route.broker_sets
            )
        )
        found = [m for ms in per_set for m in ms]
        found.sort(key=lambda m: (m.store_ts, m.phys_offset), reverse=True)
        return found[:max_messages]

    async def _lookup(
        self, name: str, addresses: Sequence[str], method: str, request: Any
    ) -> list[ConsumedMessage]:
        """A lookup answered by the first of `addresses` that has it: a replica that cannot be
        reached, has not confirmed the message yet or holds a damaged copy passes to the next."""
        last: TidelogError | None = None
        for address in addresses:
            try:
                reply = await self.call_broker(address, method, request)
                data = reply.records
                if crc32c(data) != reply.crc:
                    raise CorruptRecordError(f"{method} reply from {address}", 0, "CRC32C mismatch")
                starts = walk(data, f"{method} reply from {address}", 0)
                if len(starts) != reply.count:
                    raise CorruptRecordError(
                        f"{method} reply from {address}",
                        -1,
                        f"{len(starts)} records, {reply.count} announced",
                    )
                return [RecordView(data, pos, reply.broker_set or name) for pos in starts]
            except (UnavailableError, MessageNotFoundError, CorruptRecordError) as exc:
                last = exc
        raise last or UnavailableError(f"broker set {name} has no reachable replica")
