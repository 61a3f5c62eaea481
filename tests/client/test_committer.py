"""A client's group commits (client/committer.py) against a real gRPC server on a local port that
records every call: one member's commits to one master in one `CommitOffsets` call; many groups'
commits made at once in few calls, each arriving, in order; a refused commit failing its own
member only; an answer about the master failing every member without more calls; and, against a
broker of a release without `CommitOffsets` (it answers UNIMPLEMENTED, as gRPC does for a method a
server lacks), one `CommitOffset` per commit, remembered so the next commit does not ask again.
This server has no data port (its Status is UNIMPLEMENTED): the calls are gRPC's; the data port's
COMMITS frame is proven against real brokers in test_commits_cluster.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from tidelog import dataport_frames as df
from tidelog.client.aio import AsyncClient
from tidelog.client.consumer import commit_on_master
from tidelog.errors import InvalidArgumentError, NotMasterError, UnavailableError, UnsupportedCallError
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc as pb_grpc
from tidelog.tasks import within
from tidelog.wire import error_from_rpc, rpc

COMMITS = [(("broker-a", 0), 5), (("broker-a", 3), 7), (("broker-a", 1), 0)]
WANT = [("g", "t", 0, 5), ("g", "t", 3, 7), ("g", "t", 1, 0)]
REFUSED = 666  # the offset the recording broker refuses, as a master refuses one past a queue's end

Commit = tuple[str, str, int, int]


class _OlderBroker(pb_grpc.BrokerServicer):
    """A broker that knows only the one-commit call (the base class answers UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Commit]]] = []  # every call that wrote its commits

    @rpc
    async def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetReply:
        self.calls.append(("CommitOffset", [(request.group, request.topic, request.queue, request.offset)]))
        return pb.CommitOffsetReply()


class _Broker(_OlderBroker):
    def __init__(self, not_master: bool = False, not_master_after_refusal: bool = False) -> None:
        super().__init__()
        self.not_master = not_master
        self.not_master_after_refusal = not_master_after_refusal
        self.refused: list[list[Commit]] = []  # every call refused whole
        self.gate: asyncio.Event | None = None  # set: every call waits for it
        self.arrived: asyncio.Event | None = None  # given: set when a call arrives

    @rpc
    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CommitOffsetsReply:
        commits = [(c.group, c.topic, c.queue, c.offset) for c in request.commits]
        if self.arrived is not None:
            self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.not_master:
            self.refused.append(commits)
            raise NotMasterError("not the master of broker-a")
        if any(c[3] == REFUSED for c in commits):
            self.refused.append(commits)  # one refused refuses them all: nothing is written
            self.not_master = self.not_master_after_refusal
            raise InvalidArgumentError(f"offset {REFUSED} is beyond the end of t/0")
        self.calls.append(("CommitOffsets", commits))
        return pb.CommitOffsetsReply()


async def _against(
    servicer: _OlderBroker, run: Callable[[AsyncClient, str], Awaitable[Any]], **options: Any
) -> Any:
    server = grpc.aio.server()
    pb_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        async with AsyncClient(address, **options) as client:
            return await run(client, address)
    finally:
        await server.stop(0)


async def _many_groups_at_once(client: AsyncClient, address: str, offsets: list[int]) -> list[Any]:
    """Group i commits offsets[i], all at once: the answer each member got (None: written)."""
    return await asyncio.gather(
        *(client.commits.commit(address, [(f"g{i}", "t", 0, o)]) for i, o in enumerate(offsets)),
        return_exceptions=True,
    )


def test_a_members_commits_to_one_master_go_in_one_call() -> None:
    broker = _Broker()
    asyncio.run(_against(broker, lambda c, a: commit_on_master(c, a, "g", "t", COMMITS)))
    assert broker.calls == [("CommitOffsets", WANT)]


def test_many_groups_committing_at_once_cost_two_calls_and_every_commit_arrives_in_order() -> None:
    broker = _Broker()
    offsets = list(range(50))
    answers = asyncio.run(_against(broker, lambda c, a: _many_groups_at_once(c, a, offsets)))
    assert answers == [None] * 50
    # the first found the master idle and left alone; the 49 behind it left together
    assert [len(commits) for _, commits in broker.calls] == [1, 49]
    assert [c for _, commits in broker.calls for c in commits] == [(f"g{i}", "t", 0, i) for i in offsets]


def test_a_refused_commit_fails_its_own_member_and_the_others_are_written() -> None:
    broker = _Broker()
    offsets = [1, 2, REFUSED, 4, 5]
    answers = asyncio.run(_against(broker, lambda c, a: _many_groups_at_once(c, a, offsets)))
    assert [a is None for a in answers] == [True, True, False, True, True]
    assert isinstance(answers[2], InvalidArgumentError)
    written = [c for _, commits in broker.calls for c in commits]
    assert written == [(f"g{i}", "t", 0, o) for i, o in enumerate(offsets) if o != REFUSED]
    # the call carrying the refused one was refused whole, then split in halves down to it
    g = [(f"g{i}", "t", 0, o) for i, o in enumerate(offsets)]
    assert broker.refused == [g[1:], g[1:3], g[2:3]]


def test_a_group_refused_in_every_call_costs_a_few_calls_not_one_per_group() -> None:
    broker = _Broker()
    offsets = [7] * 64 + [REFUSED]
    answers = asyncio.run(_against(broker, lambda c, a: _many_groups_at_once(c, a, offsets)))
    assert [a is None for a in answers] == [True] * 64 + [False]
    assert len(broker.calls) + len(broker.refused) <= 2 + 2 * 7  # halves: about 2 log2(64) calls


def test_a_split_stops_at_an_answer_about_the_master_and_gives_it_to_the_rest() -> None:
    broker = _Broker(not_master_after_refusal=True)
    offsets = [1, REFUSED, 3, 4, 5, 6]
    answers = asyncio.run(_against(broker, lambda c, a: _many_groups_at_once(c, a, offsets)))
    assert answers[0] is None  # it left alone, before the refusal
    assert all(isinstance(a, NotMasterError) for a in answers[1:])
    # the refused call of five, then one half that met NOT_MASTER: the other half was not sent
    assert [len(c) for c in broker.refused] == [5, 2]


def test_calls_stay_spaced_across_a_pause_in_commits() -> None:
    """Commits that trickle in, each after the last call was answered, still leave at most one
    call per interval: the pace is not forgotten while its spacing runs."""
    broker = _Broker()

    async def trickle(client: AsyncClient, address: str) -> None:
        async def one(i: int) -> None:
            await asyncio.sleep(i * 0.005)
            await client.commits.commit(address, [(f"g{i}", "t", 0, i)])

        await asyncio.gather(*(one(i) for i in range(20)))

    asyncio.run(_against(broker, trickle, commit_interval_ms=1000))
    assert len(broker.calls) <= 3, [len(c) for _, c in broker.calls]  # 20 when each left at once
    assert sorted(c for _, commits in broker.calls for c in commits) == sorted(
        (f"g{i}", "t", 0, i) for i in range(20)
    )


def test_a_closing_client_answers_every_member_waiting_or_in_a_call_out() -> None:
    broker = _Broker()

    async def close_midway(client: AsyncClient, address: str) -> list[Any]:
        broker.gate, broker.arrived = asyncio.Event(), asyncio.Event()  # the first call never answers
        members = [
            asyncio.ensure_future(client.commits.commit(address, [(f"g{i}", "t", 0, i)])) for i in range(5)
        ]
        await broker.arrived.wait()  # the first call is out, the others wait behind it
        await client.close()
        return await within(asyncio.gather(*members, return_exceptions=True), 5)

    answers = asyncio.run(_against(broker, close_midway))
    assert all(isinstance(a, UnavailableError) for a in answers), answers


def test_a_client_closed_before_its_call_started_answers_the_member() -> None:
    async def close_at_once(client: AsyncClient, address: str) -> Any:
        member = asyncio.ensure_future(client.commits.commit(address, [("g", "t", 0, 1)]))
        await asyncio.sleep(0)  # the commit is handed to a call whose task has not run yet
        await client.close()
        return await within(asyncio.gather(member, return_exceptions=True), 5)

    [answer] = asyncio.run(_against(_Broker(), close_at_once))
    assert isinstance(answer, UnavailableError)


def test_a_member_that_gave_up_before_its_call_left_is_not_sent() -> None:
    broker = _Broker()

    async def give_up(client: AsyncClient, address: str) -> None:
        broker.gate, broker.arrived = asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(client.commits.commit(address, [("first", "t", 0, 1)]))
        await broker.arrived.wait()
        quitter = asyncio.ensure_future(client.commits.commit(address, [("quitter", "t", 0, 2)]))
        await asyncio.sleep(0)  # its commit waits behind the call out
        quitter.cancel()
        broker.gate.set()
        await first
        # units leave in order: once a later commit is written, a call carrying the quitter's
        # would have left before or with it
        await client.commits.commit(address, [("last", "t", 0, 3)])

    asyncio.run(_against(broker, give_up, commit_interval_ms=100))
    assert broker.calls == [
        ("CommitOffsets", [("first", "t", 0, 1)]),
        ("CommitOffsets", [("last", "t", 0, 3)]),
    ]


def test_an_answer_about_the_master_fails_every_member_and_is_not_asked_again_per_member() -> None:
    broker = _Broker(not_master=True)
    answers = asyncio.run(_against(broker, lambda c, a: _many_groups_at_once(c, a, list(range(6)))))
    assert all(isinstance(a, NotMasterError) for a in answers)
    assert [len(commits) for commits in broker.refused] == [1, 5]  # two calls, none split


def test_an_older_broker_gets_one_call_per_commit_and_is_not_asked_again() -> None:
    broker = _OlderBroker()

    async def twice(client: AsyncClient, address: str) -> int:
        for _ in range(2):
            await commit_on_master(client, address, "g", "t", COMMITS)
        return client.commits.calls

    calls = asyncio.run(_against(broker, twice))
    assert broker.calls == [("CommitOffset", [c]) for c in WANT] * 2  # every commit arrived, both rounds
    assert calls == 1 + 6  # CommitOffsets asked once (UNIMPLEMENTED), then one call per commit


def test_a_data_port_older_than_the_commits_frame_gets_grpc_from_then_on() -> None:
    """A data port that answers COMMITS as an unknown operation (a broker of an earlier release)
    wrote nothing: the commits go by gRPC, and the frame is not offered to it again."""
    broker = _Broker()
    offered: list[int] = []

    async def older_data_port(address: str, op: int, parts: list[bytes], timeout: float) -> bytes:
        offered.append(op)
        raise InvalidArgumentError(f"{df.UNKNOWN_OP} {op}")

    async def twice(client: AsyncClient, address: str) -> None:
        client.over_data_port = older_data_port  # type: ignore[method-assign]
        for _ in range(2):
            await commit_on_master(client, address, "g", "t", COMMITS)

    asyncio.run(_against(broker, twice))
    assert offered == [df.OP_COMMITS]
    assert broker.calls == [("CommitOffsets", WANT)] * 2


@pytest.mark.parametrize("interval", [-1, 60_001, 0.5, True, "50"])
def test_the_commit_interval_is_checked_where_the_client_is_made(interval: Any) -> None:
    async def make() -> None:
        AsyncClient("127.0.0.1:1", commit_interval_ms=interval)

    with pytest.raises(InvalidArgumentError, match="commit_interval_ms"):
        asyncio.run(make())


def test_unimplemented_is_a_typed_error() -> None:
    class _Unimplemented(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNIMPLEMENTED

        def details(self) -> str:
            return "Method not found!"

    err = error_from_rpc(_Unimplemented())
    assert isinstance(err, UnsupportedCallError) and err.code == "UNIMPLEMENTED"
