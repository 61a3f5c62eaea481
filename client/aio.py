"""The asyncio client: producer, consumer group member, single-queue reader and admin.

This is the one implementation; `tidelog.client.Client` runs it on a background event loop
for synchronous callers.

- Routes come from the controller and are cached per topic; any error that says the route may
  be stale (NOT_MASTER, unreachable broker, no master) refreshes it, and so does age.
- A send retries within a total time budget on answers that say "not here / not now"
  (NOT_MASTER, UNAVAILABLE, IN_SYNC_REPLICAS_NOT_ENOUGH, FLUSH_SLAVE_TIMEOUT, FLUSH_DISK_TIMEOUT)
  and gives up with SendFailedError naming the last cause. Answers about the request itself
  (invalid, too large, unknown topic after a refresh) are raised at once. A retried send whose
  first attempt timed out after the broker stored it can be delivered twice: at-least-once.
- Reads go to any replica of the queue's broker set (slaves first) and never see past its
  confirm offset; a failed replica is skipped for the next one.
- Lookups (`get_message`, `get_message_by_id`, `find_messages`) read confirmed messages from any
  replica: by position and id slaves first, moving on when one is unreachable or has not
  confirmed the message yet; by key the master first (its confirm offset leads) and every broker
  set of the topic, merged newest first.
- Channels are cached per address and reused; there is no thread per message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, NoReturn, TypeVar

import grpc
from crc32c import crc32c

from tidelog import dataframes as df
from tidelog.client import assign as asg
from tidelog.client import groupadmin as ga
from tidelog.client import handover as ho
from tidelog.client import modes as md
from tidelog.client import resetplan as rp
from tidelog.client.batching import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_IN_FLIGHT,
    KEYLESS_IN_FLIGHT,
    Accumulator,
    BatchLimits,
    Pending,
    message_bytes,
    split_keyless,
)
from tidelog.client.controllers import CONTROLLERS_ENV, QUORUM_TIMEOUT_S, ControllerClient
from tidelog.client.dataconn import DataPlane
from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer, until_superseded
from tidelog.client.routing import BrokerSetRoute, Replica, TopicRoute, queue_for_key, queue_round_robin
from tidelog.commitlog.batch import RecordView, cut_batch, encode_batch, walk
from tidelog.commitlog.keyformat import parse_message_id
from tidelog.credentials import from_env as credentials_from_env
from tidelog.credentials import signer
from tidelog.errors import (
    ControllerBrokerMetadataNotExistError,
    ControllerUnavailableError,
    CorruptRecordError,
    DiskFullError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    InSyncReplicasNotEnoughError,
    InvalidArgumentError,
    MessageNotFoundError,
    MessageTooLargeError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    NotMasterError,
    PermissionDeniedError,
    SendFailedError,
    StoreError,
    SubscriptionConflictError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
    by_code,
)
from tidelog.invariants import present
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import broker_pb2_grpc as bpb_grpc
from tidelog.proto import controller_pb2 as cpb
from tidelog.proto import ledger_pb2_grpc as lpb_grpc
from tidelog.tasks import cancel_and_wait
from tidelog.tlsconfig import ClientTls, aio_channel, client_from_env
from tidelog.wire import CHANNEL_OPTIONS, error_from_rpc

log = logging.getLogger(__name__)

#: Topics per CreateTopics call (the controller takes up to 1,000 in one Raft commit).
MAX_TOPICS_PER_CALL = 1000
T = TypeVar("T")


# While the controllers are away, a group member tries a rebalance this often (each try may wait
# for the controller client's quorum timeout).
AWAY_RETRY_S = 3.0

_RETRY_SEND = (
    NotMasterError,
    UnavailableError,
    InSyncReplicasNotEnoughError,
    FlushSlaveTimeoutError,
    FlushDiskTimeoutError,
    DiskFullError,
    StoreError,
)


class Receipt(NamedTuple):
    """Where an acknowledged message was stored (a tuple: one is made per message sent)."""

    topic: str
    broker_set: str
    queue: int
    queue_offset: int
    phys_offset: int

    @property
    def message_id(self) -> str:
        """ "<broker set>:<physical offset, hex>": unique in the cluster, and where to read it."""
        return f"{self.broker_set}:{self.phys_offset:x}"


#: A message read back: topic, broker_set, queue, offset, key, tags, body, properties, born_ts,
#: store_ts, phys_offset; decoded from the pulled record bytes when read (commitlog/batch.py).
ConsumedMessage = RecordView


class OutMessage(NamedTuple):
    """One message of `send_batch` (a tuple: `send` makes one per message)."""

    body: bytes
    key: str | None = None
    tags: str | None = None
    properties: Mapping[str, str] | None = None


def reply_records(reply: Any, address: str, offset: int) -> bytes | memoryview:
    """The records of an encoded pull reply from `offset`, checked end to end against the reply's
    CRC32C (the broker checked each record's own CRC when it read it from its log). A reply whose
    next offset is not `offset` + its count (a broker that answers otherwise, as an older one
    might) is refused: the reader would move past messages it never got."""
    if reply.next_offset != offset + reply.count:
        raise CorruptRecordError(
            f"pull reply from {address}",
            offset,
            f"{reply.count} records from {offset} but next offset {reply.next_offset}",
        )
    data: bytes | memoryview = reply.records
    if crc32c(data) != reply.crc:
        raise CorruptRecordError(
            f"pull reply from {address}", 0, "the reply's CRC32C does not match its bytes"
        )
    return data


def _consumed(reply: Any, broker_set: str, address: str, offset: int) -> list[ConsumedMessage]:
    """The records of an encoded pull from `offset`, as lazily decoded messages."""
    # bytes: the messages' bodies and keys are handed to the application as bytes and str
    data = bytes(reply_records(reply, address, offset))
    starts = walk(data, f"pull reply from {address}", 0, verify_crc=False)
    if len(starts) != reply.count:
        raise CorruptRecordError(
            f"pull from {address}", -1, f"{len(starts)} records, {reply.count} announced"
        )
    return [RecordView(data, pos, broker_set) for pos in starts]


class AsyncClient:
    """Entry point: `AsyncClient("host:port,host:port")`: controllers' or brokers' gRPC addresses
    (a broker answers route lookups itself and points at the controllers for the rest)."""

    def __init__(
        self,
        controllers: str | Iterable[str] | None = None,
        *,
        send_timeout: float = 30.0,
        rpc_timeout: float = 10.0,
        route_ttl: float = 30.0,
        data_port: bool = True,
        ca_file: str | os.PathLike[str] | None = None,
        tls: ClientTls | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        member_secret: str | None = None,
    ) -> None:
        controllers = controllers or os.environ.get(CONTROLLERS_ENV, "")
        # TLS to controllers, brokers and data ports alike: `tls` (a cluster member's own, e.g. the
        # RocketMQ endpoint's), else `ca_file`, else $TIDE_CA_FILE
        self.tls = tls if tls is not None else client_from_env(ca_file)
        # Every call is signed (tidelog/credentials.py): with the user's credentials (the arguments,
        # else $TIDE_ACCESS_KEY/$TIDE_SECRET_KEY), or inside a broker (`member_secret`: the RocketMQ
        # endpoint) with the cluster secret.
        self.credentials = None if member_secret else credentials_from_env(access_key, secret_key)
        self.signer = signer(self.credentials, member_secret)
        self.controller = ControllerClient(
            controllers,
            rpc_timeout=3.0,
            total_timeout=min(send_timeout, 15.0),
            tls=self.tls,
            credentials=self.credentials,
            secret=member_secret,
            member=bool(member_secret),
            # an application learns within seconds that the controllers are away (§7.5)
            quorum_timeout=QUORUM_TIMEOUT_S,
        )
        self.send_timeout = send_timeout
        self.rpc_timeout = rpc_timeout
        self.route_ttl = route_ttl
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        # broker set -> (when asked, its replicas' addresses, slaves first): lookups by message id
        self._set_addresses: dict[str, tuple[float, list[str]]] = {}
        self._channels: dict[str, tuple[grpc.aio.Channel, bpb_grpc.BrokerStub]] = {}
        self._ledger_stubs: dict[str, Any] = {}
        # produce and pull go through each broker's data port when it has one (client/dataconn.py)
        sign = self.signer
        self.data = DataPlane(
            self.data_address,
            enabled=data_port,
            tls=self.tls,
            auth=(lambda: sign.extra(df.AUTH_METHOD, None)) if sign is not None else None,
        )
        self._background: set[asyncio.Future[Any]] = set()

    # --- plumbing ---

    async def data_address(self, address: str) -> str:
        """Where the broker at gRPC `address` serves its data port ("" when it has none), as its
        Status says."""
        reply = await self.call_broker(
            address, "Status", bpb.StatusRequest(), timeout=min(self.rpc_timeout, 3.0)
        )
        return str(reply.data_address)

    async def over_data_port(
        self, address: str, op: int, parts: list[bytes], timeout: float
    ) -> bytes | bytearray | None:
        """A request's reply body through the data port of the broker at `address`, or None when
        it has none (the caller uses gRPC). A data port that fails is left alone for a while."""
        conn = await self.data.connection(address)
        if conn is None:
            return None
        try:
            return await conn.call(op, parts, timeout)
        except UnavailableError:
            self.data.failed(address)
            raise

    async def produce_records(
        self, address: str, topic: str, queue: int, records: bytes, count: int, timeout: float
    ) -> tuple[str, int, Sequence[int]]:
        """One record batch to the broker at `address`: (broker set, first queue offset, physical
        offsets), through its data port when it has one, else gRPC."""
        crc = crc32c(records)
        parts = [df.produce_request(topic, queue, count, crc), records]
        body = await self.over_data_port(address, df.OP_PRODUCE, parts, timeout)
        if body is not None:
            return df.parse_produced(body)
        req = bpb.ProduceBatchRequest(topic=topic, queue=queue, records=records, count=count, crc=crc)
        reply = await self.call_broker(address, "ProduceBatch", req, timeout=timeout)
        return reply.broker_set, reply.first_queue_offset, reply.phys_offsets

    async def pull_records(self, address: str, call: df.PullCall, timeout: float) -> Any:
        """One encoded pull from the broker at `address` (a reply with records, count, next_offset
        and offsets), through its data port when it has one, else gRPC."""
        body = await self.over_data_port(address, df.OP_PULL, [df.pull_request(call)], timeout)
        if body is not None:
            return df.parse_pulled(body)
        request = bpb.PullRequest(
            topic=call.topic,
            queue=call.queue,
            offset=call.offset,
            max_messages=call.max_messages,
            max_bytes=call.max_bytes,
            wait_ms=call.wait_ms,
            encoded=True,
        )
        return await self.call_broker(address, "Pull", request, timeout=timeout)

    def _stub(self, address: str) -> bpb_grpc.BrokerStub:
        entry = self._channels.get(address)
        if entry is None:
            channel = aio_channel(
                address, self.tls, CHANNEL_OPTIONS, interceptors=[self.signer] if self.signer else ()
            )
            entry = self._channels[address] = (channel, bpb_grpc.BrokerStub(channel))
        return entry[1]

    def ledger_stub(self, address: str) -> Any:
        """A stub of the Ledger service, which every broker serves beside Broker on one channel."""
        stub = self._ledger_stubs.get(address)
        if stub is None:
            self._stub(address)  # opens (or reuses) the channel to this broker
            stub = self._ledger_stubs[address] = lpb_grpc.LedgerStub(self._channels[address][0])
        return stub

    async def call_broker(self, address: str, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return await getattr(self._stub(address), method)(request, timeout=timeout or self.rpc_timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def call_master(
        self, topic: str, bs: BrokerSetRoute, method: str, request: Any, timeout: float
    ) -> Any:
        """Call the master of broker set `bs`, giving up as soon as the controllers name a newer one
        (`until_superseded`)."""
        return await self.call_master_with(
            topic, bs, lambda address: self.call_broker(address, method, request, timeout=timeout)
        )

    async def call_master_with(
        self, topic: str, bs: BrokerSetRoute, call: Callable[[str], Awaitable[T]]
    ) -> T:
        """`call(master address)`, given up as soon as the controllers name a newer master."""

        async def newer_epoch() -> int | None:
            newer = (await self.route(topic, refresh=True)).broker_set(bs.name)
            return None if newer is None else newer.master_epoch

        return await until_superseded(
            call(bs.master_address),
            bs.name,
            bs.master_address,
            bs.master_epoch,
            newer_epoch,
        )

    def cached_route(self, topic: str) -> TopicRoute | None:
        """The route of `topic` if it is cached and fresh, without asking anyone."""
        cached = self._routes.get(topic)
        if cached is not None and time.monotonic() - cached[0] < self.route_ttl:
            return cached[1]
        return None

    async def route(self, topic: str, *, refresh: bool = False, need: str | None = None) -> TopicRoute:
        """The topic's route (cached for `route_ttl`). `need` is what the caller will do with it
        (produce, consume): a route needs either, and a refusal then names the one asked for."""
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self.route_ttl:
            return cached[1]
        try:
            reply = await self.controller.get_route(topic)
        except PermissionDeniedError as exc:
            raise _denied_for(exc, need) from exc
        sets = []
        for b in reply.broker_sets:
            role = b.role
            master = role.master_address if role.has_master else ""
            replicas = tuple(
                Replica(r.broker_id, r.address, bool(role.has_master and r.broker_id == role.master_id))
                for r in b.replicas
            )
            sets.append(BrokerSetRoute(b.broker_set, int(b.queues), master, role.master_epoch, replicas))
        route = TopicRoute.build(topic, sets)
        self._routes[topic] = (time.monotonic(), route)
        # every replica answers lookups too: the ones to ask while no controller answers
        self.controller.learn_brokers(r.address for b in reply.broker_sets for r in b.replicas)
        return route

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    def background(self, coro: Any) -> asyncio.Future[Any]:
        """Run `coro` as a task this client ends when it closes (a reader's read-ahead)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        # retrieved here too: a read-ahead nobody came back for must not be reported as unhandled
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    async def close(self) -> None:
        await cancel_and_wait(*self._background)
        await self.data.close()
        channels, self._channels = list(self._channels.values()), {}
        self._ledger_stubs = {}
        for channel, _ in channels:
            await channel.close()
        await self.controller.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- factories ---

    def producer(
        self,
        *,
        send_timeout: float | None = None,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> AsyncProducer:
        """A producer; concurrent sends are batched per queue (see client/batching.py for the options)."""
        return AsyncProducer(
            self,
            send_timeout or self.send_timeout,
            BatchLimits(linger_ms, batch_max_messages, batch_max_bytes, max_in_flight),
        )

    def consumer(self, group: str, topic: str, **kw: Any) -> AsyncConsumer:
        """A member of consumer group `group` reading `topic`; `mode` (client/modes.py) picks the
        subscription mode; `shared` and `key_shared` give an AsyncSharedConsumer (client/sharedconsumer.py)."""
        if kw.get("mode") in md.PER_MESSAGE:
            from tidelog.client.sharedconsumer import AsyncSharedConsumer  # it builds on AsyncConsumer

            return AsyncSharedConsumer(self, group, topic, **kw)
        return AsyncConsumer(self, group, topic, **kw)

    def reader(
        self, topic: str, queue: int, start_offset: int = 0, *, broker_set: str | None = None
    ) -> AsyncReader:
        return AsyncReader(self, topic, queue, start_offset, broker_set)

    def admin(self) -> AsyncAdmin:
        return AsyncAdmin(self)

    # --- reads shared by consumer and reader ---

    async def pull(
        self, route: BrokerSetRoute, topic: str, queue: int, offset: int, *, max_messages: int, wait_ms: int
    ) -> tuple[list[ConsumedMessage], int]:
        """Pull from the first replica that answers; returns (messages, next offset)."""
        call = df.PullCall(topic, queue, offset, max_messages, 0, wait_ms)

        async def pull_checked(address: str) -> tuple[list[ConsumedMessage], int]:
            # checked here, so that a reply that fails its checks is asked of another replica
            reply = await self.pull_records(address, call, self.rpc_timeout + wait_ms / 1000)
            return _consumed(reply, route.name, address, offset), reply.next_offset

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

    async def queue_offsets(self, route: BrokerSetRoute, topic: str, queue: int) -> bpb.QueueOffsets:
        request = bpb.GetOffsetsRequest(topic=topic, queue=queue)
        reply = await self.ask_replicas(route, "GetOffsets", request, (UnavailableError, TopicNotFoundError))
        return reply.offsets

    async def ask_replicas(
        self,
        route: BrokerSetRoute,
        method: str,
        request: Any,
        move_on: tuple[type[TidelogError], ...] = (UnavailableError,),
    ) -> Any:
        """A read asked of the master of `route` first (it has the latest word), then of each other
        replica in turn while they answer with an error of the `move_on` kinds."""
        last: TidelogError | None = None
        addresses = ([route.master_address] if route.master_address else []) + route.read_addresses()
        for address in dict.fromkeys(addresses):
            try:
                return await self.call_broker(address, method, request)
            except move_on as exc:
                last = exc
        raise last or UnavailableError(f"broker set {route.name} has no reachable replica")


class AsyncProducer:
    """Sends messages; concurrent `send` calls are batched per queue (client/batching.py)."""

    def __init__(self, client: AsyncClient, send_timeout: float, limits: BatchLimits | None = None) -> None:
        self.client = client
        self.send_timeout = send_timeout
        self.limits = limits or BatchLimits()
        self._rr = itertools.count()
        self._accumulators: dict[tuple[str, tuple[str, int] | None], Accumulator] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._order: dict[str, asyncio.Lock] = {}
        self._slow: dict[str, int] = {}  # sends per topic still waiting for their route, in order
        self.requests = 0  # Produce requests sent by send()/send_async() batches (for tests and benches)

    def send(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Receipt]:
        """Send one message: `await producer.send(...)` gives its receipt once acknowledged.

        The same as `send_async` (a future, not a coroutine: one frame less per message on the
        hot path); concurrent sends share requests."""
        return self.send_async(topic, body, key, tags, properties)

    def send_async(
        self,
        topic: str,
        body: bytes,
        key: str | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Receipt]:
        """Queue one message; the future gives its receipt or its own error."""
        if not isinstance(body, bytes | bytearray):
            raise InvalidArgumentError("message bodies must be bytes")
        item = OutMessage(body if body.__class__ is bytes else bytes(body), key, tags, properties)
        fut: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        route = self.client.cached_route(topic) if key else None
        if not self._slow.get(topic) and (not key or (route is not None and route.queue_list)):
            # The common case needs no task: nothing to look up, and no earlier send still waiting
            # for the route (it would have to go first).
            self._append(topic, queue_for_key(route, key) if route is not None and key else None, item, fut)
        else:
            self._slow[topic] = self._slow.get(topic, 0) + 1
            self._spawn(self._enqueue(topic, item, fut))
        return fut

    async def flush(self) -> None:
        """Wait until every message queued so far has its outcome."""
        while True:
            waiting = [p.future for acc in self._accumulators.values() for p in acc.pending]
            tasks = [t for t in self._tasks if not t.done()]
            if not waiting and not tasks:
                return
            await asyncio.gather(*waiting, *tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _enqueue(self, topic: str, item: OutMessage, fut: asyncio.Future[Receipt]) -> None:
        # Sends reach their accumulator in the order they were made, even when the first ones
        # wait for the route: asyncio's lock hands itself over first come, first served.
        lock = self._order.get(topic)
        if lock is None:
            lock = self._order[topic] = asyncio.Lock()
        async with lock:
            try:
                target = None
                if item.key:
                    route = await self.client.route(topic, need="produce")
                    if not route.queue_list:
                        raise TopicNotFoundError(f"topic {topic!r} has no queues")
                    target = queue_for_key(route, item.key)
                self._append(topic, target, item, fut)
            except TidelogError as exc:
                if not fut.done():
                    fut.set_exception(exc)
            except Exception as exc:  # a bug: the caller still gets an answer, and it is loud
                if not fut.done():
                    fut.set_exception(exc)
                raise
            finally:
                self._slow[topic] -= 1

    def _append(
        self, topic: str, target: tuple[str, int] | None, item: OutMessage, fut: asyncio.Future[Receipt]
    ) -> None:
        acc = self._accumulators.get((topic, target))
        if acc is None:
            acc = self._accumulators[(topic, target)] = Accumulator(topic, target)
        acc.pending.append(Pending(item, message_bytes(item), fut))
        self._drain(acc)

    def _drain(self, acc: Accumulator) -> None:
        if acc.lingering:
            return
        if acc.in_flight == 0 and self.limits.linger_ms and len(acc.pending) < self.limits.batch_max_messages:
            acc.lingering = True

            def release() -> None:
                acc.lingering = False
                self._drain(acc)

            asyncio.get_running_loop().call_later(self.limits.linger_ms / 1000, release)
            return
        # Keyless sends promise no order: let a few requests overlap whatever max_in_flight says.
        limit = (
            self.limits.max_in_flight
            if acc.target is not None
            else max(self.limits.max_in_flight, KEYLESS_IN_FLIGHT)
        )
        while acc.pending and acc.in_flight < limit:
            batch = acc.take(self.limits)
            acc.in_flight += 1
            self._spawn(self._send_batch(acc, batch))

    async def _send_batch(self, acc: Accumulator, batch: list[Pending]) -> None:
        try:
            live = [p for p in batch if not p.future.done()]  # a caller may have given up
            if live:
                await self._deliver(acc, live)
        finally:
            acc.in_flight -= 1
            self._drain(acc)

    async def _deliver(self, acc: Accumulator, batch: list[Pending]) -> None:
        receipts: list[Receipt | None] = [None] * len(batch)
        try:
            self.requests += 1
            await self._send_group(
                acc.topic, acc.target, [p.item for p in batch], list(range(len(batch))), receipts
            )
        except MessageTooLargeError as exc:
            if len(batch) == 1:
                _fail(batch[0].future, exc)
                return
            # One of them is over the broker's limit: send them one by one, so only it fails.
            # A batch sent as several requests may have stored its first ones: those are done.
            for p, r in zip(batch, receipts, strict=True):
                if r is not None:
                    _settle([p], [r])
                else:
                    await self._deliver(acc, [p])
            return
        except TidelogError as exc:
            _fail_all(batch, exc)
            return
        except Exception as exc:  # a bug: every caller still gets an answer
            _fail_all(batch, exc)
            raise
        _settle(batch, receipts)

    async def send_batch(self, topic: str, messages: Sequence[OutMessage | bytes]) -> list[Receipt]:
        """Send messages; those with the same key keep their order, in one request per queue.
        Keyless messages promise no order: a large share of them travels as a few concurrent
        requests (`batching.split_keyless`), so that the broker sets replicate one while the
        next arrives."""
        items = [m if m.__class__ is OutMessage else _out_message(m) for m in messages]
        if not items:
            return []
        route = await self.client.route(topic, need="produce")
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
        # Keyed messages are placed once, so retries keep them on their queue; keyless ones may move.
        receipts: list[Receipt | None] = [None] * len(items)
        keyed: dict[tuple[str, int], list[int]] = {}
        keyless: list[int] = []
        for i, m in enumerate(items):
            if m.body.__class__ is not bytes and not isinstance(m.body, bytes | bytearray):
                raise InvalidArgumentError("message bodies must be bytes")
            if m.key:
                keyed.setdefault(queue_for_key(route, m.key), []).append(i)
            else:
                keyless.append(i)
        groups: list[tuple[tuple[str, int] | None, list[int]]] = [(q, idx) for q, idx in keyed.items()]
        groups += [(None, piece) for piece in split_keyless(keyless)]
        await asyncio.gather(
            *(
                self._send_group(topic, target, [items[i] for i in idx], idx, receipts)
                for target, idx in groups
            )
        )
        return [r for r in receipts if r is not None]

    async def _send_group(
        self,
        topic: str,
        target: tuple[str, int] | None,
        items: list[OutMessage],
        indexes: list[int],
        receipts: list[Receipt | None],
    ) -> None:
        deadline = time.monotonic() + self.send_timeout
        avoid: set[str] = set()
        last: TidelogError | None = None
        attempts = 0
        backoff = 0.05
        refresh = False
        while True:
            attempts += 1
            route, not_now = await self._send_route(topic, refresh)
            name = target[0] if target else ""
            try:
                if route is None:
                    raise not_now or UnavailableError("no route")
                refresh = False
                name, queue = target or queue_round_robin(route, next(self._rr), frozenset(avoid))
                if attempts > 1:  # an earlier attempt may have stored its first requests
                    items, indexes = _unsent(items, indexes, receipts)
                await self._produce(topic, route, name, queue, items, indexes, receipts, deadline)
                return
            except _RETRY_SEND as exc:
                last = exc
                refresh = True
                if target is None and name:
                    avoid.add(name)  # a keyless message may go to another broker set
            except TopicNotFoundError as exc:
                # the controller knows the topic but a broker's heartbeat may not have brought it yet
                last = exc
                refresh = True
            if time.monotonic() + backoff >= deadline:
                raise SendFailedError(
                    f"gave up sending {len(items)} message(s) to {topic} after {attempts} "
                    f"attempt(s) in {self.send_timeout:.0f}s; last error: {last}"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    async def _send_route(self, topic: str, refresh: bool) -> tuple[TopicRoute | None, TidelogError | None]:
        """The topic's route for one send attempt, or (None, the "not here / not now" answer to
        retry on). The controller not knowing the topic is an answer, not a passing state: it is
        raised at once (only a broker's TOPIC_NOT_FOUND is waited out, in `_send_group`)."""
        try:
            route = await self.client.route(topic, refresh=refresh, need="produce")
        except _RETRY_SEND as exc:
            return None, exc
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
        return route, None

    async def _produce(
        self,
        topic: str,
        route: TopicRoute,
        name: str,
        queue: int,
        items: list[OutMessage],
        indexes: list[int],
        receipts: list[Receipt | None],
        deadline: float,
    ) -> None:
        """`items` to queue `queue` of broker set `name` in one Produce request, or in several when
        they exceed what one request carries (`dataframes.produce_room`, MAX_PRODUCE_RECORDS); fills
        `receipts` as each is acknowledged. The requests go one after another, never together, so
        the queue keeps the items' order; a retry sends only those without a receipt."""
        bs = route.broker_set(name)
        if bs is None or not bs.master_address:
            raise UnavailableError(f"broker set {name} has no master right now")
        records = encode_batch(topic.encode(), queue, items, int(time.time() * 1000))
        parts = cut_batch(records, len(items), df.produce_room(topic), df.MAX_PRODUCE_RECORDS)
        done = 0
        for start, end, count in parts:
            part = records if count == len(items) else records[start:end]
            timeout = max(0.5, min(self.client.rpc_timeout, deadline - time.monotonic()))
            name, qoff, phys = await self.client.call_master_with(
                topic,
                bs,
                lambda address, part=part, count=count, timeout=timeout: self.client.produce_records(
                    address, topic, queue, part, count, timeout
                ),
            )
            if len(phys) != count:
                raise SendFailedError(f"the broker acknowledged {len(phys)} of {count} records")
            make = tuple.__new__
            for n, (i, p) in enumerate(zip(indexes[done : done + count], phys, strict=True)):
                receipts[i] = make(Receipt, (topic, name, queue, qoff + n, p))
            done += count


def _unsent(
    items: list[OutMessage], indexes: list[int], receipts: Sequence[Receipt | None]
) -> tuple[list[OutMessage], list[int]]:
    """The items (and their indexes) that have no receipt yet."""
    keep = [n for n, i in enumerate(indexes) if receipts[i] is None]
    return [items[n] for n in keep], [indexes[n] for n in keep]


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _fail_all(batch: Sequence[Pending], exc: BaseException) -> None:
    for p in batch:
        _fail(p.future, exc)


def _settle(batch: Sequence[Pending], receipts: Sequence[Receipt | None]) -> None:
    """Give each still-waiting sender its receipt (or an error if the reply had none for it)."""
    for p, r in zip(batch, receipts, strict=True):
        if not p.future.done():
            if r is None:
                p.future.set_exception(SendFailedError("the broker's reply had no receipt for this message"))
            else:
                p.future.set_result(r)


def _out_message(m: object) -> OutMessage:
    if isinstance(m, OutMessage):
        return m
    if not isinstance(m, bytes | bytearray):
        raise InvalidArgumentError("send_batch takes OutMessage objects or bytes")
    return OutMessage(bytes(m))


#: Pulls a reader keeps under way after a full batch: the broker reads the next while the client
#: checks and decodes the last (three measured faster than one or two on 2 cores; bench/RESULTS.md).
READ_AHEAD = 3


class ReadAhead(Generic[T]):
    """Pulls started ahead of a reader at the offsets where full batches would start, in order
    (the consumer API's reader and the Spark source's range reader). A pull is used only when it
    starts exactly at the reader's position; otherwise every pull ahead is dropped."""

    def __init__(self, client: AsyncClient, depth: int = READ_AHEAD) -> None:
        self.client = client
        self.depth = depth
        self._pulls: collections.deque[tuple[int, asyncio.Future[T]]] = collections.deque()

    def fill(self, position: int, batch: int, end: int | None, pull: Callable[[int], Awaitable[T]]) -> None:
        """Start `pull(offset)` for the batches after the last one under way (from `position`
        when none is), up to `depth` of them and below `end` (None: no end)."""
        start = self._pulls[-1][0] + batch if self._pulls else position
        while len(self._pulls) < self.depth and (end is None or start < end):
            self._pulls.append((start, self.client.background(pull(start))))
            start += batch

    async def take(self, position: int) -> asyncio.Future[T] | None:
        """The first pull, when it starts at `position`; else None, and every pull is dropped."""
        if not self._pulls:
            return None
        if self._pulls[0][0] != position:
            await self.drop()
            return None
        return self._pulls.popleft()[1]

    async def drop(self, *also: asyncio.Future[Any]) -> None:
        """Cancel every pull ahead (and `also`), and wait until they have ended."""
        pulls = [f for _, f in self._pulls]
        self._pulls.clear()
        await cancel_and_wait(*also, *pulls)


class AsyncReader:
    """Reads one queue from an offset, without a group."""

    def __init__(
        self, client: AsyncClient, topic: str, queue: int, start_offset: int, broker_set: str | None
    ) -> None:
        self.client = client
        self.topic = topic
        self.queue = queue
        self.position = start_offset
        self.broker_set = broker_set
        # pulls started ahead of the caller
        self._ahead: ReadAhead[tuple[list[ConsumedMessage], int]] = ReadAhead(client)

    async def _route(self, refresh: bool = False) -> BrokerSetRoute:
        route = await self.client.route(self.topic, refresh=refresh, need="consume")
        names = [b.name for b in route.broker_sets if b.queues > self.queue]
        if self.broker_set is None:
            if len(route.broker_sets) > 1:
                raise InvalidArgumentError(f"topic {self.topic} spans broker sets {names}; name one")
            if not names:
                raise InvalidArgumentError(f"queue {self.queue} does not exist in topic {self.topic}")
            self.broker_set = names[0]
        bs = route.broker_set(self.broker_set)
        if bs is None:
            raise TopicNotFoundError(f"topic {self.topic} has no queues in broker set {self.broker_set}")
        return bs

    async def read(self, max_messages: int = 100, timeout: float = 0.0) -> list[ConsumedMessage]:
        """The next messages from the position (at most `max_messages`), waiting up to `timeout`
        for some. A full batch keeps `READ_AHEAD` pulls under way (read-ahead): the first from the
        new position, the next from where a full batch would end, so that the broker reads them
        while the caller works on this one. A read-ahead that does not start exactly at the
        position (an earlier batch came back short) is dropped, never used."""
        msgs = await self._ahead_batch()
        if msgs is None:
            msgs, nxt = await self._pull(self.position, max_messages, int(timeout * 1000))
            self.position = nxt
        if len(msgs) >= max_messages:
            self._ahead.fill(self.position, max_messages, None, lambda at: self._pull(at, max_messages, 0))
        return msgs

    async def _ahead_batch(self) -> list[ConsumedMessage] | None:
        """The first read-ahead's messages, if it starts at the position and brought any; else None
        (and every read-ahead is dropped: pull as usual)."""
        ahead = await self._ahead.take(self.position)
        if ahead is None:
            return None
        try:
            msgs, nxt = await ahead
        except TidelogError:
            msgs = []  # the pull made now will meet (and raise) whatever it was, or succeed
        if not msgs:
            await self._ahead.drop()
            return None
        self.position = nxt
        return msgs

    async def _pull(self, offset: int, max_messages: int, wait_ms: int) -> tuple[list[ConsumedMessage], int]:
        bs = await self._route()
        try:
            return await self.client.pull(
                bs, self.topic, self.queue, offset, max_messages=max_messages, wait_ms=wait_ms
            )
        except UnavailableError:
            bs = await self._route(refresh=True)
            return await self.client.pull(
                bs, self.topic, self.queue, offset, max_messages=max_messages, wait_ms=wait_ms
            )

    async def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[ConsumedMessage]:
        return await self.read(max_messages, timeout)

    async def close(self) -> None:
        await self._ahead.drop()


#: A rebalance listener: called with the (broker set, queue) pairs concerned, on the client's loop.
RebalanceListener = Callable[[list[tuple[str, int]]], None]


class AsyncConsumer:
    """A member of a consumer group, in one of the subscription modes of client/modes.py:
    `clustering` (the default: the group's live members share the queues), `failover` (one active
    member reads them all, standbys take over), `exclusive` (one member; a second is refused) or
    `broadcast` (every member reads everything, with its own offsets).

    A queue is read by the member holding its owner key (client/handover.py). At each rebalance
    the member releases the queues the sticky assignment gives elsewhere (`on_revoked`, stop
    pulling, commit what `poll` returned, delete the key) and takes the free ones (create the key,
    start at the committed offset, `on_assigned`), so a clean hand-over delivers nothing twice.
    """

    def __init__(
        self,
        client: AsyncClient,
        group: str,
        topic: str,
        *,
        member_id: str | None = None,
        auto_commit: bool = True,
        auto_commit_interval: float = 5.0,
        start: str = "earliest",
        session_timeout: float = 6.0,
        heartbeat_interval: float = 1.0,
        on_assigned: RebalanceListener | None = None,
        on_revoked: RebalanceListener | None = None,
        mode: str = md.CLUSTERING,
    ) -> None:
        asg.check_group_name(group)
        if mode not in md.MODES:
            raise InvalidArgumentError(f"mode must be one of {', '.join(md.MODES)}, not {mode!r}")
        if start not in ("earliest", "latest"):
            raise InvalidArgumentError("start must be 'earliest' or 'latest'")
        self.client = client
        self.group = group
        self.topic = topic
        self.member_id = member_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if "/" in self.member_id or "@" in self.member_id:
            raise InvalidArgumentError("member_id must not contain '/' or '@'")
        self.mode = mode
        # Owner keys and commits live under this name (`<group>@<member>` in broadcast mode).
        self._state = md.state_group(group, mode, self.member_id)
        self._since_ms: int | None = None  # the first announcement's time
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.start = start
        self.session_timeout_ms = int(session_timeout * 1000)
        self.heartbeat_interval = heartbeat_interval
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        # Queues whose owner key this member holds and that it started: the delivered position.
        self.positions: dict[tuple[str, int], int] = {}
        self._committed: dict[tuple[str, int], int] = {}
        # Revoked queues not yet released (their commit was deferred): held, but no longer pulled.
        self._revoked: set[tuple[str, int]] = set()
        self._key = asg.members_prefix(group) + self.member_id
        self._owners_prefix = ho.owners_prefix(self._state, topic)
        self._version: int | None = None
        self._last_beat = 0.0
        self._last_commit = time.monotonic()
        self._rr = 0
        self._closed = False
        self._away_until = 0.0  # while the controllers are away: when to try a rebalance again

    @property
    def assignment(self) -> list[tuple[str, int]]:
        """The queues this member reads now."""
        return sorted(q for q in self.positions if q not in self._revoked)

    @property
    def committed(self) -> dict[tuple[str, int], int]:
        """The offsets this member last committed (or started from), per owned queue."""
        return dict(self._committed)

    async def _announce(self) -> None:
        now_ms = int(time.time() * 1000)
        if self._since_ms is None:
            self._since_ms = now_ms
        value = asg.announcement(now_ms, self.topic, self.session_timeout_ms, self.mode, self._since_ms)
        c = self.client.controller
        if self._version is None:
            # Remember the group's topic beyond this member's life: the member key goes on close.
            with contextlib.suppress(MetadataExistsError):
                await c.meta_create(asg.topics_prefix(self.group) + self.topic, b"")
        try:
            if self._version is None:
                entry = await c.meta_create(self._key, value)
            else:
                entry = await c.meta_cas(self._key, value, self._version)
        except (MetadataExistsError, MetadataVersionMismatchError, MetadataNotFoundError):
            with contextlib.suppress(MetadataNotFoundError):
                await c.meta_delete(self._key)
            entry = await c.meta_create(self._key, value)
        self._version = entry.version

    async def _read_group(self) -> tuple[dict[str, md.Announced], dict[tuple[str, int], ho.Owner]]:
        """The live members reading this topic (with their modes), and the owner keys of its queues."""
        prefix = asg.members_prefix(self.group)
        entries = await self.client.controller.meta_list(prefix)
        live = asg.live_announced(
            ((e.key, e.value) for e in entries),
            prefix,
            int(time.time() * 1000),
            self.session_timeout_ms,
            self.topic,
        )
        keys = await self.client.controller.meta_list(self._owners_prefix)
        return live, ho.parse_owners(((e.key, e.value, e.version) for e in keys), self._owners_prefix)

    async def rebalance(self, force: bool = False) -> None:
        """Announce this member, then follow the hand-over plan: drop the queues another member
        took over, release those the assignment moves elsewhere, take the free ones."""
        now = time.monotonic()
        if not force and now - self._last_beat < self.heartbeat_interval:
            return
        self._last_beat = now
        await self._announce()
        route = await self.client.route(self.topic, refresh=force, need="consume")
        live, owners = await self._read_group()
        other = md.conflict(self.member_id, md.Announced(self.mode, self._since_ms or 0), live)
        if other is not None:
            await self._refuse(
                f"member {other} of group {self.group} reads {self.topic} in {live[other].mode} mode"
            )
        active = await self._claim_active(set(live)) if self.mode in md.SINGLE_ACTIVE else None
        sharing = md.sharing(self.mode, self.member_id, live, active)
        step = ho.plan(self.member_id, sharing, route.queue_list, owners, self.positions, self._revoked)
        for q in step.lost:
            log.info("group %s: queue %s was taken over; member %s stops", self.group, q, self.member_id)
            self._drop(q)
        if step.resume:
            self._revoked.difference_update(step.resume)
            if self.on_assigned is not None:
                self.on_assigned(list(step.resume))
        await self._release({q: owners[q].version for q in step.release})
        taken = await self._take(route, step)
        if step.lost or step.release or taken:
            log.info("group %s member %s owns %s", self.group, self.member_id, self.assignment)

    async def _claim_active(self, live: set[str]) -> str | None:
        """Failover and exclusive modes: the member holding the group's active key after this
        member took it if it could (None: nobody yet); refuses this member (exclusive) when
        another live member holds it."""
        c = self.client.controller
        key = md.active_key(self.group, self.topic)
        try:
            entry = await c.meta_get(key)
            holder: tuple[str, int] | None = (entry.value.decode(errors="replace"), entry.version)
        except MetadataNotFoundError:
            holder = None
        decision = md.decide_active(self.member_id, self.mode, holder, live)
        me = self.member_id.encode()
        try:
            if decision.action == "create":
                await c.meta_create(key, me)
            elif decision.action == "replace":
                await c.meta_cas(key, me, present(decision.version, "a replace names the key's version"))
                log.info(
                    "group %s: member %s takes %s over from %s, whose session expired",
                    self.group,
                    self.member_id,
                    self.topic,
                    decision.holder,
                )
            elif decision.action == "refuse":
                await self._refuse(
                    f"member {decision.holder} of group {self.group} reads {self.topic} exclusively"
                )
            else:
                return decision.holder
        except (MetadataExistsError, MetadataVersionMismatchError, MetadataNotFoundError):
            return None  # another member was quicker: the next round says who
        return self.member_id

    async def _refuse(self, why: str) -> NoReturn:
        """Leave the group (stop reading, commit and release what this member held, withdraw its
        announcement) and raise SubscriptionConflictError."""
        with contextlib.suppress(TidelogError):
            _, owners = await self._read_group()
            await self._release(
                {q: o.version for q, o in owners.items() if o.member == self.member_id}, closing=True
            )
        self.positions.clear()
        self._committed.clear()
        self._revoked.clear()
        with contextlib.suppress(TidelogError):
            await self.client.controller.meta_delete(self._key)
        self._version = None
        raise SubscriptionConflictError(why)

    async def _release(self, keys: Mapping[tuple[str, int], int], *, closing: bool = False) -> None:
        """Revoke → commit → release: stop pulling `keys` (queue → owner key version), commit what
        was delivered, then delete each key. A queue whose commit was deferred keeps its key (and
        nobody reads it) until a later rebalance commits it, unless this member is closing."""
        if not keys:
            return
        fresh = sorted(q for q in keys if q in self.positions and q not in self._revoked)
        self._revoked.update(keys)
        if fresh and self.on_revoked is not None:
            self.on_revoked(fresh)
        if self.auto_commit:
            await self._commit(list(keys))
        for q, version in sorted(keys.items()):
            pending = self.auto_commit and q in self.positions and self._committed.get(q) != self.positions[q]
            if pending and not closing:
                continue
            # Gone or at another version: the key was taken over after this member's session
            # lapsed; either way it is no longer this member's.
            with contextlib.suppress(MetadataNotFoundError, MetadataVersionMismatchError):
                await self.client.controller.meta_delete(ho.owner_key(self._state, self.topic, q), version)
            self._drop(q)

    def _drop(self, q: tuple[str, int]) -> None:
        self.positions.pop(q, None)
        self._committed.pop(q, None)
        self._revoked.discard(q)

    async def _take(self, route: TopicRoute, step: ho.Plan) -> list[tuple[str, int]]:
        """Claim the plan's queues (create a free key, replace an expired holder's at its version)
        and start each claimed one at the committed offset; returns the queues started."""
        c = self.client.controller
        me = self.member_id.encode()
        claimed = list(step.adopt)
        for q in step.take:
            with contextlib.suppress(MetadataExistsError):  # another member was quicker
                await c.meta_create(ho.owner_key(self._state, self.topic, q), me)
                claimed.append(q)
        for q, version in step.take_over:
            with contextlib.suppress(MetadataVersionMismatchError, MetadataNotFoundError):
                await c.meta_cas(ho.owner_key(self._state, self.topic, q), me, version)
                claimed.append(q)
        started = []
        for q in sorted(claimed):
            try:
                self.positions[q] = await self._start_offset(route, q)
                started.append(q)
            except (TopicNotFoundError, UnavailableError) as exc:
                # The route has the topic but no replica serves it yet (a broker learns a new topic
                # from its next heartbeat) or none answers: the key is held, so the next rebalance
                # adopts it and tries again.
                log.info("group %s: queue %s not started yet: %s", self.group, q, exc)
        if started and self.on_assigned is not None:
            self.on_assigned(started)
        return started

    async def _start_offset(self, route: TopicRoute, q: tuple[str, int]) -> int:
        bs = present(route.broker_set(q[0]), f"the route of {q[0]} lost its broker set")
        committed = await self.fetch_committed(bs, q[1])
        if committed is not None:
            self._committed[q] = committed
            return committed
        offsets = await self.client.queue_offsets(bs, self.topic, q[1])
        return offsets.min if self.start == "earliest" else offsets.confirmed

    async def fetch_committed(self, bs: BrokerSetRoute, queue: int) -> int | None:
        """The group's committed offset of `queue` in broker set `bs` (None: nothing committed)."""
        req = bpb.FetchOffsetRequest(group=self._state, topic=self.topic, queue=queue)
        reply = await self.client.ask_replicas(bs, "FetchOffset", req)
        return reply.offset if reply.found else None

    async def rebalance_or_carry_on(self) -> None:
        """`rebalance`, except while no controller quorum answers: then the queues this member holds
        stay its own (nobody can take an owner key over without the controllers) and it reads on,
        trying a rebalance again every `AWAY_RETRY_S`. A member that never joined has nothing to
        read on and raises CONTROLLER_UNAVAILABLE, except in the shared modes, where no queue
        changes hands and a member receives at once."""
        if time.monotonic() < self._away_until:
            return
        try:
            await self.rebalance()
        except ControllerUnavailableError as exc:
            if self._version is None and self.mode not in md.PER_MESSAGE:
                raise  # never joined: it owns no queue to read on, and says why it cannot start
            if not self._away_until:
                log.warning(
                    "group %s member %s: no controller quorum (%s); reading on %s",
                    self.group,
                    self.member_id,
                    exc.message,
                    self.assignment or "no queue until it returns",
                )
            self._away_until = time.monotonic() + AWAY_RETRY_S
            return
        if self._away_until:
            log.info("group %s member %s: the controllers answer again", self.group, self.member_id)
            self._away_until = 0.0

    async def poll(self, max_messages: int = 100, timeout: float = 1.0) -> list[ConsumedMessage]:
        """Messages from this member's queues, each queue in order; waits up to `timeout` for some."""
        await self.rebalance_or_carry_on()
        if self.auto_commit and time.monotonic() - self._last_commit >= self.auto_commit_interval:
            await self.commit()
        queues = self.assignment
        if not queues:
            await asyncio.sleep(min(timeout, self.heartbeat_interval))
            return []
        route = await self.client.route(self.topic, need="consume")
        self._rr = (self._rr + 1) % len(queues)
        queues = queues[self._rr :] + queues[: self._rr]
        # Never pull more than can be returned: a pulled message moves its queue's position, so
        # one dropped here would be skipped for good (and committed past).
        queues = queues[: max(1, max_messages)]
        per_queue = max(1, max_messages // len(queues))
        out: list[ConsumedMessage] = []
        for wait_ms in (0, int(timeout * 1000)):
            pulls = [self._pull_one(route, q, per_queue, wait_ms) for q in queues]
            if wait_ms:
                out.extend(await _first_non_empty(pulls))
            else:
                for msgs in await asyncio.gather(*pulls):
                    out.extend(msgs)
            if out or timeout <= 0:
                break
        return out

    async def _pull_one(
        self, route: TopicRoute, q: tuple[str, int], max_messages: int, wait_ms: int
    ) -> list[ConsumedMessage]:
        bs = route.broker_set(q[0])
        if bs is None or q not in self.positions or q in self._revoked:
            return []
        try:
            msgs, nxt = await self.client.pull(
                bs, self.topic, q[1], self.positions[q], max_messages=max_messages, wait_ms=wait_ms
            )
        except (UnavailableError, TopicNotFoundError):
            # Not served right now; a topic that is really gone fails the controller route instead.
            self.client.forget_route(self.topic)
            return []
        if q in self.positions and msgs:
            self.positions[q] = nxt
        return msgs

    async def commit(self) -> None:
        """Commit the delivered position of every owned queue (at-least-once on failover)."""
        await self._commit(list(self.positions))

    async def _commit(self, queues: Sequence[tuple[str, int]]) -> None:
        self._last_commit = time.monotonic()
        todo = [q for q in queues if q in self.positions and self._committed.get(q) != self.positions[q]]
        if not todo:
            return  # nothing moved: no route lookup (which may wait out an unreachable controller)
        route = await self.client.route(self.topic, need="consume")
        for q in todo:
            pos = self.positions.get(q)
            if pos is None or self._committed.get(q) == pos:
                continue
            bs = route.broker_set(q[0])
            if bs is None or not bs.master_address:
                continue
            try:
                await self.client.call_broker(
                    bs.master_address,
                    "CommitOffset",
                    bpb.CommitOffsetRequest(group=self._state, topic=self.topic, queue=q[1], offset=pos),
                )
            except (
                NotMasterError,
                UnavailableError,
                InSyncReplicasNotEnoughError,
                FlushSlaveTimeoutError,
            ) as exc:
                log.info("commit of %s/%s queue %s deferred: %s", self.group, self.topic, q, exc)
                self.client.forget_route(self.topic)
                continue
            self._committed[q] = pos

    async def close(self) -> None:
        """Commit and release every queue this member holds, then leave the group: the members
        that take its queues over start where it stopped."""
        if self._closed:
            return
        self._closed = True
        if self._version is None:
            return  # never announced (e.g. the controller was unreachable): nothing to take back
        try:
            _, owners = await self._read_group()
        except TidelogError:
            # The owner keys cannot be read: commit anyway, so that whoever takes over once this
            # member's session lapses starts where it stopped.
            if self.auto_commit:
                with contextlib.suppress(TidelogError):
                    await self.commit()
        else:
            mine = {q: o.version for q, o in owners.items() if o.member == self.member_id}
            with contextlib.suppress(TidelogError):
                await self._release(mine, closing=True)
            if self.mode in md.SINGLE_ACTIVE:
                # After the commits: the standby that takes the key starts where this member stopped.
                with contextlib.suppress(TidelogError):
                    entry = await self.client.controller.meta_get(md.active_key(self.group, self.topic))
                    if entry.value == self.member_id.encode():
                        await self.client.controller.meta_delete(entry.key, entry.version)
        with contextlib.suppress(TidelogError):
            await self.client.controller.meta_delete(self._key)


async def _first_non_empty(coros: list[Any]) -> list[ConsumedMessage]:
    tasks = [asyncio.ensure_future(c) for c in coros]
    out: list[ConsumedMessage] = []
    try:
        pending = set(tasks)
        while pending and not out:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                out.extend(t.result())
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


class AsyncAdmin:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def broker_sets(self) -> list[str]:
        reply = await self.client.controller.describe_broker_sets()
        return sorted(b.role.broker_set for b in reply.broker_sets)

    async def create_topic(
        self,
        name: str,
        queues: int = 4,
        broker_sets: Iterable[str] | None = None,
        perm: str = "rw",
        retention_ms: int = 0,
    ) -> dict[str, int]:
        """`retention_ms`: how long its messages stay readable (0: the brokers' retention_ms)."""
        sets = list(broker_sets) if broker_sets else await self.broker_sets()
        if not sets:
            raise UnavailableError("no broker set is registered yet", hint="start the brokers first")
        cfg = await self.client.controller.create_topic(name, {s: queues for s in sets}, perm, retention_ms)
        self.client.forget_route(name)
        return dict(cfg.queues)

    async def create_topics(
        self,
        names: Iterable[str],
        queues: int = 4,
        broker_sets: Iterable[str] | None = None,
        perm: str = "rw",
        retention_ms: int = 0,
    ) -> dict[str, TidelogError | None]:
        """Create many topics alike, up to 1,000 per controller call (one Raft commit each call);
        returns each name's outcome: None when created, else its typed error (TOPIC_EXISTS, ...)."""
        sets = list(broker_sets) if broker_sets else await self.broker_sets()
        if not sets:
            raise UnavailableError("no broker set is registered yet", hint="start the brokers first")
        queue_map = {s: queues for s in sets}
        names = list(names)
        out: dict[str, TidelogError | None] = {}
        for start in range(0, len(names), MAX_TOPICS_PER_CALL):
            requests = [
                cpb.CreateTopicRequest(name=n, queues=queue_map, perm=perm, retention_ms=retention_ms)
                for n in names[start : start + MAX_TOPICS_PER_CALL]
            ]
            for result in await self.client.controller.create_topics(requests):
                out[result.name] = (
                    by_code(result.error_code)(result.error_message) if result.error_code else None
                )
                self.client.forget_route(result.name)
        return out

    async def delete_topic(self, name: str) -> None:
        await self.client.controller.delete_topic(name)
        self.client.forget_route(name)

    async def alter_topic_queues(
        self, name: str, queues: int, broker_sets: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Grow topic `name` to `queues` queues in each of its broker sets (or the named ones)."""
        sets = (
            list(broker_sets)
            if broker_sets
            else sorted(b.name for b in (await self.client.route(name, refresh=True)).broker_sets)
        )
        cfg = await self.client.controller.alter_topic_queues(name, {s: queues for s in sets})
        self.client.forget_route(name)
        return dict(cfg.queues)

    async def alter_topic_retention(self, name: str, retention_ms: int) -> int:
        """Set how long topic `name`'s messages stay readable (0: the brokers' retention_ms);
        returns the retention now stored."""
        cfg = await self.client.controller.alter_topic_retention(name, retention_ms)
        return int(cfg.retention_ms)

    async def topic_retention(self, name: str) -> int:
        """Topic `name`'s own retention in ms (0: the brokers'); TopicNotFoundError if none."""
        page, _ = await self.client.controller.list_topics_page(prefix=name, limit=1)
        for t in page:
            if t.name == name:
                return int(t.retention_ms)
        raise TopicNotFoundError(f"no topic {name!r}", hint="list them with `tide topic list`")

    async def topic_readers(self, name: str, within_ms: int) -> list[str]:
        """Consumer groups with a member that announced reading topic `name` within the last
        `within_ms` milliseconds (members announce every few seconds while they poll)."""
        entries = await self.client.controller.meta_list("group/")
        return asg.groups_reading(
            ((e.key, e.value) for e in entries), name, int(time.time() * 1000), within_ms
        )

    async def list_topics(self) -> list[dict[str, Any]]:
        return [_topic_row(t) for t in await self.client.controller.list_topics()]

    async def list_topics_page(
        self, *, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> tuple[list[dict[str, Any]], str]:
        """At most `limit` topics in name order after `start_after` that begin with `prefix`, and
        the name to pass as `start_after` for the next page ("" after the last)."""
        page, after = await self.client.controller.list_topics_page(
            prefix=prefix, start_after=start_after, limit=limit
        )
        return [_topic_row(t) for t in page], after

    async def describe_topic(self, name: str) -> list[dict[str, Any]]:
        route = await self.client.route(name, refresh=True)
        out = []
        for bs in route.broker_sets:
            for q in range(bs.queues):
                o = await self.client.queue_offsets(bs, name, q)
                out.append(
                    {"broker_set": bs.name, "queue": q, "min": o.min, "max": o.max, "confirmed": o.confirmed}
                )
        return out

    async def group_topics(self, group: str) -> list[str]:
        """Topics the group's members announced, live or gone (members forget theirs on close)."""
        import json

        prefix = asg.topics_prefix(group)
        topics = {e.key[len(prefix) :] for e in await self.client.controller.meta_list(prefix)}
        for e in await self.client.controller.meta_list(asg.members_prefix(group)):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                topics.add(json.loads(e.value)["topic"])
        return sorted(topics)

    async def group_members(self, group: str, topic: str | None = None) -> dict[str, str]:
        """Member id -> topic of the group's live members (those reading `topic`, if given), each
        judged by the session timeout it announced."""
        return await ga.live_members(self.client, group, None if topic is None else [topic])

    async def group_modes(self, group: str) -> dict[str, str]:
        """Member id -> the subscription mode it announced (client/modes.py)."""
        return await ga.member_modes(self.client, group)

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        to: str,
        *,
        offset: int | None = None,
        timestamp: str | None = None,
        queue: int | None = None,
        broker_sets: Iterable[str] = (),
        force: bool = False,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Move the group's committed offsets of `topic`'s queues `to` "earliest", "latest",
        "timestamp" (`timestamp`: epoch ms or ISO-8601) or "offset" (`offset`); only the queues
        with id `queue` and/or of `broker_sets`, if given. Refused while the group has live
        members unless `force`; `dry_run` only says what each queue would get (client/groupadmin.py)."""
        target = rp.target(to, offset, timestamp)
        return await ga.reset_offsets(
            self, group, topic, target, queue=queue, broker_sets=broker_sets, force=force, dry_run=dry_run
        )

    async def delete_group(
        self, group: str, topic: str | None = None, *, force: bool = False
    ) -> dict[str, Any]:
        """Delete the group's committed offsets (of `topic`, else all) and its owner keys; refused
        while the group has live members unless `force` (client/groupadmin.py)."""
        return await ga.delete_group(self, group, topic, force=force)

    async def require_group(self, group: str, topic: str | None = None) -> None:
        """GroupNotFoundError unless the group is known: a key in the metadata store (a member, a
        topic it read, an owner key) or, with `topic`, a commit in one of its broker sets. The
        same answer for an unknown group from describe as from reset-offsets and delete."""
        sets = (await self.client.route(topic, refresh=True)).broker_sets if topic else ()
        await ga.require_known(self.client, group, sets)

    async def group_lag(self, group: str, topic: str) -> list[dict[str, Any]]:
        route = await self.client.route(topic, refresh=True)
        rows = []
        probe = AsyncConsumer(self.client, group, topic, auto_commit=False)
        prefix = ho.owners_prefix(group, topic)
        owners = ho.parse_owners(
            ((e.key, e.value, e.version) for e in await self.client.controller.meta_list(prefix)), prefix
        )
        for bs in route.broker_sets:
            for q in range(bs.queues):
                o = await self.client.queue_offsets(bs, topic, q)
                committed = await probe.fetch_committed(bs, q)
                rows.append(
                    {
                        "broker_set": bs.name,
                        "queue": q,
                        "min": o.min,
                        "committed": committed,
                        "confirmed": o.confirmed,
                        "lag": o.confirmed - (committed or o.min),
                        # the member holding the queue's owner key (client/handover.py), if any
                        "owner": owners[(bs.name, q)].member if (bs.name, q) in owners else None,
                    }
                )
        return rows


def _topic_row(t: cpb.TopicConfig) -> dict[str, Any]:
    return {"name": t.name, "queues": dict(t.queues), "perm": t.perm, "retention_ms": int(t.retention_ms)}


def _denied_for(exc: PermissionDeniedError, need: str | None) -> PermissionDeniedError:
    """A route lookup's refusal ("user alice lacks produce or consume on topic orders") as the
    caller's own: it asked to produce, so the one permission that would let it is produce."""
    user, lacks, rest = exc.message.partition(" lacks ")
    _, on, resource = rest.partition(" on ")
    if need is None or not lacks or not on:
        return exc
    return PermissionDeniedError(f"{user} lacks {need} on {resource}")
