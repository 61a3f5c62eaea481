"""The shared gRPC error convention (tidelog/wire.py), both directions, without a server."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tidelog import errors
from tidelog.wire import ERROR_CODE_KEY, LEADER_KEY, error_from_rpc, make_error, non_empty, non_negative, rpc


def _rpc_error(
    status: grpc.StatusCode, details: str, md: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(*md), details=details)


def test_typed_error_comes_back_with_its_class_and_leader() -> None:
    err = error_from_rpc(
        _rpc_error(
            grpc.StatusCode.UNAVAILABLE,
            "not the leader",
            ((ERROR_CODE_KEY, "CONTROLLER_NOT_LEADER"), (LEADER_KEY, "127.0.0.1:9702")),
        )
    )
    assert isinstance(err, errors.ControllerNotLeaderError)
    assert err.leader == "127.0.0.1:9702" and err.retryable


def test_errors_with_their_own_constructor_are_still_rebuilt() -> None:
    err = make_error("CORRUPT_RECORD", "corrupt record in x at offset 4: crc")
    assert isinstance(err, errors.CorruptRecordError) and "offset 4" in str(err)


def test_unknown_code_and_transport_failures() -> None:
    err = error_from_rpc(
        _rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "?", ((ERROR_CODE_KEY, "FROM_THE_FUTURE"),))
    )
    assert type(err) is errors.TidelogError
    err = error_from_rpc(_rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert type(err) is errors.UnavailableError
    err = error_from_rpc(_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))
    assert type(err) is errors.UnavailableError
    err = error_from_rpc(_rpc_error(grpc.StatusCode.INTERNAL, "bug"))
    assert type(err) is errors.TidelogError and "INTERNAL" in str(err)


class _Abort(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[Any, ...] | None = None

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, details, tuple(trailing_metadata))
        raise _Abort


class _Servicer:
    @rpc
    async def Typed(self, request: Any, context: Any) -> str:
        raise errors.ControllerNotLeaderError(leader="127.0.0.1:1")

    @rpc
    async def Invalid(self, request: Any, context: Any) -> str:
        non_empty("name", request)
        return "ok"

    @rpc
    async def Bug(self, request: Any, context: Any) -> str:
        raise KeyError("oops")


@pytest.mark.parametrize(
    ("method", "request_", "status", "code"),
    [
        ("Typed", None, grpc.StatusCode.UNAVAILABLE, "CONTROLLER_NOT_LEADER"),
        ("Invalid", "  ", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ("Bug", None, grpc.StatusCode.INTERNAL, None),
    ],
)
def test_server_side_decorator(method: str, request_: Any, status: grpc.StatusCode, code: str | None) -> None:
    ctx = _Context()
    with pytest.raises(_Abort):
        asyncio.run(getattr(_Servicer(), method)(request_, ctx))
    assert ctx.aborted is not None and ctx.aborted[0] == status
    md = dict(ctx.aborted[2])
    assert md.get(ERROR_CODE_KEY) == code
    if method == "Typed":
        assert md[LEADER_KEY] == "127.0.0.1:1"
    assert asyncio.run(_Servicer().Invalid("fine", _Context())) == "ok"


def test_validators() -> None:
    assert non_negative("id", 0) == 0
    with pytest.raises(errors.InvalidArgumentError, match="id must not be negative"):
        non_negative("id", -1)
    with pytest.raises(errors.InvalidArgumentError, match="longer than 3"):
        non_empty("name", "abcd", max_len=3)
