"""Row 4 of docs/SECURITY.md's probe table and its data-port twins, on a cluster of
deploy/secure.yaml: a user's signed headers, captured, are refused when sent again (same method
or another), a date-only signature is refused on tidelog's ports, a replayed data-port AUTH frame
opens nothing, and a user revoked while its data-port connection is open is refused on it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest

from tests.client.conftest import LocalCluster, tide
from tests.security.conftest import admin, controller_address, raw_call, tls_channel
from tidelog import access
from tidelog import dataport_frames as df
from tidelog.client import AsyncClient
from tidelog.client.dataconn import DataConnection
from tidelog.credentials import Credentials, Signer
from tidelog.errors import PermissionDeniedError, UnauthenticatedError
from tidelog.localcluster import client_env, client_options, client_tls
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import controller_pb2 as cpb

pytestmark = pytest.mark.slow

DESCRIBE = "/tidelog.controller.v1.ControllerRoute/DescribeBrokerSets"
GET_ROUTE = "/tidelog.controller.v1.ControllerRoute/GetRoute"
T = TypeVar("T")


def code_of(call: grpc.UnaryUnaryMultiCallable, body: bytes, metadata: Any) -> grpc.StatusCode:
    try:
        call(body, timeout=15, metadata=metadata)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_captured_signed_headers_are_refused_again_and_on_another_method(secure: LocalCluster) -> None:
    creds = admin(secure)
    with tls_channel(secure, controller_address(secure)) as channel:
        describe, route = raw_call(channel, DESCRIBE), raw_call(channel, GET_ROUTE)
        body = cpb.DescribeBrokerSetsRequest().SerializeToString()
        captured = creds.metadata(method=DESCRIBE)
        assert code_of(describe, body, captured) == grpc.StatusCode.OK
        assert code_of(describe, body, captured) == grpc.StatusCode.UNAUTHENTICATED  # the same again
        fresh = creds.metadata(method=DESCRIBE)  # never used, but made for another method
        route_body = cpb.GetRouteRequest(topic="t").SerializeToString()
        assert code_of(route, route_body, fresh) == grpc.StatusCode.UNAUTHENTICATED
        # RocketMQ's date-only scheme is not taken on tidelog's own ports
        date_only = access.headers(creds.access_key, creds.signing_key, time.time())
        assert code_of(describe, body, date_only) == grpc.StatusCode.UNAUTHENTICATED
        assert code_of(describe, body, creds.metadata(method=DESCRIBE)) == grpc.StatusCode.OK


def cli(c: LocalCluster, *args: str) -> Any:
    out = tide(*args, "--json", env=client_env(c.state()), timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def data_address(c: LocalCluster, topic: str) -> str:
    async def go() -> str:
        async with AsyncClient(c.controllers, **client_options(c.state())) as client:
            route = await client.route(topic)
            master = route.broker_sets[0].master_address
            return str((await client.call_broker(master, "Status", bpb.StatusRequest())).data_address)

    return asyncio.run(go())


def until(what: str, attempt: Callable[[], T], within_s: float = 15.0) -> T:
    """`attempt`'s result once it passes (a user or grant reaches the brokers on a heartbeat)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return attempt()
        except (PermissionDeniedError, UnauthenticatedError):
            assert time.monotonic() < deadline, f"{what}: still refused"
            time.sleep(0.2)


def test_a_replayed_auth_frame_and_a_revoked_users_open_connection_are_refused(secure: LocalCluster) -> None:
    topic = "replayed"
    cli(secure, "topic", "create", topic, "--queues", "1")
    made = cli(secure, "user", "create", "erin")
    cli(secure, "acl", "grant", "erin", "topic", topic, "consume")
    erin = Credentials(made["access_key"], made["secret_key"])
    address = data_address(secure, topic)
    tls = client_tls(secure.state())
    pull = [df.pull_request(df.PullCall(topic, 0, 0, 10, 0, 0))]

    async def pulls(auth: Callable[[], tuple[tuple[str, str], ...]]) -> None:
        conn = DataConnection(address, tls, auth)
        try:
            await conn.call(df.OP_PULL, pull, 5.0)
        finally:
            await conn.close()

    # until the broker knows erin and her grant (fresh signatures: a retried one would be a replay)
    until("erin's first pull", lambda: asyncio.run(pulls(lambda: Signer(erin).extra(df.AUTH_METHOD, None))))
    captured = Signer(erin).extra(df.AUTH_METHOD, None)
    asyncio.run(pulls(lambda: captured))
    with pytest.raises(UnauthenticatedError, match="replay"):
        asyncio.run(pulls(lambda: captured))  # the same AUTH frame on a new connection

    async def revoked_on_open_connection() -> None:
        conn = DataConnection(address, tls, lambda: Signer(erin).extra(df.AUTH_METHOD, None))
        try:
            await conn.call(df.OP_PULL, pull, 5.0)
            transport = conn._transport
            cli(secure, "acl", "revoke", "erin", "topic", topic, "consume")
            deadline = time.monotonic() + 15
            while True:
                try:
                    await conn.call(df.OP_PULL, pull, 5.0)
                except PermissionDeniedError as exc:
                    assert f"erin lacks consume on topic {topic}" in exc.message
                    break
                assert time.monotonic() < deadline, "the revoke never reached the open connection"
                await asyncio.sleep(0.2)
            assert conn._transport is transport  # the same connection, authenticated before the revoke
        finally:
            await conn.close()

    asyncio.run(revoked_on_open_connection())
