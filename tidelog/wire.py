"""The gRPC error convention every tidelog service shares, both directions.

Server side: `@rpc` wraps an async servicer method so that a `TidelogError` becomes
`context.abort(grpc.StatusCode[err.status], err.message)` with trailing metadata
`tidelog-error-code` = err.code (plus `tidelog-leader` when the error names a leader), and an
unexpected exception becomes INTERNAL after being logged; a request never kills the server.
`check_request`, `non_empty` and `non_negative` validate requests with a clear INVALID_ARGUMENT.

Client side: `error_from_rpc` turns an `AioRpcError` back into the typed error, so a caller gets
the same class over the wire as in-process.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tidelog.errors import InvalidArgumentError, TidelogError, UnavailableError, UnsupportedCallError, by_code
from tidelog.invariants import stop_if_violated

log = logging.getLogger(__name__)

# A peer that stops answering (a stopped process, a datacenter cut off by the network) keeps its
# TCP connection open: without keepalive a call to it waits for its whole deadline. HTTP/2 pings
# every second, and a connection that does not answer one within a second is closed, failing its
# calls with UNAVAILABLE so that the caller asks the controllers again. Servers must accept pings
# that often (gRPC's default would answer them with GOAWAY "too many pings").
KEEPALIVE_MS = 1000
MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's default reconnect backoff grows to 120 s; a peer that comes back should be usable
    # again within seconds.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 3000),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]

ERROR_CODE_KEY = "tidelog-error-code"
LEADER_KEY = "tidelog-leader"

# Transport-level failures that mean "try again or elsewhere", not "your request is wrong".
_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a server refusing work it has no room for: try again
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def leader_of(err: BaseException) -> str | None:
    """The leader address an error names, if any (NOT_LEADER carries one)."""
    leader = getattr(err, "leader", None)
    if not leader and isinstance(err, TidelogError):
        leader = err.details.get("leader")
    return str(leader) if leader else None


def trailing_metadata_for(err: TidelogError) -> tuple[tuple[str, str], ...]:
    md: list[tuple[str, str]] = [(ERROR_CODE_KEY, err.code)]
    leader = leader_of(err)
    if leader:
        md.append((LEADER_KEY, leader))
    return tuple(md)


def _status_of(err: TidelogError) -> grpc.StatusCode:
    try:
        return grpc.StatusCode[err.status]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


async def abort_with(context: grpc.aio.ServicerContext, err: TidelogError) -> None:
    """Answer the call with a typed error; raises (as context.abort always does)."""
    await context.abort(_status_of(err), err.message, trailing_metadata=trailing_metadata_for(err))


def rpc(fn: F) -> F:
    """Decorate an async servicer method `(self, request, context)` with the error convention."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except TidelogError as err:
            log.debug("%s answered %s: %s", fn.__name__, err.code, err.message)
            await abort_with(context, err)
        except Exception as exc:  # a bug: log it loudly, keep serving (unless an invariant broke)
            stop_if_violated(exc)
            log.exception("%s failed unexpectedly", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


# --- request validation -----------------------------------------------------------------------


def check_request(condition: bool, message: str, **details: Any) -> None:
    """Refuse a request that breaks `condition` with INVALID_ARGUMENT saying `message` (named apart
    from tidelog.invariants.require, which fails the process on broken state, not on bad input)."""
    if not condition:
        raise InvalidArgumentError(message, **details)


def non_empty(field: str, value: str, max_len: int = 255) -> str:
    # the messages are formatted only for a refusal: these run for every field of every call
    if not value or not value.strip():
        raise InvalidArgumentError(f"{field} must not be empty", field=field)
    if len(value) > max_len:
        raise InvalidArgumentError(f"{field} is longer than {max_len} characters", field=field)
    return value


def non_negative(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgumentError(f"{field} must not be negative (got {value})", field=field)
    return value


# --- client side ---------------------------------------------------------------------------


def _metadata_dict(err: grpc.aio.AioRpcError) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        md = err.trailing_metadata() or ()
    except Exception:  # a call that never reached a server has no metadata
        md = ()
    for item in md:
        key, value = item[0], item[1]
        out[key] = value.decode() if isinstance(value, bytes) else str(value)
    return out


def make_error(code: str, message: str, **details: Any) -> TidelogError:
    """The typed error for a wire code, built without knowing its constructor's extra parameters."""
    return _instantiate(by_code(code), message, details)


def _instantiate(cls: type[TidelogError], message: str, details: dict[str, Any]) -> TidelogError:
    try:
        err = cls(message, **details)
    except TypeError:
        err = cls.__new__(cls)
        Exception.__init__(err, message)
        err.message = message
        err.details = dict(details)
    for key, value in details.items():
        if not hasattr(err, key):
            setattr(err, key, value)
    return err


def error_from_rpc(err: grpc.aio.AioRpcError | grpc.RpcError) -> TidelogError:
    """The typed error an RPC failure stands for."""
    md = _metadata_dict(err) if isinstance(err, grpc.aio.AioRpcError) else {}
    code = md.get(ERROR_CODE_KEY)
    status = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = (err.details() if hasattr(err, "details") else "") or ""
    details: dict[str, Any] = {}
    if LEADER_KEY in md:
        details["leader"] = md[LEADER_KEY]
    if code:
        return _instantiate(by_code(code), message, details)
    if status == grpc.StatusCode.UNIMPLEMENTED:
        return UnsupportedCallError(message)  # gRPC's own answer for a method the server lacks
    if status in _UNREACHABLE:
        # the error's own code already says UNAVAILABLE; name other statuses (deadline, cancelled)
        return UnavailableError(
            message if status == grpc.StatusCode.UNAVAILABLE else f"{status.name}: {message}"
        )
    return TidelogError(f"{status.name}: {message}")


def is_unreachable(err: BaseException) -> bool:
    """True for errors that say nothing about the request, only about the server or network."""
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code() in _UNREACHABLE
    return isinstance(err, TidelogError) and err.retryable and isinstance(err, UnavailableError)


def bind_problem(address: str) -> str | None:
    """Why `address` (host:port) cannot be listened on, e.g. "Address already in use"; None when
    it can. Asked before a gRPC server binds: gRPC's C core would log its own failure to stderr,
    in its own format, beside the one clear line the process prints."""
    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            # a port whose last connections linger in TIME_WAIT is free to listen on
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except (OSError, ValueError) as exc:
        return getattr(exc, "strerror", None) or str(exc)
    return None
