"""controller RULES.md L0 from the client's side: every heartbeat goes to the leader and a copy to
each other node, at most one copy per node and broker in flight. Two brokers sharing one client
(an embedded cluster's) each get their copy to a slow node: keyed by node alone, the first broker's
copy in flight dropped the second's, and a follower beating in step never heard the second broker,
so a leader change then waited out its whole timeout before failing that broker's master over."""

from __future__ import annotations

import asyncio

import grpc

from tidelog.client.controllers import ControllerClient
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.tasks import within


class _Node(pb_grpc.ControllerBrokerServicer):
    """A controller node that records the heartbeats it is sent; `hold` keeps them unanswered."""

    def __init__(self, *, hold: bool) -> None:
        self.heard: list[tuple[str, int]] = []
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatReply:
        self.heard.append((request.broker_set, request.broker_id))
        self.arrived.set()
        await self.release.wait()
        return pb.HeartbeatReply()


async def _serve(node: _Node) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_ControllerBrokerServicer_to_server(node, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_brokers_sharing_a_client_each_get_a_copy_to_a_slow_node() -> None:
    async def scenario() -> None:
        leader, slow = _Node(hold=False), _Node(hold=True)
        (s1, a1), (s2, a2) = await _serve(leader), await _serve(slow)
        try:
            async with ControllerClient(
                f"{a1},{a2}", total_timeout=5.0, member=True, secret="s" * 32
            ) as client:
                await client.heartbeat("broker-a", 1, epoch=1, max_offset=0)
                await within(slow.arrived.wait(), 5)  # broker 1's copy, held unanswered
                await client.heartbeat("broker-a", 2, epoch=1, max_offset=0)
                await client.heartbeat("broker-b", 1, epoch=1, max_offset=0)
                await client.heartbeat("broker-a", 1, epoch=1, max_offset=0)  # its copy is in flight

                async def all_heard() -> None:
                    while len(slow.heard) < 3:
                        slow.arrived.clear()
                        await slow.arrived.wait()

                await within(all_heard(), 5)
                assert sorted(slow.heard) == [("broker-a", 1), ("broker-a", 2), ("broker-b", 1)]
                assert sorted(leader.heard) == [
                    ("broker-a", 1),
                    ("broker-a", 1),
                    ("broker-a", 2),
                    ("broker-b", 1),
                ]
                slow.release.set()
        finally:
            await s1.stop(0)
            await s2.stop(0)

    asyncio.run(scenario())
