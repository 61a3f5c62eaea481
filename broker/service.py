"""The broker's gRPC service: validates each request, calls the replica, maps typed errors.

Every method goes through `tidelog.wire.rpc`, so a TidelogError becomes a gRPC status with the
error code in trailing metadata, and an unexpected exception is logged and answered INTERNAL
without stopping the broker.

The controllers' route lookups a broker also answers are in broker/lookups.py.

Lookups (GetMessage, GetMessageById, FindMessages) answer with stored record bytes like an encoded
pull, and only confirmed user messages; a message id must name this broker's set. A
FindMessages reply holds at most `max_pull_messages` records and `max_pull_bytes` of them.

A Pull's limits are clamped, not refused: `max_bytes` to `max_pull_bytes` and `max_messages` to
`max_pull_messages` (broker config), so no request can make the broker build a reply larger
than the gRPC message limit or hold more than that in memory for one call. A client that asks
for more simply gets a shorter reply and pulls again from `next_offset`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc

from tidelog.broker.lookups import ClusterViewCache
from tidelog.broker.replica import Replica
from tidelog.broker.shared import Key as SharedKey
from tidelog.client.modes import ANY_QUEUE
from tidelog.commitlog import QueueOffsets
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.keyformat import parse_message_id
from tidelog.commitlog.log import NO_END
from tidelog.commitlog.lookups import MAX_KEY_BYTES
from tidelog.dataport_frames import MAX_COMMITS, MAX_PRODUCE_RECORDS, Commit, PullCall
from tidelog.errors import InvalidArgumentError
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc
from tidelog.wire import check_request, non_empty, non_negative, rpc

MAX_BATCH = MAX_PRODUCE_RECORDS  # records per produce; clients cut larger batches (dataport_frames.py)
DEFAULT_PULL_BYTES = 4 << 20
DEFAULT_PULL_MESSAGES = 32
MAX_WAIT_MS = 60_000


def pull_limits(
    max_messages: int, max_bytes: int, *, max_pull_messages: int, max_pull_bytes: int
) -> tuple[int, int]:
    """The (messages, bytes) one Pull reply may hold: the request's (0 = default), clamped to the broker's maximum."""
    messages = min(max_messages or DEFAULT_PULL_MESSAGES, max_pull_messages)
    size = min(max_bytes or DEFAULT_PULL_BYTES, max_pull_bytes)
    return messages, size


def _commit_of(c: pb.CommitOffsetRequest | Commit) -> tuple[str, str, int, int]:
    """(group, topic, queue, offset) of one commit, its fields checked (CommitOffset, CommitOffsets
    and the data port's COMMITS)."""
    non_empty("group", c.group)
    non_empty("topic", c.topic)
    non_negative("queue", c.queue)
    non_negative("offset", c.offset)
    return c.group, c.topic, c.queue, c.offset


async def commit_batch(replica: Replica, commits: Sequence[pb.CommitOffsetRequest | Commit]) -> None:
    """A call of group commits, checked and written in one write, all or none (both transports:
    gRPC's `CommitOffsets` and the data port's COMMITS)."""
    check_request(1 <= len(commits) <= MAX_COMMITS, f"commit 1 to {MAX_COMMITS} offsets in one call")
    await replica.commit_offsets([_commit_of(c) for c in commits])


def _shared_key(
    request: pb.SharedReceiveRequest
    | pb.SharedAckRequest
    | pb.SharedChangeInvisibleRequest
    | pb.SharedDeadLetterRequest,
) -> SharedKey:
    non_empty("group", request.group)
    non_empty("topic", request.topic)
    non_negative("queue", request.queue)
    return (request.group, request.topic, request.queue)


def _offsets(o: QueueOffsets) -> pb.QueueOffsets:
    return pb.QueueOffsets(min=o.min, max=o.max, confirmed=o.confirmed)


def _lookup_reply(broker_set: str, records: list[bytes], more: bool = False) -> pb.LookupReply:
    data = b"".join(records)
    return pb.LookupReply(
        broker_set=broker_set, records=data, count=len(records), crc=crc32c(data), more=more
    )


async def produce_batch(
    replica: Replica, topic: str, queue: int, records: bytes | memoryview, count: int, crc: int
) -> tuple[str, int, list[int]]:
    """A producer's record batch, checked and written (both transports: gRPC and the data port);
    returns (broker set, first queue offset, physical offset of each record)."""
    non_empty("topic", topic)
    non_negative("queue", queue)
    check_request(0 < count <= MAX_BATCH, f"a record batch carries 1..{MAX_BATCH} records")
    check_request(crc32c(records) == crc, "the record batch's CRC32C does not match its bytes")
    first, phys = await replica.produce_encoded(topic, queue, bytearray(records), count)
    if replica.observe_traffic is not None:
        replica.observe_traffic("produced", topic, count, len(records))
    return replica.cfg.broker_set, first, phys


def checked_pull(replica: Replica, call: PullCall) -> tuple[int, int]:
    """Validate a pull; returns its (messages, bytes) limits, clamped to the broker's."""
    non_empty("topic", call.topic)
    non_negative("queue", call.queue)
    non_negative("offset", call.offset)
    check_request(0 <= call.wait_ms <= MAX_WAIT_MS, f"wait_ms must be 0..{MAX_WAIT_MS}")
    check_request(call.max_messages >= 0 and call.max_bytes >= 0, "limits must not be negative")
    cfg = replica.cfg
    return pull_limits(
        call.max_messages,
        call.max_bytes,
        max_pull_messages=cfg.max_pull_messages,
        max_pull_bytes=cfg.max_pull_bytes,
    )


async def pull_encoded(replica: Replica, call: PullCall) -> tuple[bytes, int, QueueOffsets]:
    """A pull answered with stored record bytes (both transports): (records, count, offsets)."""
    max_messages, max_bytes = checked_pull(replica, call)
    data, count, offsets = await replica.pull_encoded(
        call.topic, call.queue, call.offset, max_messages, max_bytes, call.wait_ms
    )
    if count and replica.observe_traffic is not None:
        replica.observe_traffic("pulled", call.topic, count, len(data))
    return data, count, offsets


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, replica: Replica, lookups: ClusterViewCache | None = None) -> None:
        self.replica = replica
        self.lookups = lookups

    @rpc
    async def Produce(self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext) -> pb.ProduceReply:
        non_empty("topic", request.topic)
        check_request(
            0 < len(request.messages) <= MAX_BATCH, f"a produce request carries 1..{MAX_BATCH} messages"
        )
        items: list[Any] = []
        append = items.append
        for m in request.messages:
            has = m.HasField
            queue = m.queue if has("queue") else None
            if queue is not None:
                non_negative("queue", queue)
            append(
                (
                    m.body,
                    m.key if has("key") else None,
                    m.tags if has("tags") else None,
                    dict(m.properties) if m.properties else None,
                    queue,
                )
            )
        placed = await self.replica.produce(request.topic, items)
        if self.replica.observe_traffic is not None:
            self.replica.observe_traffic("produced", request.topic, len(placed), request.ByteSize())
        bs = self.replica.cfg.broker_set
        reply = pb.ProduceReply(broker_set=bs)
        add = reply.results.add
        for p, q in placed:
            add(
                queue=q,
                queue_offset=p.queue_offset,
                phys_offset=p.phys_offset,
                message_id=f"{bs}:{p.phys_offset:x}",
            )
        return reply

    @rpc
    async def ProduceBatch(
        self, request: pb.ProduceBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceBatchReply:
        bs, first, phys = await produce_batch(
            self.replica, request.topic, request.queue, request.records, request.count, request.crc
        )
        return pb.ProduceBatchReply(
            broker_set=bs, queue=request.queue, first_queue_offset=first, phys_offsets=phys
        )

    @rpc
    async def Pull(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> pb.PullReply:
        call = PullCall(
            request.topic,
            request.queue,
            request.offset,
            request.max_messages,
            request.max_bytes,
            request.wait_ms,
        )
        if request.encoded:
            data, count, offsets = await pull_encoded(self.replica, call)
            return pb.PullReply(
                records=data,
                count=count,
                crc=crc32c(data),
                next_offset=request.offset + count,
                offsets=_offsets(offsets),
            )
        max_messages, max_bytes = checked_pull(self.replica, call)
        msgs, offsets = await self.replica.pull(
            request.topic, request.queue, request.offset, max_messages, max_bytes, request.wait_ms
        )
        reply = pb.PullReply(
            next_offset=msgs[-1].queue_offset + 1 if msgs else request.offset, offsets=_offsets(offsets)
        )
        add = reply.messages.add
        for m in msgs:  # filled in place: building each message with keywords costs several times more
            pm = add(
                topic=m.topic,
                queue=m.queue_id,
                offset=m.queue_offset,
                body=m.body,
                born_ts=m.born_ts,
                store_ts=m.store_ts,
                phys_offset=m.phys_offset,
            )
            if m.key is not None:
                pm.key = m.key
            if m.tags is not None:
                pm.tags = m.tags
            if m.properties:
                pm.properties.update(m.properties)
        return reply

    @rpc
    async def GetMessage(
        self, request: pb.GetMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.LookupReply:
        non_empty("topic", request.topic)
        non_negative("queue", request.queue)
        non_negative("offset", request.offset)
        data = self.replica.get_message(request.topic, request.queue, request.offset)
        return _lookup_reply(self.replica.cfg.broker_set, [data])

    @rpc
    async def GetMessageById(
        self, request: pb.GetMessageByIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.LookupReply:
        parsed = parse_message_id(request.message_id)
        if parsed is None:
            raise InvalidArgumentError(
                f"{request.message_id[:300]!r} is not a message id (<broker set>:<physical offset, hex>)"
            )
        broker_set, phys = parsed
        own = self.replica.cfg.broker_set
        check_request(
            broker_set == own, f"message id {request.message_id} names broker set {broker_set}, not {own}"
        )
        return _lookup_reply(own, [self.replica.get_message_at(phys)])

    @rpc
    async def FindMessages(
        self, request: pb.FindMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.LookupReply:
        non_empty("topic", request.topic)
        check_request(bool(request.key), "key must not be empty")
        check_request(len(request.key.encode()) <= MAX_KEY_BYTES, f"key is longer than {MAX_KEY_BYTES} bytes")
        non_negative("begin_ts", request.begin_ts)
        non_negative("end_ts", request.end_ts)
        end = request.end_ts or NO_END
        check_request(request.begin_ts <= end, "begin_ts must not be after end_ts")
        check_request(request.max_messages >= 0, "max_messages must not be negative")
        cfg = self.replica.cfg
        found, more = await self.replica.find_messages(
            request.topic,
            request.key,
            request.begin_ts,
            end,
            min(request.max_messages or DEFAULT_PULL_MESSAGES, cfg.max_pull_messages),
            cfg.max_pull_bytes,
        )
        return _lookup_reply(cfg.broker_set, found, more)

    @rpc
    async def GetOffsets(
        self, request: pb.GetOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetOffsetsReply:
        non_empty("topic", request.topic)
        non_negative("queue", request.queue)
        return pb.GetOffsetsReply(offsets=_offsets(self.replica.queue_offsets(request.topic, request.queue)))

    @rpc
    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetReply:
        await self.replica.commit_offset(*_commit_of(request))
        return pb.CommitOffsetReply()

    @rpc
    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetsReply:
        await commit_batch(self.replica, request.commits)
        return pb.CommitOffsetsReply()

    @rpc
    async def FetchOffset(
        self, request: pb.FetchOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchOffsetReply:
        non_empty("group", request.group)
        non_empty("topic", request.topic)
        non_negative("queue", request.queue)
        offset = self.replica.fetch_offset(request.group, request.topic, request.queue)
        return pb.FetchOffsetReply(found=offset is not None, offset=offset or 0)

    @rpc
    async def SharedReceive(
        self, request: pb.SharedReceiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.SharedReceiveReply:
        check_request(0 <= request.wait_ms <= MAX_WAIT_MS, f"wait_ms must be in [0, {MAX_WAIT_MS}]")
        options: dict[str, Any] = dict(
            max_messages=request.max_messages,
            invisible_ms=request.invisible_ms,
            max_attempts=request.max_attempts,
            start_latest=request.start_latest,
            wait_ms=request.wait_ms,
            key_ordered=request.key_ordered,
        )
        if request.queue == ANY_QUEUE:
            # every queue of the topic here (RocketMQ's pop of queue id -1: broker/rocketmq.py)
            non_empty("group", request.group)
            non_empty("topic", request.topic)
            got = await self.replica.shared.receive_any(request.group, request.topic, **options)
        else:
            got = await self.replica.shared.receive(_shared_key(request), **options)
        data, count, receipts, attempts = got
        return pb.SharedReceiveReply(
            records=data, count=count, crc=crc32c(data), receipts=receipts, attempts=attempts
        )

    @rpc
    async def SharedAck(
        self, request: pb.SharedAckRequest, context: grpc.aio.ServicerContext
    ) -> pb.SharedAckReply:
        await self.replica.shared.ack(_shared_key(request), list(request.receipts))
        return pb.SharedAckReply()

    @rpc
    async def SharedChangeInvisible(
        self, request: pb.SharedChangeInvisibleRequest, context: grpc.aio.ServicerContext
    ) -> pb.SharedChangeInvisibleReply:
        receipts = await self.replica.shared.change_invisible(
            _shared_key(request), list(request.receipts), request.invisible_ms
        )
        return pb.SharedChangeInvisibleReply(receipts=receipts)

    @rpc
    async def SharedDeadLetter(
        self, request: pb.SharedDeadLetterRequest, context: grpc.aio.ServicerContext
    ) -> pb.SharedDeadLetterReply:
        await self.replica.shared.dead_letter(_shared_key(request), request.receipt)
        return pb.SharedDeadLetterReply()

    @rpc
    async def SearchOffset(
        self, request: pb.SearchOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchOffsetReply:
        non_empty("topic", request.topic)
        non_negative("queue", request.queue)
        non_negative("timestamp_ms", request.timestamp_ms)
        offset, offsets = self.replica.offset_for_time(request.topic, request.queue, request.timestamp_ms)
        return pb.SearchOffsetReply(offset=offset, offsets=_offsets(offsets))

    @rpc
    async def ListGroupOffsets(
        self, request: pb.ListGroupOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGroupOffsetsReply:
        non_empty("group", request.group)
        found = self.replica.group_offsets(request.group, request.topic or None)
        return pb.ListGroupOffsetsReply(
            offsets=[pb.GroupOffset(topic=t, queue=q, offset=o) for t, q, o in found]
        )

    @rpc
    async def DeleteGroupOffsets(
        self, request: pb.DeleteGroupOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteGroupOffsetsReply:
        non_empty("group", request.group)
        deleted = await self.replica.delete_group_offsets(request.group, request.topic or None)
        return pb.DeleteGroupOffsetsReply(
            deleted=[pb.GroupOffset(topic=t, queue=q, offset=o) for t, q, o in deleted]
        )

    @rpc
    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:
        s = self.replica.status()
        return pb.StatusReply(
            broker_set=s["broker_set"],
            broker_id=s["broker_id"],
            role=s["role"],
            master_epoch=s["master_epoch"],
            last_epoch=s["last_epoch"],
            min_offset=s["min_offset"],
            max_offset=s["max_offset"],
            confirm_offset=s["confirm_offset"],
            flushed_offset=s["flushed_offset"],
            sync_state_set=s["sync_state_set"],
            sync_state_set_epoch=s["sync_state_set_epoch"],
            master_address=s["master_address"],
            pending_sync_state_set=s["pending_sync_state_set"],
            replicas=[pb.ReplicaProgress(**r) for r in s["replicas"]],
            data_address=s["data_address"],
            rocketmq_address=s["rocketmq_address"],
            controller_heard_ms_ago=self.lookups.age_ms(time.monotonic()) if self.lookups else -1,
        )
