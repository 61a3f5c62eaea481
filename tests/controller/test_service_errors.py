"""Bad input answers a typed error over gRPC, and the controller keeps serving afterwards.

Each case sends one bad request, checks the typed error class (and the gRPC status a foreign
client would see), then proves the node still serves with a good request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.controller.inproc import single_node
from tests.controller.simbroker import SimBroker
from tidelog import errors
from tidelog.client.controllers import ControllerClient
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.wire import ERROR_CODE_KEY


async def _still_serving(client: ControllerClient) -> None:
    n = len(await client.meta_list("probe/"))
    await client.meta_create(f"probe/{n}", b"ok")
    assert len(await client.meta_list("probe/")) == n + 1


async def _mastered_set(client: ControllerClient, name: str = "broker-a") -> tuple[SimBroker, SimBroker]:
    b1, b2 = SimBroker(client, name, 1), SimBroker(client, name, 2)
    for b in (b1, b2):
        await b.register()
        await b.beat_once()
        b.start()  # keep them alive for the whole test
    await client.elect_master(name, b1.broker_id)
    return b1, b2


Case = tuple[Coroutine[Any, Any, object], type[errors.TidelogError]]


def _unknown_set_and_stale_epoch_cases(
    client: ControllerClient, b1: SimBroker, role: pb.RoleAssignment
) -> list[Case]:
    """Requests naming a broker set that does not exist, or carrying a stale epoch or a wrong master."""
    return [
        # unknown broker set
        (client.describe_broker_sets(["no-such-set"]), errors.ControllerBrokerMetadataNotExistError),
        (client.elect_master("no-such-set", 1), errors.ControllerBrokerMetadataNotExistError),
        (
            client.heartbeat("no-such-set", 1, epoch=0, max_offset=0),
            errors.ControllerBrokerNeedToBeRegisteredError,
        ),
        (
            client.alter_sync_state_set("no-such-set", 1, 1, {1}, 1),
            errors.ControllerAlterSyncStateSetFailedError,
        ),
        # stale epochs
        (
            client.alter_sync_state_set(
                "broker-a", b1.broker_id, role.master_epoch - 1, {1, 2}, role.sync_state_set_epoch
            ),
            errors.ControllerFencedMasterEpochError,
        ),
        (
            client.alter_sync_state_set(
                "broker-a", b1.broker_id, role.master_epoch, {1, 2}, role.sync_state_set_epoch + 5
            ),
            errors.ControllerFencedSyncStateSetEpochError,
        ),
        (
            client.alter_sync_state_set("broker-a", 2, role.master_epoch, {1, 2}, role.sync_state_set_epoch),
            errors.ControllerInvalidMasterError,
        ),
    ]


def _malformed_cases(client: ControllerClient) -> list[Case]:
    """Malformed requests (and oversized metadata, which never reaches the Raft log)."""
    return [
        # malformed
        (client.create_topic("", {"broker-a": 4}), errors.InvalidArgumentError),
        (client.create_topic("t", {}), errors.InvalidArgumentError),
        (client.create_topic("t", {"broker-a": -1}), errors.InvalidArgumentError),
        (client.create_topic("t", {"broker-a": 4}, perm="x"), errors.InvalidArgumentError),
        (client.create_topic("bad name!", {"broker-a": 4}), errors.InvalidArgumentError),
        (client.heartbeat("broker-a", -1, epoch=0, max_offset=0), errors.InvalidArgumentError),
        (client.elect_master("broker-a", -3), errors.InvalidArgumentError),
        (
            client.register_broker("", "127.0.0.1:1", "127.0.0.1:2", identity="x"),
            errors.InvalidArgumentError,
        ),
        (
            client.register_broker("broker-a", "not-an-address", "127.0.0.1:2", identity="x"),
            errors.InvalidArgumentError,
        ),
        (
            client.register_broker("broker-a", "127.0.0.1:1", "127.0.0.1:2", identity=""),
            errors.InvalidArgumentError,
        ),
        (
            client.register_broker("broker-a", "127.0.0.1:1", "127.0.0.1:2", identity="x", broker_id=-2),
            errors.InvalidArgumentError,
        ),
        (client.alter_sync_state_set("broker-a", 1, 1, [], 1), errors.InvalidArgumentError),
        (client.alter_sync_state_set("broker-a", 1, 1, [1, -2], 1), errors.InvalidArgumentError),
        (client.clean_broker_data("broker-a", [-1]), errors.InvalidArgumentError),
        (client.meta_create("", b"v"), errors.InvalidArgumentError),
        (client.meta_cas("k", b"v", -1), errors.InvalidArgumentError),
        # oversized metadata never reaches the Raft log
        (client.meta_create("big", b"x" * ((1 << 20) + 1)), errors.MetadataTooLargeError),
    ]


def _state_cases(client: ControllerClient, b1: SimBroker) -> list[Case]:
    """Well-formed requests that the current state refuses (missing things, a taken id, a live master)."""
    return [
        # answers about state
        (client.get_route("no-such-topic"), errors.TopicNotFoundError),
        (client.delete_topic("no-such-topic"), errors.TopicNotFoundError),
        (client.meta_get("no/such/key"), errors.MetadataNotFoundError),
        (client.create_topic("t", {"no-such-set": 4}), errors.ControllerBrokerMetadataNotExistError),
        (
            client.register_broker(
                "broker-a", "127.0.0.1:1", "127.0.0.1:2", identity="impostor", broker_id=b1.broker_id
            ),
            errors.ControllerBrokerIdInvalidError,
        ),
        (client.elect_master("broker-a", b1.broker_id), errors.ControllerMasterStillExistError),
    ]


async def _each_case_raises_and_the_node_serves(client: ControllerClient, cases: list[Case]) -> None:
    """Each case raises its typed error, and the node still serves a good request after each."""
    for call, expected in cases:
        with pytest.raises(expected):
            await call
        await _still_serving(client)


def test_bad_requests_answer_typed_errors_and_the_node_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (_node, client):
            b1, b2 = await _mastered_set(client)
            role = (await client.describe_broker_sets(["broker-a"])).broker_sets[0].role
            cases = (
                _unknown_set_and_stale_epoch_cases(client, b1, role)
                + _malformed_cases(client)
                + _state_cases(client, b1)
            )
            await _each_case_raises_and_the_node_serves(client, cases)
            assert not await client.meta_list("big")
            await b1.stop()
            await b2.stop()

    asyncio.run(scenario())


def test_a_raw_grpc_client_sees_status_and_error_code(tmp_path: Path) -> None:
    """A client without our wire helpers still gets a proper status and the code in metadata."""

    async def scenario() -> None:
        async with single_node(tmp_path) as (node, client):
            async with grpc.aio.insecure_channel(node.cfg.self_node.grpc) as channel:
                stub = pb_grpc.ControllerAdminStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.CreateTopic(pb.CreateTopicRequest(name="", queues={"a": 1}), timeout=5)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                md = dict(info.value.trailing_metadata() or ())
                assert md[ERROR_CODE_KEY] == "INVALID_ARGUMENT"
                assert "name" in (info.value.details() or "")

                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.MetaGet(pb.MetaGetRequest(key="missing"), timeout=5)
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
                assert dict(info.value.trailing_metadata() or ())[ERROR_CODE_KEY] == "METADATA_NOT_FOUND"

                reply = await stub.ClusterStatus(pb.ClusterStatusRequest(), timeout=5)
                assert reply.raft_state == "leader"
            await _still_serving(client)

    asyncio.run(scenario())


def test_metadata_compare_and_set_and_delete(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (_node, client):
            e = await client.meta_create("ledgers/1", b"open")
            assert (e.version, e.value) == (1, b"open")
            with pytest.raises(errors.MetadataExistsError):
                await client.meta_create("ledgers/1", b"again")
            e = await client.meta_cas("ledgers/1", b"closed", 1)
            assert (e.version, e.value) == (2, b"closed")
            with pytest.raises(errors.MetadataVersionMismatchError):
                await client.meta_cas("ledgers/1", b"lost", 1)
            await client.meta_create("ledgers/2", b"")
            await client.meta_create("other/1", b"x")
            assert [m.key for m in await client.meta_list("ledgers/")] == ["ledgers/1", "ledgers/2"]
            with pytest.raises(errors.MetadataVersionMismatchError):
                await client.meta_delete("ledgers/1", expected_version=1)
            await client.meta_delete("ledgers/1", expected_version=2)
            await client.meta_delete("ledgers/2")
            assert [m.key for m in await client.meta_list("")] == ["other/1"]

    asyncio.run(scenario())
