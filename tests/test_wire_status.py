"""How gRPC statuses without a tidelog error code map to typed errors (tidelog.wire)."""

from __future__ import annotations

import grpc
import pytest

from tidelog.errors import TidelogError, UnavailableError
from tidelog.wire import error_from_rpc, is_unreachable


def rpc_error(code: grpc.StatusCode, details: str = "details") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ],
)
def test_server_side_refusals_are_retryable_unavailable(code):
    err = error_from_rpc(rpc_error(code, "busy"))
    assert type(err) is UnavailableError and err.retryable
    assert is_unreachable(rpc_error(code))


def test_the_unavailable_code_is_not_repeated_in_the_message():
    assert (
        str(error_from_rpc(rpc_error(grpc.StatusCode.UNAVAILABLE, "connect failed"))).count("UNAVAILABLE")
        == 1
    )


def test_other_statuses_stay_generic_and_name_their_status():
    err = error_from_rpc(rpc_error(grpc.StatusCode.PERMISSION_DENIED, "nope"))
    assert type(err) is TidelogError and "PERMISSION_DENIED" in str(err)
