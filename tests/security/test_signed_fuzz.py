"""Fuzzers on the authenticated entry points (docs/SECURITY.md, probe 10), over a cluster of
deploy/secure.yaml: Hypothesis-generated requests signed with the admin's valid credentials, to
every method of the broker's and the controller's client-facing gRPC services and to the data
port's operations. Each call gets a valid answer or a typed error (a tidelog error code whose
gRPC status it maps to; never INTERNAL or UNKNOWN), the processes stay up, and a good request
made after them works.

Left out: the controller's members-only service (ControllerBroker: signed by the cluster secret,
not a user; fuzzed in process by tests/fuzz/test_grpc.py), and the admin methods whose valid
requests legitimately disrupt the cluster under test (elections, decommissions, placement repair,
broker data cleaning, user deletion and revocation)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.client.conftest import LocalCluster
from tests.fuzz.grpcmsg import messages
from tests.security.conftest import admin, broker_config, controller_address, secure, tls_channel  # noqa: F401
from tidelog import dataport_frames as df
from tidelog import tlsconfig
from tidelog.errors import by_code
from tidelog.proto import broker_pb2, controller_pb2, ledger_pb2
from tidelog.tasks import within
from tidelog.wire import ERROR_CODE_KEY

pytestmark = pytest.mark.slow

# valid requests of these change the cluster under test (an admin may): not fuzzed here
DISRUPTIVE = {
    "ElectMaster",
    "CleanBrokerData",
    "DecommissionBroker",
    "RepairPlacement",
    "DeleteUser",
    "RevokeAcl",
}
LONG_POLLS = {"Pull", "SharedReceive"}  # a random wait may outlast the call's deadline: by design
GOOD_TOPIC = "fuzz-good-topic-q7"
EXAMPLES = 60


def _methods(services: list[Any]) -> list[tuple[str, str, Any, Any]]:
    """(full method path, name, request class, reply class) of every method of `services`."""
    out = []
    for s in services:
        for m in s.methods:
            if m.name not in DISRUPTIVE:
                out.append(
                    (
                        f"/{s.full_name}/{m.name}",
                        m.name,
                        GetMessageClass(m.input_type),
                        GetMessageClass(m.output_type),
                    )
                )
    return out


BROKER = _methods(
    [broker_pb2.DESCRIPTOR.services_by_name["Broker"], ledger_pb2.DESCRIPTOR.services_by_name["Ledger"]]
)
CONTROLLER = _methods(
    [
        controller_pb2.DESCRIPTOR.services_by_name["ControllerRoute"],
        controller_pb2.DESCRIPTOR.services_by_name["ControllerAdmin"],
    ]
)


def _request(methods: list[tuple[str, str, Any, Any]]) -> st.SearchStrategy[tuple[Any, bytes]]:
    """A method and a request body: a generated message of its type, or raw bytes."""
    return st.sampled_from(methods).flatmap(
        lambda m: st.one_of(messages(m[2].DESCRIPTOR), st.binary(max_size=200)).map(
            lambda msg: (m, msg if isinstance(msg, bytes) else msg.SerializeToString())
        )
    )


def _check(
    channel: grpc.Channel,
    c: LocalCluster,
    method: tuple[str, str, Any, Any],
    body: bytes,
    extra: tuple[tuple[str, str], ...] = (),
    timeout: float = 5,
    unsignable: bool = False,
) -> None:
    """One call of `method` with `body`, signed by the admin (and `extra` metadata): its answer
    must be a reply of the method's type or a typed error, never INTERNAL or UNKNOWN; and never
    UNAUTHENTICATED unless `unsignable` (the signature itself cannot be made for this request)."""
    path, name, _, reply_type = method
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    metadata = (*admin(c).metadata(method=path), *extra)
    try:
        reply = call(body, timeout=2 if name in LONG_POLLS else timeout, metadata=metadata)
    except grpc.RpcError as exc:
        status = exc.code()
        if status == grpc.StatusCode.DEADLINE_EXCEEDED and name in LONG_POLLS:
            return
        assert status not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (path, exc.details())
        code = dict(exc.trailing_metadata() or ()).get(ERROR_CODE_KEY)
        assert code, f"{path}: {status} without a tidelog error code: {exc.details()}"
        # the signature is valid: the body, not the caller, is what gets judged
        assert code != "UNAUTHENTICATED" or unsignable, (path, exc.details())
        assert by_code(code).status == status.name, (path, code, status)
        return
    reply_type.FromString(reply)  # a valid answer parses as the method's reply


def _pids_alive(c: LocalCluster) -> None:
    for name, pid in c.pids().items():
        os.kill(pid, 0)  # raises if the process is gone
        assert name


def _good_calls(c: LocalCluster) -> None:
    """A request that must work after the fuzzing: a produce through the broker, and a route."""
    with tls_channel(c, broker_config(c)["listen"]) as broker:
        path = "/tidelog.broker.v1.Broker/Status"
        raw = broker.unary_unary(path, request_serializer=None, response_deserializer=None)
        broker_pb2.StatusReply.FromString(raw(b"", timeout=10, metadata=admin(c).metadata(method=path)))
    with tls_channel(c, controller_address(c)) as ctrl:
        path = "/tidelog.controller.v1.ControllerAdmin/ListTopics"
        raw = ctrl.unary_unary(path, request_serializer=None, response_deserializer=None)
        raw(b"", timeout=10, metadata=admin(c).metadata(method=path))


@pytest.fixture(scope="module")
def broker_channel(secure: LocalCluster) -> Any:  # noqa: F811
    with tls_channel(secure, broker_config(secure)["listen"]) as channel:
        _wait_known(channel, secure)
        yield channel


@pytest.fixture(scope="module")
def controller_channel(secure: LocalCluster) -> Any:  # noqa: F811
    with tls_channel(secure, controller_address(secure)) as channel:
        yield channel


def _wait_known(channel: grpc.Channel, c: LocalCluster) -> None:
    """Until the broker has learned the admin user (from a heartbeat reply after its start)."""
    path = "/tidelog.broker.v1.Broker/Status"
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    deadline = time.monotonic() + 20
    while True:
        try:
            call(b"", timeout=5, metadata=admin(c).metadata(method=path))
            return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                return
            assert time.monotonic() < deadline, "the broker never learned the admin user"
        time.sleep(0.1)


FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ_SETTINGS
@given(request=_request(BROKER))
def test_signed_fuzzed_broker_calls_get_typed_answers(
    secure: LocalCluster,  # noqa: F811
    broker_channel: grpc.Channel,
    request: tuple[Any, bytes],
) -> None:
    _check(broker_channel, secure, *request)


@FUZZ_SETTINGS
@given(request=_request(CONTROLLER))
def test_signed_fuzzed_controller_calls_get_typed_answers(
    secure: LocalCluster,  # noqa: F811
    controller_channel: grpc.Channel,
    request: tuple[Any, bytes],
) -> None:
    _check(controller_channel, secure, *request)


# --- the data port, after a valid AUTH frame ----------------------------------------------------


def _data_address(c: LocalCluster) -> tuple[str, int]:
    path = "/tidelog.broker.v1.Broker/Status"
    with tls_channel(c, broker_config(c)["listen"]) as broker:
        _wait_known(broker, c)
        raw = broker.unary_unary(path, request_serializer=None, response_deserializer=None)
        reply = broker_pb2.StatusReply.FromString(
            raw(b"", timeout=10, metadata=admin(c).metadata(method=path))
        )
    host, _, port = reply.data_address.rpartition(":")
    return host, int(port)


@pytest.fixture(scope="module")
def data_address(secure: LocalCluster) -> tuple[str, int]:  # noqa: F811
    return _data_address(secure)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    head = await reader.readexactly(df.HEAD_SIZE)
    length, kind, rid = df.HEAD.unpack(head)
    return kind, rid, await reader.readexactly(df.body_length(length))


async def _data_call(
    c: LocalCluster, address: tuple[str, int], op: int, body: bytes
) -> tuple[int, bytes] | None:
    """Authenticate a connection, send one frame; its answer, or None when the port closed the
    connection (a frame that breaks the layout) or a long poll outlasted the wait."""
    tls = tlsconfig.ClientTls(Path(c.up_doc["ca_file"]))
    reader, writer = await tlsconfig.open_connection(address[0], address[1], tls)
    try:
        auth = df.auth_request(admin(c).metadata(method=df.AUTH_METHOD))
        writer.writelines(df.frame(df.OP_AUTH, 1, auth))
        kind, _, _ = await within(_read_frame(reader), 10)
        assert kind == df.OK, "the admin's AUTH frame was refused"
        writer.writelines(df.frame(op, 2, body))
        try:
            kind, rid, reply = await within(_read_frame(reader), 5)
        except asyncio.IncompleteReadError:
            return None
        except TimeoutError:
            assert op == df.OP_PULL, f"op {op}: no answer in 5 s"
            return None
        assert rid == 2
        return kind, reply
    finally:
        writer.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    op=st.sampled_from([df.OP_PRODUCE, df.OP_PULL, df.OP_LEDGER_ADD, df.OP_LEDGER_ADDS, df.OP_AUTH, 0, 77]),
    body=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda topic, queue, records: df.produce_request(topic, queue, 1, 0) + records,
            st.sampled_from(["", "t", GOOD_TOPIC, "a" * 300]),
            st.integers(0, 70000),
            st.binary(max_size=100),
        ),
        st.builds(
            lambda topic, queue, offset, n, wait: df.pull_request(
                df.PullCall(topic, queue, offset, n, 1024, wait)
            ),
            st.sampled_from(["", "t", GOOD_TOPIC]),
            st.integers(0, 3),
            st.integers(0, 2**40),
            st.integers(0, 2**31 - 1),
            st.integers(0, 100),
        ),
    ),
)
def test_signed_fuzzed_data_frames_get_typed_answers(
    secure: LocalCluster,  # noqa: F811
    data_address: tuple[str, int],
    op: int,
    body: bytes,
) -> None:
    address = data_address
    answer = asyncio.run(_data_call(secure, address, op, body))
    if answer is None:
        return
    kind, reply = answer
    if kind == df.OK:
        return
    assert kind == df.ERROR, kind
    code = df.parse_error(reply)[0]
    assert code != "INTERNAL", df.parse_error(reply)
    by_code(code)  # a code tidelog defines


def test_after_the_fuzzing_the_processes_are_up_and_good_requests_work(secure: LocalCluster) -> None:  # noqa: F811
    # runs after the fuzzers of this module (pytest keeps a module's order)
    _pids_alive(secure)
    _good_calls(secure)
    address = _data_address(secure)
    pull = df.pull_request(df.PullCall(GOOD_TOPIC, 0, 0, 1, 1024, 0))
    answer = asyncio.run(_data_call(secure, address, df.OP_PULL, pull))
    assert answer is not None
    assert answer[0] == df.ERROR and df.parse_error(answer[1])[0] == "TOPIC_NOT_FOUND", answer
