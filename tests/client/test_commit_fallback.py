"""A consumer's commits to one master (client/consumer.py `commit_on_master`): one `CommitOffsets`
call for all its queues there, and, against a broker of a release without that call (it answers
UNIMPLEMENTED, as gRPC does for a method a server lacks), one `CommitOffset` per queue, remembered
so the next commit does not ask again. Over a real gRPC server on a local port."""

from __future__ import annotations

import asyncio

import grpc

from tidelog.client.aio import AsyncClient
from tidelog.client.consumer import commit_on_master
from tidelog.errors import UnsupportedCallError
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc
from tidelog.wire import error_from_rpc, rpc

COMMITS = [(("broker-a", 0), 5), (("broker-a", 3), 7), (("broker-a", 1), 0)]
WANT = [("g", "t", 0, 5), ("g", "t", 3, 7), ("g", "t", 1, 0)]


class _OlderBroker(pb_grpc.BrokerServicer):
    """A broker that knows only the one-commit call (the base class answers UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[str, str, int, int]]]] = []

    @rpc
    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetReply:
        self.calls.append(("CommitOffset", [(request.group, request.topic, request.queue, request.offset)]))
        return pb.CommitOffsetReply()


class _Broker(_OlderBroker):
    @rpc
    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetsReply:
        self.calls.append(("CommitOffsets", [(c.group, c.topic, c.queue, c.offset) for c in request.commits]))
        return pb.CommitOffsetsReply()


async def _commits_seen(servicer: _OlderBroker, rounds: int, commits: list) -> tuple[list, set[str]]:
    server = grpc.aio.server()
    pb_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    single_only: set[str] = set()
    try:
        async with AsyncClient(address) as client:
            for _ in range(rounds):
                await commit_on_master(client, address, "g", "t", commits, single_only)
    finally:
        await server.stop(0)
    return servicer.calls, single_only


def test_a_consumers_commits_to_one_master_go_in_one_call() -> None:
    calls, single_only = asyncio.run(_commits_seen(_Broker(), 1, COMMITS))
    assert calls == [("CommitOffsets", WANT)]
    assert single_only == set()


def test_a_single_commit_keeps_the_one_commit_call() -> None:
    calls, _ = asyncio.run(_commits_seen(_Broker(), 1, COMMITS[:1]))
    assert calls == [("CommitOffset", WANT[:1])]


def test_an_older_broker_gets_one_call_per_queue_and_is_not_asked_again() -> None:
    calls, single_only = asyncio.run(_commits_seen(_OlderBroker(), 2, COMMITS))
    assert calls == [("CommitOffset", [c]) for c in WANT] * 2  # every commit arrived, both rounds
    assert len(single_only) == 1


def test_unimplemented_is_a_typed_error() -> None:
    class _Unimplemented(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNIMPLEMENTED

        def details(self) -> str:
            return "Method not found!"

    err = error_from_rpc(_Unimplemented())
    assert isinstance(err, UnsupportedCallError) and err.code == "UNIMPLEMENTED"
