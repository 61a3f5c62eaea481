"""The transport of the clients: channels, routes, and calls to masters and brokers.

Owns the connections a client holds (a gRPC channel per broker, the data plane of
client/dataconn.py, the controller client), the route cache (refreshed when an answer says it may be
stale, and by age), and the calls every job above makes through them: `call_master`,
`call_broker`, produce and pull over the data port, `ask_replicas`. The producer, consumers,
admin and lookups (client/producer.py, client/consumer.py, client/admin.py, client/lookups.py),
the ledger client (ledger/calls.py) and the broker's RocketMQ forwarding (broker/rocketmq.py) use
it; it imports none of them (docs/ARCHITECTURE.md §2.2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Self, TypeAlias, TypeVar

import grpc

from tidelog import dataport_frames as df
from tidelog.client.commitpace import DEFAULT_COMMIT_INTERVAL_MS
from tidelog.client.committer import Committer
from tidelog.client.controllers import CONTROLLERS_ENV, QUORUM_TIMEOUT_S, ControllerClient
from tidelog.client.dataconn import DataPlane
from tidelog.client.hedge import until_superseded
from tidelog.client.routing import BrokerSetRoute, Replica, TopicRoute
from tidelog.commitlog.batch import RecordView, walk
from tidelog.commitlog.crc import crc32c
from tidelog.credentials import from_env as credentials_from_env
from tidelog.credentials import signer
from tidelog.errors import (
    CorruptRecordError,
    PermissionDeniedError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import broker_pb2_grpc as bpb_grpc
from tidelog.proto import ledger_pb2_grpc as lpb_grpc
from tidelog.tasks import cancel_and_wait
from tidelog.tlsconfig import ClientTls, aio_channel, client_from_env
from tidelog.wire import CHANNEL_OPTIONS, error_from_rpc

log = logging.getLogger(__name__)

T = TypeVar("T")


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
ConsumedMessage: TypeAlias = RecordView


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


def consumed(reply: Any, broker_set: str, address: str, offset: int) -> list[ConsumedMessage]:
    """The records of an encoded pull from `offset`, as lazily decoded messages."""
    # bytes: the messages' bodies and keys are handed to the application as bytes and str
    data = bytes(reply_records(reply, address, offset))
    starts = walk(data, f"pull reply from {address}", 0, verify_crc=False)
    if len(starts) != reply.count:
        raise CorruptRecordError(
            f"pull from {address}", -1, f"{len(starts)} records, {reply.count} announced"
        )
    return [RecordView(data, pos, broker_set) for pos in starts]


class Transport:
    """Channels, routes and calls to masters and brokers: what the producer, the consumers, the
    admin, the ledger client and the broker's RocketMQ forwarding send through. `AsyncClient`
    (client/aio.py) is a Transport with the factories and lookups on top."""

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
        commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
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
        # every group member's commits, whatever its group: few calls to each master (client/committer.py)
        self.commits = Committer(self, commit_interval_ms)

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
        self.commits.close()
        await cancel_and_wait(*self._background)
        await self.data.close()
        channels, self._channels = list(self._channels.values()), {}
        self._ledger_stubs = {}
        for channel, _ in channels:
            await channel.close()
        await self.controller.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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


def _denied_for(exc: PermissionDeniedError, need: str | None) -> PermissionDeniedError:
    """A route lookup's refusal ("user alice lacks produce or consume on topic orders") as the
    caller's own: it asked to produce, so the one permission that would let it is produce."""
    user, lacks, rest = exc.message.partition(" lacks ")
    _, on, resource = rest.partition(" on ")
    if need is None or not lacks or not on:
        return exc
    return PermissionDeniedError(f"{user} lacks {need} on {resource}")
