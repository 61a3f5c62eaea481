"""What a broker answers in the controllers' place, so that its address works wherever a
controller's does (docs/ARCHITECTURE.md §7.5).

- `ClusterViewCache` (pure: time passed in) holds the cluster view the controllers' heartbeat
  replies bring (`ClusterView`: every broker set's role and members, every topic) and when a
  controller last answered.
- `BrokerRouteServicer` answers the controllers' route calls (GetRoute, DescribeBrokerSets) from
  that view, with its age in ms: a client whose controllers do not answer still finds masters
  and replicas, and the data plane runs without them.
- `admin_handler` serves the controllers' admin and broker-facing services: ListTopics from the
  view; every other call answers CONTROLLER_NOT_LEADER naming the controller this broker last
  heard from (the caller follows it, as it follows a follower's answer), or, while none has
  answered for `silent_after_s`, CONTROLLER_UNAVAILABLE at once: what needs a controller quorum
  waits visibly instead of hanging.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from tidelog.clusterepoch import EPOCH_KEY
from tidelog.errors import ControllerNotLeaderError, ControllerUnavailableError, TopicNotFoundError
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.wire import abort_with, non_empty, rpc

log = logging.getLogger(__name__)

#: A broker that has heard from no controller for this long says so (CONTROLLER_UNAVAILABLE)
#: instead of pointing callers at one.
SILENT_AFTER_S = 3.0

_SERVICE_PREFIX = "tidelog.controller.v1."


class ClusterViewCache:
    """The last cluster view a controller gave this broker, and when a controller last answered."""

    def __init__(self) -> None:
        self.view: pb.ClusterView | None = None
        self.heard_at: float | None = None  # monotonic time of the last answered heartbeat
        self.leader = ""  # the controller that answered it
        self._names_of: pb.ClusterView | None = None
        self._sorted_names: list[str] = []

    @property
    def version(self) -> int:
        return self.view.version if self.view is not None else 0

    def learn(self, reply: pb.HeartbeatReply, now: float, leader: str) -> None:
        """A heartbeat reply: it confirms the view held (same version) or brings a new one."""
        if reply.HasField("cluster"):
            self.view = reply.cluster
        self.heard_at = now
        self.leader = leader

    def age_ms(self, now: float) -> int:
        """How long ago a controller confirmed the view, in ms; -1 when none has yet."""
        return -1 if self.heard_at is None else int((now - self.heard_at) * 1000)

    def silent(self, now: float, after_s: float = SILENT_AFTER_S) -> bool:
        return self.heard_at is None or now - self.heard_at >= after_s

    def require_view(self) -> pb.ClusterView:
        if self.view is None:
            raise ControllerUnavailableError(
                "this broker holds no cluster view yet (no controller has answered its heartbeat)"
            )
        return self.view

    def route(self, topic: str, now: float) -> pb.GetRouteReply:
        view = self.require_view()
        names = self._names(view)
        i = bisect.bisect_left(names, topic)
        t = view.topics[i] if i < len(names) and names[i] == topic else None
        if t is None:
            raise TopicNotFoundError(
                f"no topic named {topic!r} (as of {self.age_ms(now)} ms ago)", topic=topic
            )
        sets = {b.role.broker_set: b for b in view.broker_sets}
        reply = pb.GetRouteReply(
            topic=t.name, perm=t.perm, metadata_age_ms=self.age_ms(now), from_broker=True
        )
        for name in sorted(t.queues):
            info = sets.get(name)
            route = pb.BrokerSetRoute(broker_set=name, queues=t.queues[name])
            if info is None:
                route.role.broker_set = name
            else:
                route.role.CopyFrom(info.role)
                route.replicas.extend(info.members)
            reply.broker_sets.append(route)
        return reply

    def broker_sets(self, names: list[str], now: float) -> pb.DescribeBrokerSetsReply:
        view = self.require_view()
        reply = pb.DescribeBrokerSetsReply(
            liveness_known=False, metadata_age_ms=self.age_ms(now), from_broker=True
        )
        wanted = set(names)
        reply.broker_sets.extend(b for b in view.broker_sets if not wanted or b.role.broker_set in wanted)
        return reply

    def topics(self, request: pb.ListTopicsRequest, now: float) -> pb.ListTopicsReply:
        """A page of the view's topics, as the controllers' ListTopics pages them (name order,
        after `start_after`, beginning with `prefix`, at most `limit`, 0: all)."""
        view = self.require_view()
        names = self._names(view)
        prefix, after = request.prefix, request.start_after
        start = bisect.bisect_left(names, prefix) if prefix > after else bisect.bisect_right(names, after)
        reply = pb.ListTopicsReply(metadata_age_ms=self.age_ms(now), from_broker=True)
        for i in range(start, len(names)):
            if not names[i].startswith(prefix):
                break
            if request.limit and len(reply.topics) == request.limit:
                reply.next_start_after = names[i - 1]
                break
            reply.topics.append(view.topics[i])
        return reply

    def _names(self, view: pb.ClusterView) -> list[str]:
        if self._names_of is not view:
            self._names_of, self._sorted_names = view, [t.name for t in view.topics]  # sent in name order
        return self._sorted_names

    def elsewhere(self, method: str, now: float) -> ControllerNotLeaderError | ControllerUnavailableError:
        """The answer to a call only the controllers can serve."""
        if self.silent(now) or not self.leader:
            heard = "none ever" if self.heard_at is None else f"none for {now - self.heard_at:.1f} s"
            return ControllerUnavailableError(
                f"{method} needs a controller quorum, and this broker has heard from {heard}"
            )
        return ControllerNotLeaderError(f"a broker does not serve {method}", leader=self.leader)


async def _send_epoch(context: grpc.aio.ServicerContext, epoch: Callable[[], int]) -> None:
    """Name the cluster epoch of the controllers this broker's view came from, as a controller names
    its own: a client that has seen a forced recovery's epoch refuses an answer naming none (0)."""
    await context.send_initial_metadata(((EPOCH_KEY, str(epoch())),))


class BrokerRouteServicer(pb_grpc.ControllerRouteServicer):
    """The controllers' route service, answered from the broker's cluster view."""

    def __init__(self, cache: ClusterViewCache, clock: Callable[[], float], epoch: Callable[[], int]) -> None:
        self.cache = cache
        self.clock = clock
        self.epoch = epoch

    @rpc
    async def GetRoute(
        self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteReply:
        await _send_epoch(context, self.epoch)
        return self.cache.route(non_empty("topic", request.topic), self.clock())

    @rpc
    async def DescribeBrokerSets(
        self, request: pb.DescribeBrokerSetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeBrokerSetsReply:
        await _send_epoch(context, self.epoch)
        return self.cache.broker_sets(list(request.names), self.clock())


def _handlers(
    service: str, cache: ClusterViewCache, clock: Callable[[], float], epoch: Callable[[], int]
) -> dict[str, grpc.RpcMethodHandler]:
    out: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name[service].methods:
        request_cls = getattr(pb, method.input_type.name)
        reply_cls = getattr(pb, method.output_type.name)
        out[method.name] = grpc.unary_unary_rpc_method_handler(
            _answer(method.name, cache, clock, epoch),
            request_deserializer=request_cls.FromString,
            response_serializer=reply_cls.SerializeToString,
        )
    return out


def _answer(
    name: str, cache: ClusterViewCache, clock: Callable[[], float], epoch: Callable[[], int]
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _send_epoch(context, epoch)
        now = clock()
        if name == "ListTopics":
            try:
                return cache.topics(request, now)
            except ControllerUnavailableError as exc:
                await abort_with(context, exc)
        await abort_with(context, cache.elsewhere(name, now))

    return answer


def add_to_server(
    server: grpc.aio.Server, cache: ClusterViewCache, clock: Callable[[], float], epoch: Callable[[], int]
) -> None:
    """Serve the controllers' route, admin and broker-facing services beside the broker's own;
    `epoch()` is the cluster epoch of the controllers the broker follows."""
    pb_grpc.add_ControllerRouteServicer_to_server(BrokerRouteServicer(cache, clock, epoch), server)
    server.add_generic_rpc_handlers(
        tuple(
            grpc.method_handlers_generic_handler(
                _SERVICE_PREFIX + service, _handlers(service, cache, clock, epoch)
            )
            for service in ("ControllerAdmin", "ControllerBroker")
        )
    )
