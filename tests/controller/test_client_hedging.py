"""ControllerClient route calls hedge over the nodes: a silent node costs a short delay, not a timeout.

In-process gRPC servers on loopback stand in for controller nodes: one never answers (a node cut
off by the network keeps its socket open and goes silent), one answers. A route call preferring
the silent node must be answered by the other well within the per-call timeout.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from tests.procs import free_address
from tidelog.client.controllers import HEDGE_AFTER_S, ControllerClient
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc


class _Silent(pb_grpc.ControllerRouteServicer):
    def __init__(self) -> None:
        self.calls = 0

    async def GetRoute(
        self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteReply:
        self.calls += 1
        await asyncio.sleep(60)
        return pb.GetRouteReply()


class _Answers(pb_grpc.ControllerRouteServicer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def GetRoute(
        self, request: pb.GetRouteRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRouteReply:
        self.calls += 1
        return pb.GetRouteReply(topic=request.topic + "@" + self.name)


async def _serve(servicer: pb_grpc.ControllerRouteServicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerRouteServicer_to_server(servicer, server)
    address = free_address()
    server.add_insecure_port(address)
    await server.start()
    return server, address


def test_a_silent_preferred_node_is_hedged_around() -> None:
    async def main() -> tuple[str, float, int, int]:
        silent, answers = _Silent(), _Answers("b")
        s1, a1 = await _serve(silent)
        s2, a2 = await _serve(answers)
        try:
            async with ControllerClient([a1, a2], rpc_timeout=5.0, total_timeout=10.0) as client:
                t0 = time.monotonic()
                reply = await client.get_route("orders")
                took = time.monotonic() - t0
                # the node that answered is asked first next time: no hedge delay
                t1 = time.monotonic()
                await client.get_route("orders")
                again = time.monotonic() - t1
                assert client.leader_hint == a2
                return reply.topic, took, silent.calls, round(again, 3) <= HEDGE_AFTER_S
        finally:
            await s1.stop(None)
            await s2.stop(None)

    topic, took, silent_calls, fast_again = asyncio.run(main())
    assert topic == "orders@b"
    assert silent_calls == 1
    assert took < 2.0, f"the route took {took:.2f}s with the preferred node silent (per-call timeout 5 s)"
    assert fast_again


def test_every_node_silent_fails_within_the_total_budget() -> None:
    async def main() -> float:
        s1, a1 = await _serve(_Silent())
        s2, a2 = await _serve(_Silent())
        try:
            async with ControllerClient([a1, a2], rpc_timeout=0.5, total_timeout=1.5) as client:
                t0 = time.monotonic()
                try:
                    await client.get_route("orders")
                except Exception as exc:  # noqa: BLE001 - the type is asserted below
                    # no controller answered at all: the quorum is away
                    assert type(exc).__name__ == "ControllerUnavailableError", exc
                    return time.monotonic() - t0
                raise AssertionError("a route came from silent nodes")
        finally:
            await s1.stop(None)
            await s2.stop(None)

    assert asyncio.run(main()) < 5.0
