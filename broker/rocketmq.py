"""RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`) on every broker, so that the
official RocketMQ clients work against tidelog as they are.

Each broker runs this second gRPC server (config `rocketmq_listen`) beside its own. It serves any
topic of the cluster, not only its broker set's: it holds a tidelog client (client/aio.py) to the
controllers and does what a tidelog client would, so routing, a master's move (NOT_MASTER) and
retries are that client's. The mapping of RocketMQ's concepts (docs/ARCHITECTURE.md, "RocketMQ
endpoint"): a broker set is a RocketMQ broker (id 0, the master) whose queues are the topic's
queues in that set; as RocketMQ's proxy in cluster mode, a route names for every queue the
endpoint(s) the client asked through (its access point), and this endpoint passes each call on to
the master of the queue's set. SendMessage is a tidelog send; ReceiveMessage, AckMessage,
ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue are the shared subscription mode's
SharedReceive (in key order: a FIFO message group one message at a time), SharedAck,
SharedChangeInvisible and SharedDeadLetter (broker/shared.py). A receive reads every queue of the
topic in the broker set it names (the proxy's pop by broker), in turn, and its long poll wakes on
the first message in any of them; the receipt handle carries (broker set, queue, shared receipt).
DELAY and TRANSACTION messages are kept by the master of a set of the topic (this broker's set when
it has queues of the topic) and moved into their topic once due or committed
(broker/rocketmqtx.py; EndTransaction, RecallMessage, and the checks of orphaned transactions sent
over a producer's Telemetry stream); an endpoint that is not that master passes those calls on to
its endpoint. The rules (codes, handles, filters, properties) are broker/rocketmqrules.py's.

Every call answers a RocketMQ `Status`: a tidelog error by its mapped code, a malformed request by
a 400 code, an RPC tidelog does not serve by NOT_IMPLEMENTED (never gRPC UNIMPLEMENTED), and a
call beyond `max_concurrent_requests` in progress by TOO_MANY_REQUESTS.

With `rocketmq_access_keys` configured, every call (the Telemetry stream too) must carry the
clients' MQv2-HMAC-SHA1 signature by one of them: `SignatureCheck`, a server interceptor, answers
any other with UNAUTHORIZED before the call reaches the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from tidelog import tlsconfig
from tidelog.acl import AclState
from tidelog.broker import delayrules as dr
from tidelog.broker import rocketmqrules as rules
from tidelog.broker.config import BrokerConfig
from tidelog.broker.rocketmqmembers import Members
from tidelog.broker.rocketmqtx import Scheduled
from tidelog.client.modes import ANY_QUEUE, MAX_INVISIBLE_MS, MAX_RECEIVE, dlq_topic
from tidelog.client.producer import AsyncProducer
from tidelog.client.receive import SharedMessage, decode_receive_reply
from tidelog.client.routing import BrokerSetRoute, TopicRoute
from tidelog.client.topicadmin import TopicAdmin
from tidelog.client.transport import Receipt, Transport
from tidelog.commitlog import StoredMessage
from tidelog.errors import (
    ConfigError,
    InvalidArgumentError,
    NotMasterError,
    TidelogError,
    TopicExistsError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.guard import metadata_of
from tidelog.ha.roles import MASTER
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto.rocketmq import definition_pb2 as d
from tidelog.proto.rocketmq import service_pb2 as s
from tidelog.proto.rocketmq import service_pb2_grpc as s_grpc
from tidelog.tasks import within
from tidelog.wire import SERVER_OPTIONS

if TYPE_CHECKING:
    from tidelog.broker.replica import Replica

log = logging.getLogger(__name__)

R = TypeVar("R")
MAX_BATCH = MAX_RECEIVE  # messages of one SendMessage, entries of one AckMessage, messages of one receive
ENDPOINT_TTL_S = 10.0  # how long a broker's RocketMQ endpoint (from its Status) is trusted
DLQ_WAIT_S = 5.0  # how long a forward to a dead-letter topic just created waits for its broker
ACCEPTED_TYPES = (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION)
TYPE_NAMES = {d.NORMAL: "NORMAL", d.FIFO: "FIFO", d.DELAY: "DELAY", d.TRANSACTION: "TRANSACTION"}
CHECK_QUEUE = 1000  # checks waiting for one producer's Telemetry stream; beyond, a check is skipped
SETTINGS_AGAIN_S = (0.5, 3.0)  # when a stream's first Settings is answered again (Telemetry)


def refused(code: str, message: str) -> InvalidArgumentError:
    """A malformed request, answered with RocketMQ code `code` (a Code name)."""
    return InvalidArgumentError(message, rocketmq=code)


def status_of(exc: BaseException) -> d.Status:
    if isinstance(exc, TidelogError):
        code = exc.details.get("rocketmq") or rules.code_for(exc.code, exc.retryable)
        return _status(code, exc.message)
    if isinstance(exc, TimeoutError):
        return _status(rules.TIMEOUT, "tidelog did not answer within the client's deadline")
    log.error("RocketMQ endpoint: unexpected error", exc_info=exc)
    return _status(rules.INTERNAL, f"unexpected error: {type(exc).__name__}")


def _status(code: str, message: str = "") -> d.Status:
    return d.Status(code=d.Code.Value(code), message=message[:1000])


OK = _status(rules.OK)


def _ms(duration: duration_pb2.Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def _name(what: str, value: str) -> str:
    if not value or len(value) > 255 or not all(c.isalnum() or c in "%_-" for c in value):
        code = "ILLEGAL_TOPIC" if what == "topic" else "ILLEGAL_CONSUMER_GROUP"
        raise refused(code, f"{what} {value[:100]!r} must be 1-255 letters, digits, '%', '_' or '-'")
    return value


def _scheme(address: str) -> Any:  # a d.AddressScheme value
    host = address.rpartition(":")[0].strip("[]")
    try:
        return d.IPv6 if ipaddress.ip_address(host).version == 6 else d.IPv4
    except ValueError:
        return d.DOMAIN_NAME


def _endpoints(addresses: list[str]) -> d.Endpoints:
    """One Endpoints of `addresses` (the first's scheme: one Endpoints has one)."""
    scheme = _scheme(addresses[0])
    out = d.Endpoints(scheme=scheme)
    for address in addresses:
        if _scheme(address) == scheme:
            host, _, port = address.rpartition(":")
            out.addresses.append(d.Address(host=host.strip("[]"), port=int(port)))
    return out


class MessagingService(s_grpc.MessagingServiceServicer):
    """The RPCs of `apache.rocketmq.v2.MessagingService` on tidelog (see the module docstring)."""

    def __init__(
        self, cfg: BrokerConfig, advertised: Callable[[], str], replica: Replica | None = None
    ) -> None:
        self.cfg = cfg
        self.advertised = advertised
        # the cluster as a member sees it: with TLS, this broker's own CA and certificate
        # calls and routes through the transport below the clients (docs/ARCHITECTURE.md §2.2)
        self.client = Transport(
            cfg.controllers,
            send_timeout=30.0,
            rpc_timeout=10.0,
            tls=tlsconfig.member_client(cfg.tls),
            # with auth on, the endpoint's own calls are the cluster's: its callers were checked here
            member_secret=cfg.secret if cfg.auth is not None else None,
        )
        self.producer = AsyncProducer(self.client, self.client.send_timeout)
        self.members = Members(self.client)  # its consumers, announced in their groups
        self._in_progress = 0
        # broker address -> (when asked, its RocketMQ endpoint)
        self._rocketmq_at: dict[str, tuple[float, str]] = {}
        self._dlq_ready: set[str] = set()
        # delayed and half messages, kept by this broker's set while it is master
        self.scheduled = None if replica is None else Scheduled(replica, self._send_check)
        self.replica = replica
        # RocketMQ endpoint -> channel: calls passed on to the master that keeps a message (_at_keeper)
        self._master_channels: dict[str, grpc.aio.Channel] = {}
        # the Telemetry streams of producers, by the topics they publish: where checks go
        self._producers: dict[str, list[asyncio.Queue[s.TelemetryCommand | None]]] = {}
        self._keeper_turn = 0  # the set that keeps the next kept message of a topic not here

    async def close(self) -> None:
        await self.members.close()
        await self.client.close()
        for channel in self._master_channels.values():
            await channel.close()

    # --- plumbing ---

    async def _answer(
        self, reply: Callable[..., R], work: Callable[[], Awaitable[R]], context: grpc.aio.ServicerContext
    ) -> R:
        """`work()`'s reply, or `reply(status=...)` for what went wrong (never a gRPC error)."""
        if self._in_progress >= self.cfg.max_concurrent_requests:
            return reply(status=_status(rules.TOO_MANY_REQUESTS, "too many calls in progress on this broker"))
        self._in_progress += 1
        try:
            return await within(work(), _remaining(context))
        except Exception as exc:
            return reply(status=status_of(exc))
        finally:
            self._in_progress -= 1

    async def _route(self, topic: str) -> TopicRoute:
        route = await self.client.route(_name("topic", topic))
        if not route.queue_list:
            raise TopicNotFoundError(f"topic {topic!r} has no queues")
        return route

    async def _broker_set(self, topic: str, name: str) -> BrokerSetRoute:
        bs = (await self._route(topic)).broker_set(name)
        if bs is None:
            raise refused("BAD_REQUEST", f"topic {topic} has no queues in broker {name!r}")
        return bs

    async def _endpoint_at(self, broker: str) -> str:
        """The RocketMQ endpoint of the broker at `broker` ("" if it names none or is down)."""
        now = time.monotonic()
        known = self._rocketmq_at.get(broker)
        if known is not None and now - known[0] < ENDPOINT_TTL_S:
            return known[1]
        found = ""
        try:
            st = await self.client.call_broker(broker, "Status", bpb.StatusRequest(), timeout=2.0)
            found = st.rocketmq_address
        except TidelogError as exc:
            log.info("no RocketMQ endpoint from %s (%s)", broker, exc)
        self._rocketmq_at[broker] = (now, found)
        return found

    def _keeper_of(self, route: TopicRoute) -> tuple[str, str]:
        """The broker set that keeps a DELAY or TRANSACTION message of `route`'s topic sent here
        (and its master's broker address, "" for this broker's own set): this broker's own set
        when it has queues of the topic, so that the producer's Telemetry stream, here, gets the
        checks of its transactions; else the topic's sets in turn."""
        if route.broker_set(self.cfg.broker_set) is not None:
            return self.cfg.broker_set, ""
        self._keeper_turn += 1
        bs = route.broker_sets[self._keeper_turn % len(route.broker_sets)]
        return bs.name, bs.master_address

    async def _master_of(self, topic: str, broker_set: str) -> str:
        """The broker address of `broker_set`'s master as `topic`'s route names it ("" for this
        broker's own set, whose master its replica knows)."""
        if broker_set == self.cfg.broker_set:
            return ""
        bs = (await self._route(topic)).broker_set(broker_set)
        if bs is None:
            raise refused("BAD_REQUEST", f"topic {topic} has no queues in broker {broker_set!r}")
        return bs.master_address

    async def _at_keeper(
        self, method: str, request: Any, context: grpc.aio.ServicerContext, broker_set: str, master: str
    ) -> Any | None:
        """None when this broker is the master of `broker_set` (the call is served here); else the
        same call made on the RocketMQ endpoint of that set's master (broker address `master`; for
        this broker's own set, its replica's master), with the caller's own headers (its signature
        among them), and its reply. Delayed and half messages are kept by a master's log
        (broker/rocketmqtx.py), and a client sends them, ends a transaction and recalls a message
        through whichever endpoint it was given (a route names its access point)."""
        if self.replica is None:
            raise refused(rules.UNSUPPORTED, "DELAY and TRANSACTION messages are served by brokers only")
        if broker_set == self.cfg.broker_set:
            if self.replica.role == MASTER:
                return None
            master = self.replica.master_address
        endpoint = await self._endpoint_at(master) if master else ""
        if not endpoint or endpoint == self.advertised():
            raise UnavailableError(
                f"broker set {broker_set} has no master endpoint to keep this message right now"
            )
        channel = self._master_channels.get(endpoint)
        if channel is None:
            channel = self._master_channels[endpoint] = tlsconfig.aio_channel(endpoint, self.client.tls)
        headers = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if isinstance(v, str) and (k.lower() == "authorization" or k.lower().startswith("x-mq-"))
        )
        stub = s_grpc.MessagingServiceStub(channel)
        try:
            return await getattr(stub, method)(request, metadata=headers, timeout=_remaining(context) or 10.0)
        except grpc.aio.AioRpcError as exc:
            raise UnavailableError(f"the master's RocketMQ endpoint {endpoint}: {exc.details()}") from None

    # --- routes, sessions ---

    async def QueryRoute(
        self, request: s.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> s.QueryRouteResponse:
        async def work() -> s.QueryRouteResponse:
            route = await self._route(request.topic.name)
            asked = [(a.host, a.port) for a in request.endpoints.addresses]
            endpoints = _endpoints(rules.route_addresses(asked, self.advertised()))
            queues = []
            for bs in route.broker_sets:
                broker = d.Broker(name=bs.name, id=0, endpoints=endpoints)
                queues += [
                    d.MessageQueue(
                        topic=request.topic,
                        id=q,
                        permission=d.READ_WRITE,
                        broker=broker,
                        accept_message_types=ACCEPTED_TYPES,
                    )
                    for q in range(bs.queues)
                ]
            return s.QueryRouteResponse(status=OK, message_queues=queues)

        return await self._answer(s.QueryRouteResponse, work, context)

    async def QueryAssignment(
        self, request: s.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> s.QueryAssignmentResponse:
        """Every broker set to every member, as queue ANY_QUEUE (-1), as RocketMQ's proxy assigns
        for pop consumption: a receive reads every queue of the set, and in the shared mode any
        member may receive from any queue."""

        async def work() -> s.QueryAssignmentResponse:
            _name("group", request.group.name)
            asked = s.QueryRouteRequest(topic=request.topic, endpoints=request.endpoints)
            route = await self.QueryRoute(asked, context)
            if route.status.code != d.OK:
                return s.QueryAssignmentResponse(status=route.status)
            assignments: list[Any] = []
            for q in route.message_queues:
                if all(a.message_queue.broker.name != q.broker.name for a in assignments):
                    one = d.MessageQueue()
                    one.CopyFrom(q)
                    one.id = ANY_QUEUE
                    assignments.append(d.Assignment(message_queue=one))
            return s.QueryAssignmentResponse(status=OK, assignments=assignments)

        return await self._answer(s.QueryAssignmentResponse, work, context)

    async def Heartbeat(
        self, request: s.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> s.HeartbeatResponse:
        self.members.seen(request.group.name, _client_id(context))
        return s.HeartbeatResponse(status=OK)

    async def NotifyClientTermination(
        self, request: s.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> s.NotifyClientTerminationResponse:
        self.members.gone(request.group.name, _client_id(context))
        return s.NotifyClientTerminationResponse(status=OK)

    async def Telemetry(
        self, request_iterator: AsyncIterator[s.TelemetryCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[s.TelemetryCommand]:
        """Each Settings the client announces is answered with the settings it is to use; the
        other commands the client sends are read and dropped. A producer's stream also carries
        the checks of its topics' orphaned transactions (RecoverOrphanedTransactionCommand).

        The answer to a stream's first Settings is sent again SETTINGS_AGAIN_S later: the Node.js
        client 1.0.8 starts waiting for it only once it has every topic's route, and one that came
        before was lost to it (its startup then waited for the next, five minutes on)."""
        out: asyncio.Queue[s.TelemetryCommand | None] = asyncio.Queue(CHECK_QUEUE)
        topics: set[str] = set()
        again: list[asyncio.TimerHandle] = []

        def offer(reply: s.TelemetryCommand) -> None:
            with contextlib.suppress(asyncio.QueueFull):
                out.put_nowait(reply)

        async def read() -> None:
            try:
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    async for command in request_iterator:
                        if command.HasField("settings"):
                            self._announced(command.settings, _client_id(context), out, topics)
                            reply = s.TelemetryCommand(status=OK, settings=self._settings(command.settings))
                            await out.put(reply)
                            if not again:
                                loop = asyncio.get_running_loop()
                                again.extend(loop.call_later(t, offer, reply) for t in SETTINGS_AGAIN_S)
            finally:
                with contextlib.suppress(asyncio.QueueFull):
                    out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (command := await out.get()) is not None:
                yield command
        finally:
            reader.cancel()
            for handle in again:
                handle.cancel()
            for t in topics:
                streams = self._producers.get(t, [])
                with contextlib.suppress(ValueError):
                    streams.remove(out)
                if not streams:
                    self._producers.pop(t, None)

    def _announced(
        self,
        settings: d.Settings,
        client_id: str,
        stream: asyncio.Queue[s.TelemetryCommand | None],
        topics: set[str],
    ) -> None:
        """What a client's Settings tell: a consumer is a member of its group while it runs; a
        producer's stream (`stream`) takes the checks of its topics' transactions (added to
        `topics`, which the stream leaves when it ends)."""
        sub = settings.subscription
        if sub.group.name:
            self.members.seen(sub.group.name, client_id, [e.topic.name for e in sub.subscriptions])
        if settings.client_type == d.PRODUCER:
            for t in settings.publishing.topics:
                if t.name not in topics:
                    topics.add(t.name)
                    self._producers.setdefault(t.name, []).append(stream)

    def _send_check(self, topic: str, half: StoredMessage, transaction_id: str) -> None:
        """Ask one producer of `topic` connected here how the transaction of `half` ended (the
        streams take turns); with none connected the check goes nowhere and counts anyway."""
        streams = self._producers.get(topic)
        if not streams:
            log.info("no producer of %s connected to check transaction %s", topic, transaction_id)
            return
        streams.append(streams.pop(0))
        command = s.TelemetryCommand(
            recover_orphaned_transaction_command=s.RecoverOrphanedTransactionCommand(
                message=self._kept_message(topic, half), transaction_id=transaction_id
            )
        )
        try:
            streams[-1].put_nowait(command)
        except asyncio.QueueFull:
            log.warning("a producer of %s reads no checks: transaction %s not checked", topic, transaction_id)

    def _settings(self, theirs: d.Settings) -> d.Settings:
        out = d.Settings()
        out.CopyFrom(theirs)
        consumer = theirs.client_type != d.PRODUCER
        if consumer:
            # the group's retry policy: a push consumer makes a message it failed on invisible for
            # the attempt's delay (the clients read only a customized backoff's whole seconds)
            retry = d.RetryPolicy(
                max_attempts=self.cfg.rocketmq_max_delivery_attempts,
                customized_backoff=d.CustomizedBackoff(
                    next=[duration_pb2.Duration(seconds=s) for s in self.cfg.rocketmq_retry_backoff_s]
                ),
            )
        else:
            retry = d.RetryPolicy(
                max_attempts=3,
                exponential_backoff=d.ExponentialBackoff(
                    initial=duration_pb2.Duration(nanos=10_000_000),
                    max=duration_pb2.Duration(seconds=1),
                    multiplier=2.0,
                ),
            )
        out.backoff_policy.CopyFrom(retry)
        if theirs.client_type == d.PRODUCER:
            out.publishing.max_body_size = self.cfg.max_message_bytes - 64 * 1024
            out.publishing.validate_message_type = True
        elif consumer:
            out.subscription.fifo = False
            out.subscription.receive_batch_size = 32
            if not out.subscription.HasField("long_polling_timeout"):
                out.subscription.long_polling_timeout.FromMilliseconds(rules.DEFAULT_LONG_POLL_MS)
        return out

    # --- sending ---

    async def SendMessage(
        self, request: s.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> s.SendMessageResponse:
        return await self._answer(s.SendMessageResponse, lambda: self._send(request, context), context)

    async def _send(
        self, request: s.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> s.SendMessageResponse:
        if not 1 <= len(request.messages) <= MAX_BATCH:
            raise refused("BAD_REQUEST", f"send 1 to {MAX_BATCH} messages")
        topic = _name("topic", request.messages[0].topic.name)
        if any(m.topic.name != topic for m in request.messages):
            raise refused("ILLEGAL_TOPIC", "the messages of one SendMessage go to one topic")
        route = await self._route(topic)
        # every message is checked before any is sent: a refused request stores nothing
        stored = [_stored(m) for m in request.messages]
        now = int(time.time() * 1000)
        waits = [self._delay(m, now) for m in request.messages]
        kept = any(
            w > 0 or m.system_properties.message_type == d.TRANSACTION
            for m, w in zip(request.messages, waits, strict=True)
        )
        if kept:
            keeper = self._keeper_of(route)
            forwarded = await self._at_keeper("SendMessage", request, context, *keeper)
            if forwarded is not None:
                return cast(s.SendMessageResponse, forwarded)
        here = route.broker_set(self.cfg.broker_set) is not None
        futures = [
            self._send_one(topic, m, st, wait, here)
            for m, st, wait in zip(request.messages, stored, waits, strict=True)
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        entries = [
            out if isinstance(out, s.SendResultEntry) else s.SendResultEntry(status=status_of(out))
            for out in outcomes
        ]
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            return s.SendMessageResponse(status=entries[0].status, entries=entries)
        return s.SendMessageResponse(status=_status("MULTIPLE_RESULTS"), entries=entries)

    def _delay(self, m: d.Message, now_ms: int) -> int:
        """How long DELAY message `m` waits (0: not a DELAY message, or due already)."""
        if m.system_properties.message_type != d.DELAY:
            return 0
        if self.scheduled is None:
            raise refused(rules.UNSUPPORTED, "DELAY messages are served by brokers only")
        at = m.system_properties.delivery_timestamp.ToMilliseconds()
        try:
            return dr.delay_ms(at, now_ms, self.scheduled.max_delay_ms())
        except dr.DeliveryTimeError as exc:
            raise refused("ILLEGAL_DELIVERY_TIME", str(exc)) from None

    async def _send_one(
        self, topic: str, m: d.Message, st: rules.Stored, wait_ms: int, here: bool
    ) -> s.SendResultEntry:
        """Send one message: a delayed one (`wait_ms` > 0) or a half one is kept by this broker's
        set (broker/rocketmqtx.py), which must have queues of the topic (`here`), any other goes
        to its topic through tidelog's producer."""
        born = m.system_properties.born_timestamp.ToMilliseconds() or int(time.time() * 1000)
        kept = m.system_properties.message_type == d.TRANSACTION or wait_ms > 0
        if kept and not here:
            # kept messages are passed on to the master of a set of the topic (_keeper_of): here
            # only when the topic moved away meanwhile; the client retries
            raise UnavailableError(
                f"topic {topic} has no queue in broker set {self.cfg.broker_set}, which keeps "
                "the delayed and transactional messages sent to this endpoint"
            )
        if m.system_properties.message_type == d.TRANSACTION:
            if self.scheduled is None:
                raise refused(rules.UNSUPPORTED, "TRANSACTION messages are served by brokers only")
            scheduled = self.scheduled
            message_id, txid, offset = await self._until_served(
                lambda: scheduled.store_half(topic, m.body, st, born)
            )
            return s.SendResultEntry(status=OK, message_id=message_id, transaction_id=txid, offset=offset)
        if wait_ms > 0 and self.scheduled is not None:
            at = m.system_properties.delivery_timestamp.ToMilliseconds()
            scheduled = self.scheduled
            message_id, offset, recall = await self._until_served(
                lambda: scheduled.store_delayed(topic, m.body, st, at, born)
            )
            return s.SendResultEntry(status=OK, message_id=message_id, offset=offset, recall_handle=recall)
        out: Receipt = await self.producer.send(topic, m.body, st.key, st.tags, st.properties)
        return s.SendResultEntry(status=OK, message_id=out.message_id, offset=out.queue_offset)

    # --- receiving ---

    async def ReceiveMessage(
        self, request: s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[s.ReceiveMessageResponse]:
        """A status, then (when there are messages) the delivery time and the messages."""
        got: list[SharedMessage] = []

        async def work() -> s.ReceiveMessageResponse:
            got.extend(await self._receive(request, context))
            if not got:
                return s.ReceiveMessageResponse(status=_status("MESSAGE_NOT_FOUND", "no new message"))
            return s.ReceiveMessageResponse(status=OK)

        first = await self._answer(s.ReceiveMessageResponse, work, context)
        yield first
        if not got:
            return
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        yield s.ReceiveMessageResponse(delivery_timestamp=now)
        invisible_ms = _ms(request.invisible_duration) or self.cfg.rocketmq_invisible_ms
        for m in got:
            yield s.ReceiveMessageResponse(
                message=self._message(request, m, invisible_ms, _language(context))
            )

    async def _receive(
        self, request: s.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> list[SharedMessage]:
        group = _name("group", request.group.name)
        mq = request.message_queue
        topic = _name("topic", mq.topic.name)
        accepted = _tag_filter(request.filter_expression)
        batch = request.batch_size or 32
        if not 1 <= batch <= MAX_BATCH:
            raise refused("BAD_REQUEST", f"batch_size must be in [1, {MAX_BATCH}]")
        invisible_ms = _ms(request.invisible_duration) or self.cfg.rocketmq_invisible_ms
        self.members.seen(group, _client_id(context), [topic])
        if not 0 < invisible_ms <= MAX_INVISIBLE_MS:
            raise refused("ILLEGAL_INVISIBLE_TIME", "the invisible duration must be in (0, 12h]")
        remaining = _remaining(context)
        wait_ms = rules.long_poll_ms(
            _ms(request.long_polling_timeout), None if remaining is None else int(remaining * 1000)
        )
        # the queue id the client names is not looked at: as RocketMQ's proxy pops by broker, a
        # receive reads every queue of the topic in that broker set (ANY_QUEUE), in turn
        bs = await self._broker_set(topic, mq.broker.name)
        await self._dead_letter_topic(group)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            req = bpb.SharedReceiveRequest(
                group=group,
                topic=topic,
                queue=ANY_QUEUE,
                max_messages=batch,
                invisible_ms=invisible_ms,
                max_attempts=self.cfg.rocketmq_max_delivery_attempts,
                start_latest=False,
                wait_ms=left,
                # a FIFO message's key is its message group: a group's messages go out one at a
                # time, in order, each once the one before it is acknowledged (or dead)
                key_ordered=True,
            )
            timeout = self.client.rpc_timeout + left / 1000
            try:
                reply = await self.client.call_master(topic, bs, "SharedReceive", req, timeout)
            except (UnavailableError, NotMasterError, TopicNotFoundError) as exc:
                # the master of a stale route is gone (killed; its successor not learned yet), or
                # the broker it names does not serve as master (just elected, it takes its role at
                # its next heartbeat; or deposed), or it has not yet heard of a topic just created
                # (brokers learn topics at their next heartbeat, after the route names them): an
                # empty receive, as after a long poll, and the client asks again; meanwhile the
                # route is looked up afresh, which answers TOPIC_NOT_FOUND for a topic deleted
                log.info("receive of %s/%s waits for a master: %s", topic, bs.name, exc)
                self.client.forget_route(topic)
                if time.monotonic() >= deadline:
                    return []
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                bs = await self._broker_set(topic, mq.broker.name)
                continue
            msgs = decode_receive_reply(reply, bs.name, bs.master_address)
            keep = [m for m in msgs if isinstance(m, SharedMessage) and rules.tag_matches(accepted, m.tags)]
            skip: dict[int, list[str]] = {}
            for m in msgs:
                if isinstance(m, SharedMessage) and m not in keep:
                    skip.setdefault(m.queue, []).append(m.receipt)
            for queue, receipts in skip.items():
                # filtered out: finished for this group, as RocketMQ does with a tag filter
                ack = bpb.SharedAckRequest(group=group, topic=topic, queue=queue, receipts=receipts)
                await self.client.call_master(topic, bs, "SharedAck", ack, self.client.rpc_timeout)
            if keep or time.monotonic() >= deadline:
                return keep

    async def _dead_letter_topic(self, group: str) -> None:
        """The group's dead-letter topic (one queue per broker set), created once, as the shared
        consumer of tidelog's own client does: without it, dead messages wait."""
        if group in self._dlq_ready:
            return
        with contextlib.suppress(TopicExistsError):
            await TopicAdmin(self.client).create_topic(dlq_topic(group), queues=1)
        self._dlq_ready.add(group)

    def _rmq_message(
        self,
        topic: d.Resource,
        body: bytes,
        key: str | None,
        tags: str | None,
        properties: dict[str, str],
        language: str = "",
    ) -> d.Message:
        """The RocketMQ form of a stored message (its times and id are the caller's)."""
        loaded = rules.from_stored(key, properties)
        out = d.Message(topic=topic, user_properties=loaded.user_properties, body=body)
        sp = out.system_properties
        if tags:
            sp.tag = tags
        sp.keys.extend(loaded.keys)
        sp.body_digest.type = d.CRC32
        sp.body_digest.checksum = rules.crc32_checksum(body, language)
        sp.body_encoding = d.IDENTITY
        sp.message_type = (
            d.MessageType.Value(loaded.message_type)
            if loaded.message_type in TYPE_NAMES.values()
            else d.NORMAL
        )
        deliver_at = properties.get(rules.PROP_DELIVER_AT, "")
        if deliver_at.isdigit():
            sp.delivery_timestamp.FromMilliseconds(int(deliver_at))
        sp.born_host = loaded.born_host or "unknown"
        sp.store_host = self.advertised()
        if loaded.message_group:
            sp.message_group = loaded.message_group
        return out

    def _kept_message(self, topic: str, half: StoredMessage) -> d.Message:
        """A half message as a producer's TransactionChecker gets it: with the message id its
        producer was given, which its consumers get too once it is committed."""
        out = self._rmq_message(d.Resource(name=topic), half.body, half.key, half.tags, half.properties)
        sp = out.system_properties
        sp.message_id = f"{self.cfg.broker_set}:{half.phys_offset:x}"
        sp.born_timestamp.FromMilliseconds(half.born_ts)
        sp.store_timestamp.FromMilliseconds(half.store_ts)
        return out

    def _message(
        self, request: s.ReceiveMessageRequest, m: SharedMessage, invisible_ms: int, language: str
    ) -> d.Message:
        out = self._rmq_message(request.message_queue.topic, m.body, m.key, m.tags, m.properties, language)
        sp = out.system_properties
        # a delayed or committed message: the id its producer was given when it was kept
        sp.message_id = m.properties.get(rules.PROP_ORIGIN_ID) or f"{m.broker_set}:{m.phys_offset:x}"
        sp.born_timestamp.FromMilliseconds(m.born_ts)
        sp.store_timestamp.FromMilliseconds(m.store_ts)
        sp.receipt_handle = rules.encode_handle(m.broker_set, m.queue, m.receipt)
        sp.queue_id = m.queue
        sp.queue_offset = m.offset
        sp.delivery_attempt = m.delivery_count
        sp.invisible_duration.FromMilliseconds(invisible_ms)
        return out

    async def AckMessage(
        self, request: s.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> s.AckMessageResponse:
        async def work() -> s.AckMessageResponse:
            group = _name("group", request.group.name)
            topic = _name("topic", request.topic.name)
            if not 1 <= len(request.entries) <= MAX_BATCH:
                raise refused("BAD_REQUEST", f"acknowledge 1 to {MAX_BATCH} messages")
            results = await asyncio.gather(
                *(self._ack_one(group, topic, e) for e in request.entries), return_exceptions=True
            )
            entries = [
                s.AckMessageResultEntry(
                    message_id=e.message_id,
                    receipt_handle=e.receipt_handle,
                    status=OK if r is None else status_of(r),
                )
                for e, r in zip(request.entries, results, strict=True)
            ]
            codes = {e.status.code for e in entries}
            status = entries[0].status if len(codes) == 1 else _status("MULTIPLE_RESULTS")
            return s.AckMessageResponse(status=status, entries=entries)

        return await self._answer(s.AckMessageResponse, work, context)

    async def _ack_one(self, group: str, topic: str, entry: s.AckMessageEntry) -> None:
        handle = _handle(entry.receipt_handle)
        bs = await self._broker_set(topic, handle.broker_set)
        req = bpb.SharedAckRequest(group=group, topic=topic, queue=handle.queue, receipts=[handle.receipt])
        await self.client.call_master(topic, bs, "SharedAck", req, self.client.rpc_timeout)

    async def ChangeInvisibleDuration(
        self, request: s.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> s.ChangeInvisibleDurationResponse:
        async def work() -> s.ChangeInvisibleDurationResponse:
            group = _name("group", request.group.name)
            topic = _name("topic", request.topic.name)
            handle = _handle(request.receipt_handle)
            invisible_ms = _ms(request.invisible_duration)
            if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
                raise refused("ILLEGAL_INVISIBLE_TIME", "the invisible duration must be in [0, 12h]")
            bs = await self._broker_set(topic, handle.broker_set)
            req = bpb.SharedChangeInvisibleRequest(
                group=group,
                topic=topic,
                queue=handle.queue,
                receipts=[handle.receipt],
                invisible_ms=invisible_ms,
            )
            reply = await self.client.call_master(
                topic, bs, "SharedChangeInvisible", req, self.client.rpc_timeout
            )
            return s.ChangeInvisibleDurationResponse(
                status=OK, receipt_handle=rules.encode_handle(bs.name, handle.queue, reply.receipts[0])
            )

        return await self._answer(s.ChangeInvisibleDurationResponse, work, context)

    async def ForwardMessageToDeadLetterQueue(
        self, request: s.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> s.ForwardMessageToDeadLetterQueueResponse:
        """The message of the receipt handle goes to `%DLQ%<group>` now (a push consumer that
        gave up on it), through the shared mode's SharedDeadLetter: copy and state in one write."""

        async def work() -> s.ForwardMessageToDeadLetterQueueResponse:
            group = _name("group", request.group.name)
            topic = _name("topic", request.topic.name)
            handle = _handle(request.receipt_handle)
            bs = await self._broker_set(topic, handle.broker_set)
            await self._dead_letter_topic(group)
            req = bpb.SharedDeadLetterRequest(
                group=group, topic=topic, queue=handle.queue, receipt=handle.receipt
            )
            timeout = self.client.rpc_timeout
            await self._until_served(
                lambda: self.client.call_master(topic, bs, "SharedDeadLetter", req, timeout)
            )
            return s.ForwardMessageToDeadLetterQueueResponse(status=OK)

        return await self._answer(s.ForwardMessageToDeadLetterQueueResponse, work, context)

    async def _until_served(self, call: Callable[[], Awaitable[R]]) -> R:
        """`call()`, again while its broker has not learned of a topic just created (the
        dead-letter topic, a topic of a delayed or half message: UNAVAILABLE), for up to DLQ_WAIT_S."""
        deadline = time.monotonic() + DLQ_WAIT_S
        while True:
            try:
                return await call()
            except UnavailableError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.1)

    # --- transactions ---

    async def EndTransaction(
        self, request: s.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> s.EndTransactionResponse:
        """COMMIT moves the half message into its topic, ROLLBACK drops it (broker/rocketmqtx.py),
        whether the producer ends it or its TransactionChecker answers a check."""

        async def work() -> s.EndTransactionResponse:
            topic = _name("topic", request.topic.name)
            if request.resolution not in (d.COMMIT, d.ROLLBACK):
                raise refused("BAD_REQUEST", "the resolution is COMMIT or ROLLBACK")
            if self.scheduled is None:
                raise refused(rules.UNSUPPORTED, "TRANSACTION messages are served by brokers only")
            parsed = rules.decode_transaction_id(request.transaction_id)
            if parsed is not None:  # kept by that set's master (else refused there, below)
                master = await self._master_of(topic, parsed[0])
                forwarded = await self._at_keeper("EndTransaction", request, context, parsed[0], master)
                if forwarded is not None:
                    return cast(s.EndTransactionResponse, forwarded)
            await self.scheduled.end(topic, request.transaction_id, request.resolution == d.COMMIT)
            return s.EndTransactionResponse(status=OK)

        return await self._answer(s.EndTransactionResponse, work, context)

    # --- recalling a delayed message ---

    async def RecallMessage(
        self, request: s.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> s.RecallMessageResponse:
        """A delayed message recalled before it is due is never delivered (broker/rocketmqtx.py);
        one delivered (or recalled) already is refused as RocketMQ refuses it (INTERNAL_SERVER_ERROR,
        "recall failed, timestamp invalid")."""

        async def work() -> s.RecallMessageResponse:
            topic = _name("topic", request.topic.name)
            handle = rules.decode_recall_handle(request.recall_handle)
            if handle is None:
                raise refused(
                    "BAD_REQUEST", f"{request.recall_handle[:200]!r} is not a recall handle tidelog gave"
                )
            if self.scheduled is None:
                raise refused(rules.UNSUPPORTED, "DELAY messages are served by brokers only")
            master = await self._master_of(topic, handle.broker_set)
            forwarded = await self._at_keeper("RecallMessage", request, context, handle.broker_set, master)
            if forwarded is not None:
                return cast(s.RecallMessageResponse, forwarded)
            message_id = await self.scheduled.recall(topic, handle)
            return s.RecallMessageResponse(status=OK, message_id=message_id)

        return await self._answer(s.RecallMessageResponse, work, context)

    # --- not served (yet): an explicit RocketMQ status, never gRPC UNIMPLEMENTED ---

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        return s.UpdateOffsetResponse(status=_not_served("UpdateOffset"))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        return s.GetOffsetResponse(status=_not_served("GetOffset"))

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        return s.QueryOffsetResponse(status=_not_served("QueryOffset"))

    async def SyncLiteSubscription(self, request: Any, context: Any) -> Any:
        return s.SyncLiteSubscriptionResponse(status=_not_served("SyncLiteSubscription (lite topics)"))

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[s.PullMessageResponse]:
        yield s.PullMessageResponse(status=_not_served("PullMessage"))


def _stored(m: d.Message) -> rules.Stored:
    """How message `m` is stored; refused (with the code that says why) if it cannot be."""
    sp = m.system_properties
    if not m.body:
        raise refused("MESSAGE_BODY_EMPTY", "a message needs a body")
    if sp.message_type not in TYPE_NAMES:
        raise refused(
            rules.UNSUPPORTED,
            f"{d.MessageType.Name(sp.message_type)} messages are not served by tidelog yet (NORMAL, FIFO, DELAY and TRANSACTION are)",
        )
    if sp.message_type == d.FIFO and not sp.message_group:
        raise refused("ILLEGAL_MESSAGE_GROUP", "a FIFO message needs a message group")
    if sp.HasField("delivery_timestamp") != (sp.message_type == d.DELAY):
        raise refused(
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
            "a delivery timestamp is for DELAY messages, which need one",
        )
    if sp.message_type in (d.DELAY, d.TRANSACTION) and sp.message_group:
        raise refused("MESSAGE_PROPERTY_CONFLICT_WITH_TYPE", "a message group is for FIFO messages")
    if sp.body_encoding not in (d.IDENTITY, d.ENCODING_UNSPECIFIED):
        raise refused(rules.UNSUPPORTED, "compressed bodies are not served by tidelog yet")
    try:
        return rules.to_stored(
            message_id=sp.message_id,
            message_type=TYPE_NAMES[sp.message_type],
            tag=sp.tag,
            keys=list(sp.keys),
            message_group=sp.message_group,
            born_host=sp.born_host,
            user_properties=dict(m.user_properties),
        )
    except ValueError as exc:
        raise refused("ILLEGAL_MESSAGE_PROPERTY_KEY", str(exc)) from None


def _not_served(what: str) -> d.Status:
    return _status(rules.NOT_IMPLEMENTED, f"{what} is not implemented by tidelog yet")


def _client_id(context: grpc.aio.ServicerContext) -> str:
    """The calling client's id (metadata `x-mq-client-id`, which the official clients send)."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "x-mq-client-id" and isinstance(value, str):
            return value
    return ""


def _language(context: grpc.aio.ServicerContext) -> str:
    """The calling client's language (metadata `x-mq-language`, which the official clients send)."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "x-mq-language" and isinstance(value, str):
            return value
    return ""


def _remaining(context: grpc.aio.ServicerContext) -> float | None:
    left = context.time_remaining()
    return None if left is None else max(0.0, left)


def _handle(text: str) -> rules.Handle:
    handle = rules.decode_handle(text)
    if handle is None:
        raise refused("INVALID_RECEIPT_HANDLE", f"{text[:200]!r} is not a receipt handle tidelog gave")
    return handle


def _tag_filter(expression: d.FilterExpression) -> frozenset[str] | None:
    if expression.type == d.SQL:
        raise refused(rules.UNSUPPORTED, "SQL92 filters are not served by tidelog yet (tag filters are)")
    try:
        return rules.parse_tag_filter(expression.expression)
    except ValueError as exc:
        raise refused("ILLEGAL_FILTER_EXPRESSION", str(exc)) from None


class SignatureCheck(grpc.aio.ServerInterceptor):
    """Refuses every call not signed by a configured access key (rules.refusal) with a reply of the
    call's own type whose status is UNAUTHORIZED, as RocketMQ's proxy answers; the call itself
    never runs. Interceptors see every method, so a call added later cannot be missed."""

    def __init__(self, cfg: BrokerConfig, users: Callable[[], AclState] | None = None) -> None:
        self.secrets = dict(cfg.rocketmq_access_keys)
        self.max_skew_s = cfg.rocketmq_auth_max_skew_s
        self._service = s.DESCRIPTOR.services_by_name["MessagingService"]
        # with auth on: the users of the controller's table too, each call checked against their
        # grants (rules.METHODS); the endpoint's own calls into the cluster are then the cluster's
        # (its client signs with the secret)
        self.users = users

    def _user_key(self, access_key: str) -> str | None:
        user = self.users().user_by_key(access_key) if self.users is not None else None
        return user.signing_key if user is not None else None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        headers = metadata_of(details.invocation_metadata)
        users = self._user_key if self.users is not None else None
        why = rules.refusal(headers, self.secrets, time.time(), self.max_skew_s, users)
        name = details.method.rpartition("/")[2]
        method = self._service.methods_by_name.get(name)
        if handler is None or method is None:
            return handler

        def answer(code: str, reason: str) -> Any:
            log.info("RocketMQ endpoint: %s refused: %s", details.method, reason)
            return getattr(s, method.output_type.name)(status=_status(code, reason))

        if why is not None:
            return _replying(handler, answer("UNAUTHORIZED", why))
        parsed = rules.parse_authorization(headers.get(rules.AUTHORIZATION, ""))
        if self.users is None or parsed is None or parsed[0] in self.secrets:
            return handler  # no auth, or one of the operator's configured access keys
        table = self.users()
        user = table.user_by_key(parsed[0])
        if user is None:  # deleted since the signature was checked
            return _replying(handler, answer("UNAUTHORIZED", "the access key is no longer known"))
        user_name, current = user.name, self.users

        def check(request: Any) -> Any:
            # the table as it is when the request arrives (a stream's grants are those of its start)
            denied = rules.permission_refusal(user_name, current(), name, request)
            return None if denied is None else answer("FORBIDDEN", denied)

        return _checking(handler, check)


def _checking(handler: grpc.RpcMethodHandler, check: Callable[[Any], Any]) -> grpc.RpcMethodHandler:
    """`handler`, answering `check(request)`'s reply instead when it gives one (a streamed request
    is checked with None, before its first message)."""
    de, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            refused = check(request)
            return refused if refused is not None else await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, de, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            refused = check(request)
            if refused is not None:
                yield refused
                return
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, de, ser)
    # MessagingService streams requests only in Telemetry (stream to stream)
    inner_ss = handler.stream_stream

    async def streamed(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        refused = check(None)
        if refused is not None:
            yield refused
            return
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(streamed, de, ser)


def _replying(handler: grpc.RpcMethodHandler, reply: Any) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind that answers `reply` (once, for a stream) and nothing else."""
    de, ser = handler.request_deserializer, handler.response_serializer

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        return reply

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        yield reply

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, de, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(stream, de, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, de, ser)
    return grpc.stream_stream_rpc_method_handler(stream, de, ser)


class RocketMQEndpoint:
    """The second gRPC server of a broker, serving MessagingService."""

    def __init__(
        self,
        cfg: BrokerConfig,
        tls: tlsconfig.ServerTls | None = None,
        replica: Replica | None = None,
        users: Callable[[], AclState] | None = None,
    ) -> None:
        self.cfg = cfg
        self.tls = tls
        self.users = users  # with auth on: the controller's users (SignatureCheck)
        self.address = ""  # what clients are told, once bound
        self.service = MessagingService(cfg, lambda: self.address, replica)
        self._server: grpc.aio.Server | None = None
        self._scheduler: asyncio.Future[None] | None = None

    async def start(self) -> str:
        """Listen on `rocketmq_listen` ("auto": the host of `listen`, a port the system picks);
        returns the advertised address."""
        listen = self.cfg.rocketmq_listen
        host = self.cfg.listen.rpartition(":")[0]
        target = f"{host}:0" if listen == "auto" else listen
        guarded = self.cfg.rocketmq_access_keys or self.cfg.auth is not None
        checks = [SignatureCheck(self.cfg, self.users if self.cfg.auth else None)] if guarded else []
        self._server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=checks)
        s_grpc.add_MessagingServiceServicer_to_server(self.service, self._server)
        try:
            # with TLS, the broker's certificate (RocketMQ clients trust it through their roots:
            # GRPC_DEFAULT_SSL_ROOTS_FILE_PATH)
            port = tlsconfig.add_grpc_port(self._server, target, self.tls)
        except RuntimeError:
            port = 0
        if not port:
            raise ConfigError(
                f"cannot listen on rocketmq_listen {target} (port in use?)", key="rocketmq_listen"
            )
        await self._server.start()
        if self.service.scheduled is not None:
            self._scheduler = asyncio.ensure_future(self.service.scheduled.run())
        adv_host = self.cfg.advertised.rpartition(":")[0]
        self.address = self.cfg.rocketmq_advertise_address or f"{adv_host}:{port}"
        log.info("RocketMQ endpoint listening on %s (advertised %s)", target, self.address)
        return self.address

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
        if self._server is not None:
            await self._server.stop(grace=1.0)
        await self.service.close()
