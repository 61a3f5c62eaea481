"""Users' calls on a server's gRPC port: the `auth:` config section and the one interceptor that
authenticates every call and applies the permission rules before the handler runs.

Owns the shell around tidelog/access.py (who signed) and tidelog/acl.py (may they): a server
adds `Guard` to its gRPC server, so no method of a guarded service can be missed, and the
interceptor wraps the handler so it sees the request message the rules pull resources from.

A call that carries the cluster secret's token (tidelog/clusterauth.py) comes from a cluster
member or an operator holding the secret: it is the cluster itself and passes every rule
(`acl.SUPERUSER`); the server's `member` callback checks that token. Services that only cluster
members call (the controller's ControllerBroker) keep their own authentication and are not
guarded here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog import access, acl
from tidelog.errors import ConfigError, PermissionDeniedError, TidelogError, UnauthenticatedError
from tidelog.wire import abort_with

log = logging.getLogger(__name__)

CREDENTIALS_HINT = (
    "give the client a user's credentials: --access-key/--secret-key or $TIDE_ACCESS_KEY/"
    "$TIDE_SECRET_KEY (`tide user create` makes a user)"
)


@dataclass(frozen=True)
class AuthSettings:
    """The `auth:` section: `enabled` (calls must be signed by a user or the cluster) and
    `max_skew_s`, how far a signature's date may be from the server's clock."""

    enabled: bool = False
    max_skew_s: int = access.DEFAULT_MAX_SKEW_S


def parse_section(value: Any, source: str, has_tls: bool) -> AuthSettings | None:
    """The `auth:` section of a broker or controller config; None when absent or disabled."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"enabled", "max_skew_s"}:
        raise ConfigError(f"{source}: auth must be a mapping such as {{enabled: true}}", key="auth")
    enabled = value.get("enabled", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{source}: auth.enabled must be true or false", key="auth.enabled")
    skew = value.get("max_skew_s", access.DEFAULT_MAX_SKEW_S)
    if not isinstance(skew, int) or isinstance(skew, bool) or skew <= 0:
        raise ConfigError(f"{source}: auth.max_skew_s must be a positive integer", key="auth.max_skew_s")
    if not enabled:
        return None
    if not has_tls:
        # a signature covers only its date: without TLS anyone on the path could replay it
        raise ConfigError(
            f"{source}: auth needs TLS (a tls: section): signed calls in plain text can be replayed",
            key="auth",
        )
    return AuthSettings(True, skew)


def metadata_of(pairs: Any) -> dict[str, str]:
    """gRPC metadata as a dict of lower-case names to the first string value of each."""
    out: dict[str, str] = {}
    for key, value in pairs or ():
        if isinstance(value, str):
            out.setdefault(key.lower(), value)
    return out


def with_clear_keys(table: acl.AclState, cluster_secret: str) -> acl.AclState:
    """`table` with each user's stored (wrapped) signing key unwrapped under the cluster secret,
    for checking signatures in memory. A user whose key does not unwrap (written under another
    secret) is left out, and logged: it can sign nothing here."""
    users: dict[str, acl.User] = {}
    for name, user in table.users.items():
        key = access.unwrap_signing_key(cluster_secret, user.access_key, user.signing_key)
        if key is None:
            log.error("the signing key of user %s does not unwrap under this cluster's secret", name)
            continue
        users[name] = acl.User(user.name, user.access_key, key)
    return acl.AclState(table.version, users, table.grants)


#: `member(method, metadata, request)`: True for a valid cluster-secret token, False when the
#: call carries none; raises UnauthenticatedError for a token that does not verify.
MemberCheck = Callable[[str, Mapping[str, str], Any], bool]


class Guard(grpc.aio.ServerInterceptor):
    """Authenticates and authorizes every call of the guarded services (all but `open_services`)."""

    def __init__(
        self,
        settings: AuthSettings,
        table: Callable[[], acl.AclState],
        member: MemberCheck,
        open_services: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.table = table
        self.member = member
        self.open_services = open_services
        self.refused = 0

    def identify(
        self, method: str, metadata: Mapping[str, str], request: Any, table: acl.AclState | None = None
    ) -> str:
        """The caller's identity (a user name, or acl.SUPERUSER); UnauthenticatedError if none."""
        if self.member(method, metadata, request):
            return acl.SUPERUSER
        users = table if table is not None else self.table()

        def key_of(access_key: str) -> str | None:
            user = users.user_by_key(access_key)
            return user.signing_key if user is not None else None

        verdict = access.check(metadata, key_of, time.time(), self.settings.max_skew_s)
        if verdict.refusal is not None:
            raise UnauthenticatedError(verdict.refusal, hint=CREDENTIALS_HINT)
        return users.by_key[verdict.access_key].name  # the key the signature was checked with

    def refusal(self, method: str, metadata: Mapping[str, str], request: Any) -> TidelogError | None:
        """Why this call may not run, or None (one read of the table for both questions)."""
        table = self.table()
        try:
            identity = self.identify(method, metadata, request, table)
        except UnauthenticatedError as exc:
            return exc
        why = acl.authorize(identity, table, method, request)
        return None if why is None else PermissionDeniedError(why)

    async def _check(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        err = self.refusal(method, metadata_of(context.invocation_metadata()), request)
        if err is not None:
            self.refused += 1
            log.info("refused %s from %s: %s", method, context.peer(), err.message)
            await abort_with(context, err)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        service = method.rsplit("/", 2)[1] if method.count("/") >= 2 else ""
        if handler is None or service in self.open_services:
            return handler
        return _guarded(handler, lambda request, context: self._check(method, request, context))


CallCheck = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]


def _guarded(handler: grpc.RpcMethodHandler, check: CallCheck) -> grpc.RpcMethodHandler:
    """`handler` with `check(request, context)` before its behaviour. A streamed request has no
    one message the rules could read: it is checked with none, so only the cluster passes."""
    de, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(request, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, de, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(request, context)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, de, ser)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(None, context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, de, ser)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await check(None, context)
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, de, ser)
