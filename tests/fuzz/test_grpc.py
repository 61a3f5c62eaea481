"""Fuzzing every gRPC request message through the real service handlers: the broker's
(broker/service.py) and its ledger service (broker/ledger_service.py) on an in-process master,
and the controller's (controller/service.py) on an in-process single-node controller.

Contract: each call ends, within its bound, in a reply of the method's type or in the status of a
typed tidelog error (tidelog/errors.py: the error code in the trailing metadata, the status it
maps to), never INTERNAL (what `tidelog.wire.rpc` answers for an unhandled exception). A field
named `wait_ms` is cut to 20 ms first: a long poll waits by design.

The runner's inputs are a method number and the serialized request; bytes protobuf cannot parse
are refused by gRPC before any handler, so they count as inputs and check nothing further.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.message import DecodeError, Message
from hypothesis import given
from hypothesis import strategies as st

from tests.controller.inproc import single_node
from tests.fuzz.fuzzing import FUZZ, Check, Fuzzer, inputs
from tests.fuzz.grpcmsg import Aborted, Context, check_answer, messages
from tests.fuzz.replica import master
from tidelog.broker.ledger_service import LedgerService
from tidelog.broker.service import BrokerService
from tidelog.controller import service as csvc
from tidelog.proto import broker_pb2, controller_pb2, ledger_pb2
from tidelog.tasks import within

CALL_TIMEOUT_S = 10.0

Method = tuple[str, type[Message], type[Message]]  # name, request type, reply type


def _methods(module: ModuleType, service: str) -> list[Method]:
    desc = module.DESCRIPTOR.services_by_name[service]
    return [
        (m.name, getattr(module, m.input_type.name), getattr(module, m.output_type.name))
        for m in desc.methods
    ]


def _requests(methods: list[Method]) -> st.SearchStrategy[bytes]:
    """A method number and a serialized request of its type."""
    return st.one_of(
        [
            messages(req.DESCRIPTOR).map(lambda m, i=i: bytes([i]) + m.SerializeToString())
            for i, (_, req, _) in enumerate(methods)
        ]
    )


def _decode(methods: list[Method], data: bytes) -> tuple[str, Message, type[Message]] | None:
    if not data:
        return None
    name, req_type, out_type = methods[data[0] % len(methods)]
    try:
        request = req_type.FromString(data[1:])
    except DecodeError:
        return None  # gRPC refuses it before any handler
    if "wait_ms" in req_type.DESCRIPTOR.fields_by_name:
        request.wait_ms = min(request.wait_ms, 20)
    return name, request, out_type


async def _call(servicer: Any, name: str, request: Message) -> tuple[Context, object]:
    ctx = Context()
    try:
        reply = await within(getattr(servicer, name)(request, ctx), CALL_TIMEOUT_S)
    except Aborted:
        reply = None
    return ctx, reply


# --- the broker and its ledger service -------------------------------------------------------

BROKER = [("broker", m) for m in _methods(broker_pb2, "Broker")] + [
    ("ledger", m) for m in _methods(ledger_pb2, "Ledger")
]
BROKER_METHODS = [m for _, m in BROKER]


@contextlib.contextmanager
def _broker_check() -> Iterator[Check]:
    with master() as m:
        servicers = {"broker": BrokerService(m.replica), "ledger": LedgerService(m.replica.ledgers)}

        def check(data: bytes) -> None:
            decoded = _decode(BROKER_METHODS, data)
            if decoded is None:
                return
            name, request, out_type = decoded
            which = BROKER[data[0] % len(BROKER)][0]
            ctx, reply = m.run(_call(servicers[which], name, request), CALL_TIMEOUT_S + 1)
            check_answer(ctx, reply, out_type)

        yield check


# --- the controller ---------------------------------------------------------------------------

CONTROLLER = (
    [("broker", m) for m in _methods(controller_pb2, "ControllerBroker")]
    + [("route", m) for m in _methods(controller_pb2, "ControllerRoute")]
    + [("admin", m) for m in _methods(controller_pb2, "ControllerAdmin")]
)
CONTROLLER_METHODS = [m for _, m in CONTROLLER]


@contextlib.contextmanager
def _controller_check() -> Iterator[Check]:
    runner = asyncio.Runner()
    with tempfile.TemporaryDirectory(prefix="tidelog-fuzz-controller-") as root:
        node_cm = single_node(Path(root))
        node, _client = runner.run(node_cm.__aenter__())
        try:
            servicers = {
                "broker": csvc.BrokerServicer(node),
                "route": csvc.RouteServicer(node),
                "admin": csvc.AdminServicer(node),
            }

            def check(data: bytes) -> None:
                decoded = _decode(CONTROLLER_METHODS, data)
                if decoded is None:
                    return
                name, request, out_type = decoded
                which = CONTROLLER[data[0] % len(CONTROLLER)][0]
                ctx, reply = runner.run(within(_call(servicers[which], name, request), CALL_TIMEOUT_S + 1))
                check_answer(ctx, reply, out_type)

            yield check
        finally:
            runner.run(node_cm.__aexit__(None, None, None))
            runner.close()


FUZZERS = [
    Fuzzer("grpc.broker+ledger", _requests(BROKER_METHODS), _broker_check),
    Fuzzer("grpc.controller", _requests(CONTROLLER_METHODS), _controller_check),
]


@pytest.fixture(scope="module")
def broker_check() -> Iterator[Check]:
    with _broker_check() as check:
        yield check


@pytest.fixture(scope="module")
def controller_check() -> Iterator[Check]:
    with _controller_check() as check:
        yield check


@FUZZ
@given(data=inputs(_requests(BROKER_METHODS)))
def test_broker_and_ledger_handlers(broker_check: Check, data: bytes) -> None:
    broker_check(data)


@FUZZ
@given(data=inputs(_requests(CONTROLLER_METHODS)))
def test_controller_handlers(controller_check: Check, data: bytes) -> None:
    controller_check(data)
