"""Prometheus metrics of one process: its registry, the HTTP endpoint, and the timing of gRPC calls.

Owns what every tidelog process shares for observability:

- `new_registry()`: a `CollectorRegistry` per process object, never prometheus_client's global
  one, so that several brokers or controllers started inside one test process stay apart;
- `MetricsServer`: a small asyncio HTTP server on the configured `metrics_address` (that address
  only) serving `/metrics` (the registry in Prometheus' text format), `/healthz` (200 while the
  process runs) and `/readyz` (200, or 503 with the one-line reason the process gives). It runs
  on the process's own event loop, so collectors read the broker's or controller's state on the
  thread that changes it, never halfway through an update;
- `RpcTimer`: the gRPC server interceptor every call passes through, timing each unary call and
  handing (method, request, reply, seconds, code) to one observer;
- `RpcMetrics`: the request-latency histogram and error counter built from those observations;
- `AuthRefusals`: calls and connections refused by the auth checks (tidelog/guard.py), by reason,
  exported as `tidelog_auth_refused_total{reason}` once `watch_auth_refusals` registers them.

What a broker or a controller exports is in `broker/metrics.py` and `controller/metrics.py`;
every name is listed in deploy/METRICS.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tidelog.errors import ConfigError
from tidelog.tasks import within
from tidelog.wire import ERROR_CODE_KEY

log = logging.getLogger(__name__)

# Request latencies from sub-millisecond reads to minute-long long polls.
RPC_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
MAX_REQUEST_BYTES = 8192  # a scrape's request line and headers; more is not a scraper
REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16  # scrapes in progress; more are closed at once (bounded memory)

#: Says why the process is not ready, or None when it is.
Readiness = Callable[[], str | None]
#: (method, request, reply or None, seconds, code): one finished gRPC call.
RpcObserver = Callable[[str, Any, Any, float, str], None]


def new_registry() -> CollectorRegistry:
    """A registry of this process object's own, with the process collector (CPU, memory, fds)."""
    registry = CollectorRegistry(auto_describe=False)  # custom collectors read state only at scrape time
    ProcessCollector(registry=registry)
    return registry


def split_address(address: str, key: str = "metrics_address") -> tuple[str, int]:
    """(host, port) of a `host:port` setting, or ConfigError naming `key`."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{key} must be host:port, not {address!r}", key=key)
    return host.strip("[]"), int(port)


def respond(
    method: str, target: str, registry: CollectorRegistry, ready: Readiness
) -> tuple[int, str, bytes]:
    """(status, content type, body) for one request: the whole routing table, without I/O."""
    path = target.split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return 405, "text/plain; charset=utf-8", b"only GET and HEAD\n"
    if path == "/metrics":
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
    if path == "/healthz":
        return 200, "text/plain; charset=utf-8", b"ok\n"
    if path == "/readyz":
        reason = ready()
        if reason is None:
            return 200, "text/plain; charset=utf-8", b"ready\n"
        return 503, "text/plain; charset=utf-8", (reason.splitlines() or ["not ready"])[0].encode() + b"\n"
    return 404, "text/plain; charset=utf-8", b"not found: try /metrics, /healthz or /readyz\n"


_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _response_bytes(status: int, content_type: str, body: bytes, *, head: bool) -> bytes:
    header = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return header if head else header + body


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` on one address, served from the running event loop."""

    def __init__(self, address: str, registry: CollectorRegistry, ready: Readiness) -> None:
        self.address = address
        self.registry = registry
        self.ready = ready
        self._server: asyncio.Server | None = None
        self._open = 0

    async def start(self) -> None:
        """Bind `address` (only it); ConfigError naming `metrics_address` when it cannot."""
        host, port = split_address(self.address)
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, reuse_address=True, limit=MAX_REQUEST_BYTES
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on metrics_address {self.address}: {exc.strerror}", key="metrics_address"
            ) from exc
        log.info("metrics on http://%s/metrics (health: /healthz, /readyz)", self.bound)

    @property
    def bound(self) -> str:
        """The address actually bound (port 0 in the config becomes the port the kernel chose)."""
        if self._server is None or not self._server.sockets:
            return self.address
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await within(self._server.wait_closed(), 1.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:
            writer.close()
            return
        self._open += 1
        try:
            request = await within(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, _, rest = request.decode("latin-1").partition(" ")
            target = rest.split(" ", 1)[0]
            writer.write(self._answer(method, target))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, TimeoutError):
            pass  # a scraper that went away or sent garbage: nothing to answer
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _answer(self, method: str, target: str) -> bytes:
        try:
            status, ctype, body = respond(method, target, self.registry, self.ready)
        except Exception as exc:  # a collector bug must not take the endpoint (or the process) down
            log.exception("metrics: answering %s %s failed", method, target)
            status, ctype, body = 500, "text/plain; charset=utf-8", f"{type(exc).__name__}: {exc}\n".encode()
        return _response_bytes(status, ctype, body, head=method == "HEAD")


async def start_server(address: str, registry: CollectorRegistry, ready: Readiness) -> MetricsServer:
    server = MetricsServer(address, registry, ready)
    await server.start()
    return server


def _code_of(context: grpc.aio.ServicerContext) -> str:
    """The tidelog error code a failed call answered with, else its gRPC status name."""
    for key, value in context.trailing_metadata() or ():
        if key == ERROR_CODE_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class RpcTimer(grpc.aio.ServerInterceptor):
    """Times every unary call of a gRPC server and reports it to `observe`.

    The wrapped handler is built once per method, so a call costs two clock reads and the
    observer's counter updates."""

    def __init__(self, observe: RpcObserver) -> None:
        self.observe = observe
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        full = handler_call_details.method
        cached = self._handlers.get(full)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        timed = grpc.unary_unary_rpc_method_handler(
            self._timed(full.rpartition("/")[2], handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._handlers[full] = timed
        return timed

    def _timed(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        observe = self.observe

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                reply = await behavior(request, context)
            except grpc.aio.AbortError:
                observe(method, request, None, time.perf_counter() - started, _code_of(context))
                raise
            except asyncio.CancelledError:
                observe(method, request, None, time.perf_counter() - started, "CANCELLED")
                raise
            observe(method, request, reply, time.perf_counter() - started, "OK")
            return reply

        return timed


class RpcMetrics:
    """`tidelog_rpc_duration_seconds` (per method) and `tidelog_rpc_errors_total` (per method and
    code) of one process, labelled with the process's identity labels."""

    def __init__(self, registry: CollectorRegistry, identity_labels: Sequence[str]) -> None:
        self.duration = Histogram(
            "tidelog_rpc_duration_seconds",
            "Time to answer one gRPC call, long polls included, by method",
            [*identity_labels, "method"],
            registry=registry,
            buckets=RPC_BUCKETS,
        )
        self.errors = Counter(
            "tidelog_rpc_errors",
            "gRPC calls answered with an error, by method and error code",
            [*identity_labels, "method", "code"],
            registry=registry,
        )
        self._children: dict[tuple[str, ...], Any] = {}

    def observe(self, identity: tuple[str, ...], method: str, seconds: float, code: str) -> None:
        key = (*identity, method)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.duration.labels(*key)
        child.observe(seconds)
        if code != "OK":
            self.errors.labels(*key, code).inc()


class AuthRefusals:
    """How many calls (gRPC) and connections (data port) the auth checks refused, by reason: plain
    counts the guard adds to on the event loop, read at scrape time."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def total(self) -> int:
        return sum(self.counts.values())


class _AuthRefusalCollector(Collector):
    def __init__(
        self, refusals: AuthRefusals, labels: Sequence[str], identity: Callable[[], tuple[str, ...]]
    ) -> None:
        self.refusals = refusals
        self.labels = list(labels)
        self.identity = identity

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "tidelog_auth_refused",
            "Calls and data-port connections refused by the auth checks, by reason",
            labels=[*self.labels, "reason"],
        )
        ident = self.identity()
        for reason, n in sorted(self.refusals.counts.items()):
            family.add_metric([*ident, reason], n)
        out: list[Metric] = [family]
        yield from out


def watch_auth_refusals(
    registry: CollectorRegistry,
    refusals: AuthRefusals,
    identity_labels: Sequence[str],
    identity: Callable[[], tuple[str, ...]],
) -> None:
    """Export `refusals` as `tidelog_auth_refused_total{<identity>, reason}`."""
    registry.register(_AuthRefusalCollector(refusals, identity_labels, identity))


__all__ = [
    "CONTENT_TYPE_LATEST",
    "AuthRefusals",
    "MetricsServer",
    "Readiness",
    "RpcMetrics",
    "RpcObserver",
    "RpcTimer",
    "new_registry",
    "respond",
    "split_address",
    "start_server",
    "watch_auth_refusals",
]
