"""The controller client with brokers in its list (docs/ARCHITECTURE.md §7.5), and the broker's
side of it (`broker/lookups.py`), without processes.

In-process gRPC servers on loopback stand in for a silent controller (a stopped or cut-off node
keeps its socket open and answers nothing) and for a broker serving lookups from its cluster view.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.procs import free_address
from tidelog.broker import lookups
from tidelog.client.controllers import ControllerClient
from tidelog.controller import state as cst
from tidelog.controller.service import cluster_view_of
from tidelog.errors import (
    ClusterEpochFencedError,
    ControllerNotLeaderError,
    ControllerUnavailableError,
    TopicNotFoundError,
)
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc

BROKER = "127.0.0.1:1"


def view(master_epoch: int = 3) -> pb.ClusterView:
    role = pb.RoleAssignment(
        broker_set="broker-a", has_master=True, master_id=1, master_address=BROKER, master_epoch=master_epoch
    )
    members = [pb.MemberInfo(broker_id=1, address=BROKER), pb.MemberInfo(broker_id=2, address="127.0.0.1:2")]
    return pb.ClusterView(
        version=7,
        broker_sets=[pb.BrokerSetInfo(role=role, members=members)],
        topics=[pb.TopicConfig(name="t", queues={"broker-a": 4}, perm="rw", generation=1)],
    )


def cache_with(
    v: pb.ClusterView | None, heard_at: float, leader: str = "127.0.0.1:9"
) -> lookups.ClusterViewCache:
    cache = lookups.ClusterViewCache()
    reply = pb.HeartbeatReply()
    if v is not None:
        reply.cluster.CopyFrom(v)
    cache.learn(reply, heard_at, leader)
    return cache


def test_a_broker_routes_from_its_view_and_says_how_old_it_is() -> None:
    cache = cache_with(view(), heard_at=100.0)
    reply = cache.route("t", now=102.5)
    assert reply.from_broker and reply.metadata_age_ms == 2500
    (route,) = reply.broker_sets
    assert route.queues == 4 and route.role.master_address == BROKER and len(route.replicas) == 2
    with pytest.raises(TopicNotFoundError):
        cache.route("other", now=102.5)
    assert [b.role.broker_set for b in cache.broker_sets(["broker-a"], 101.0).broker_sets] == ["broker-a"]
    assert cache.broker_sets(["nope"], 101.0).broker_sets == []
    assert [t.name for t in cache.topics(pb.ListTopicsRequest(), 101.0).topics] == ["t"]


def test_a_heartbeat_without_a_view_keeps_the_one_held_and_refreshes_its_age() -> None:
    cache = cache_with(view(), heard_at=100.0)
    cache.learn(pb.HeartbeatReply(), 150.0, "127.0.0.1:9")  # same version: nothing sent
    assert cache.version == 7 and cache.route("t", now=150.0).metadata_age_ms == 0


def test_without_a_view_a_broker_says_controller_unavailable() -> None:
    with pytest.raises(ControllerUnavailableError):
        lookups.ClusterViewCache().route("t", now=1.0)


@given(st.floats(min_value=0.0, max_value=100.0))
def test_other_calls_point_at_the_controller_until_it_falls_silent(silence: float) -> None:
    cache = cache_with(view(), heard_at=1000.0, leader="127.0.0.1:9")
    answer = cache.elsewhere("CreateTopic", now=1000.0 + silence)
    if silence < lookups.SILENT_AFTER_S:
        assert isinstance(answer, ControllerNotLeaderError) and answer.leader == "127.0.0.1:9"
    else:
        assert isinstance(answer, ControllerUnavailableError) and answer.retryable


@given(
    st.lists(st.text("abc", min_size=1, max_size=3), unique=True),
    st.text("abc", max_size=2),
    st.integers(0, 4),
)
def test_a_broker_pages_topics_as_the_controllers_do(names: list[str], prefix: str, limit: int) -> None:
    v = pb.ClusterView(version=1, topics=[pb.TopicConfig(name=n) for n in sorted(names)])
    cache = cache_with(v, heard_at=0.0)
    wanted = [n for n in sorted(names) if n.startswith(prefix)]
    got: list[str] = []
    after = ""
    for _ in range(len(names) + 2):
        page = cache.topics(pb.ListTopicsRequest(prefix=prefix, start_after=after, limit=limit), 1.0)
        got += [t.name for t in page.topics]
        after = page.next_start_after
        if not after:
            break
    assert got == wanted


def test_the_controllers_view_is_the_same_for_the_same_state_and_changes_with_it() -> None:
    state = cst.ControllerState()
    a = cluster_view_of(state, ["127.0.0.1:9"])
    assert a == cluster_view_of(state, ["127.0.0.1:9"]) and a.version != 0
    assert cluster_view_of(state, ["127.0.0.1:8"]).version != a.version


class _Silent(pb_grpc.ControllerRouteServicer):
    async def GetRoute(
        self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteReply:
        await asyncio.sleep(60)
        return pb.GetRouteReply()


class _SilentAdmin(pb_grpc.ControllerAdminServicer):
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicReply:
        await asyncio.sleep(60)
        return pb.CreateTopicReply()


def _silent_controller(server: grpc.aio.Server) -> None:
    pb_grpc.add_ControllerRouteServicer_to_server(_Silent(), server)
    pb_grpc.add_ControllerAdminServicer_to_server(_SilentAdmin(), server)


async def _serve(add: object) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add(server)  # type: ignore[operator]
    address = free_address()
    server.add_insecure_port(address)
    await server.start()
    return server, address


def test_a_route_comes_from_a_broker_while_the_controller_is_silent_and_a_create_fails_fast() -> None:
    async def main() -> None:
        cache = cache_with(view(), heard_at=time.monotonic() - 10)  # silent for 10 s
        s1, controller = await _serve(_silent_controller)
        s2, broker = await _serve(lambda s: lookups.add_to_server(s, cache, time.monotonic, lambda: 0))
        try:
            client = ControllerClient(controller, rpc_timeout=3.0, total_timeout=15.0, quorum_timeout=2.0)
            async with client:
                client.learn_brokers([broker])
                started = time.monotonic()
                reply = await client.get_route("t")
                assert reply.from_broker and client.last_lookup_age_ms >= 10_000
                assert time.monotonic() - started < 3.0  # well within the silent node's per-call timeout
                assert client.leader_hint == controller  # a broker is never the first one asked
                started = time.monotonic()
                with pytest.raises(ControllerUnavailableError):
                    await client.create_topic("u", {"broker-a": 1})
                # the quorum timeout, not the whole budget
                assert time.monotonic() - started < 8.0
        finally:
            await s1.stop(None)
            await s2.stop(None)

    asyncio.run(main())


def test_a_brokers_lookup_names_its_cluster_epoch_so_a_client_past_a_recovery_takes_it() -> None:
    """After a forced recovery (cluster epoch 2) a client refuses answers of an older epoch; a broker
    following the recovered controllers answers lookups as of epoch 2, and is taken. One still at
    epoch 1 (it follows the replaced cluster) is refused."""

    async def main() -> None:
        cache = cache_with(view(), heard_at=time.monotonic())
        s1, controller = await _serve(_silent_controller)
        s2, broker = await _serve(lambda s: lookups.add_to_server(s, cache, time.monotonic, lambda: 2))
        s3, stale = await _serve(lambda s: lookups.add_to_server(s, cache, time.monotonic, lambda: 1))
        try:
            client = ControllerClient(
                controller, rpc_timeout=3.0, total_timeout=15.0, quorum_timeout=2.0, cluster_epoch=2
            )
            async with client:
                client.learn_brokers([broker])
                reply = await client.get_route("t")
                assert reply.from_broker and [b.broker_set for b in reply.broker_sets] == ["broker-a"]
            with pytest.raises(ClusterEpochFencedError):
                async with ControllerClient(
                    stale, rpc_timeout=3.0, total_timeout=3.0, cluster_epoch=2
                ) as old:
                    await old.call("route", "GetRoute", pb.GetRouteRequest(topic="t"), address=stale)
        finally:
            for server in (s1, s2, s3):
                await server.stop(None)

    asyncio.run(main())
