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
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog import access, acl
from tidelog.clusterauth import CALL_KEY, ReplayCache, token_problem
from tidelog.errors import (
    ConfigError,
    InvalidArgumentError,
    PermissionDeniedError,
    TidelogError,
    UnauthenticatedError,
)
from tidelog.metrics import AuthRefusals
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

#: refusal lines logged per peer (host) per second; the rest are counted, and summed up in the
#: next line logged for that peer
LOG_PER_PEER_PER_S = 5
_MAX_PEERS = 4096
MALFORMED = "malformed_request"
PERMISSION = "permission"
CLUSTER_TOKEN = "cluster_token"
HA_UNPROVEN = "ha_unproven"  # an HA connection closed before it proved the cluster secret
HA_DISPLACED = "ha_displaced"  # an unproven HA connection closed to make room (ha/master.py HaSlots)


def peer_host(peer: str) -> str:
    """The host part of a gRPC peer string (`ipv4:1.2.3.4:5678`, `ipv6:[::1]:5678`) or address."""
    rest = peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer
    host, sep, port = rest.rpartition(":")
    return host if sep and port.isdigit() else rest


class RefusalLog:
    """Logs refused calls at most LOG_PER_PEER_PER_S lines per second per peer host, and counts
    every refusal by reason (`tidelog_auth_refused_total`): a client sending thousands of bad
    calls costs a few lines a second, never a traceback each."""

    def __init__(self, refusals: AuthRefusals | None = None, per_second: int = LOG_PER_PEER_PER_S) -> None:
        self.refusals = refusals if refusals is not None else AuthRefusals()
        self.per_second = per_second
        self._peers: OrderedDict[str, list[float]] = OrderedDict()  # host -> [window start, lines, dropped]

    def note(self, peer: str, reason: str, what: str, now: float | None = None) -> None:
        self.refusals.add(reason)
        now = time.monotonic() if now is None else now
        host = peer_host(peer)
        state = self._peers.pop(host, None)
        if state is None or now - state[0] >= 1.0:
            dropped = int(state[2]) if state is not None else 0
            state = [now, 0.0, 0.0]
            if dropped:
                what += f" (and {dropped} more refusals from {host} not logged)"
        self._peers[host] = state
        while len(self._peers) > _MAX_PEERS:
            self._peers.popitem(last=False)
        if state[1] < self.per_second:
            state[1] += 1
            log.info("refused %s from %s (%s)", what, peer, reason)
        else:
            state[2] += 1


class Guard(grpc.aio.ServerInterceptor):
    """Authenticates and authorizes every call of the guarded services (all but `open_services`).

    Who signed is decided from the call's metadata, before its request is parsed: a call with no
    or a bad user signature, or a cluster token that cannot verify (malformed, out of its time
    window), is refused without its body being read. A cluster token's MAC covers the request, so
    it is checked once the request is parsed. A request that does not parse is answered
    INVALID_ARGUMENT with one (rate-limited) log line, never a traceback."""

    def __init__(
        self,
        settings: AuthSettings,
        table: Callable[[], acl.AclState],
        member: MemberCheck,
        open_services: frozenset[str] = frozenset(),
        refusal_log: RefusalLog | None = None,
    ) -> None:
        self.settings = settings
        self.table = table
        self.member = member
        # services only cluster members call: each handler checks the cluster token itself; here
        # a call without a well-formed, current token is refused unread
        self.open_services = open_services
        self.log = refusal_log if refusal_log is not None else RefusalLog()
        # the nonces of users' signatures taken within the clock window: each is taken once
        self.replays = ReplayCache(window_ms=settings.max_skew_s * 1000)

    @property
    def refusals(self) -> AuthRefusals:
        return self.log.refusals

    @property
    def refused(self) -> int:
        return self.refusals.total()

    def _user(
        self, method: str, metadata: Mapping[str, str], users: acl.AclState
    ) -> tuple[str, access.Verdict]:
        def key_of(access_key: str) -> str | None:
            user = users.user_by_key(access_key)
            return user.signing_key if user is not None else None

        now = time.time()
        verdict = access.check(metadata, key_of, now, self.settings.max_skew_s)
        if verdict.refusal is not None:
            return "", verdict
        problem = self._fresh(method, verdict, int(now * 1000))
        if problem is not None:
            return "", access.Verdict(refusal=problem, reason=access.REPLAYED)
        return users.by_key[verdict.access_key].name, verdict  # the key the signature was checked with

    def _fresh(self, method: str, verdict: access.Verdict, now_ms: int) -> str | None:
        """Why a valid signature may not be taken for this call: one that covers only its date
        (RocketMQ's scheme, replayable within the clock window), one made for another method, or
        a nonce already taken (a replay). None: taken, and its nonce remembered."""
        if not verdict.nonce:
            return (
                "the signature covers only its date, so it could be replayed: sign the method and a "
                f"nonce ({';'.join(access.TIDE_SIGNED)}), as tidelog's clients do"
            )
        if verdict.method != method:
            return f"the call was signed for {verdict.method[:200]!r}, not {method}"
        if not self.replays.admits(verdict.signed_at_s * 1000):
            return "the server had to forget calls signed this early (a flood of calls); sign the call again"
        if not self.replays.add(bytes.fromhex(verdict.nonce), now_ms, verdict.signed_at_s * 1000):
            return "this signed call was already used (a replay)"
        return None

    def identify(
        self, method: str, metadata: Mapping[str, str], request: Any, table: acl.AclState | None = None
    ) -> str:
        """The caller's identity (a user name, or acl.SUPERUSER); UnauthenticatedError if none."""
        if self.member(method, metadata, request):
            return acl.SUPERUSER
        name, verdict = self._user(method, metadata, table if table is not None else self.table())
        if verdict.refusal is not None:
            raise UnauthenticatedError(verdict.refusal, hint=CREDENTIALS_HINT, reason=verdict.reason)
        return name

    def before_parse(
        self, method: str, metadata: Mapping[str, str]
    ) -> tuple[str | None, UnauthenticatedError | None]:
        """What the metadata alone decide: (the user who signed, None) for a valid user signature;
        (None, None) for a cluster token that may verify once the request is parsed; (None, why)
        for a call refused unread."""
        if CALL_KEY in metadata:
            return None, member_problem(metadata)
        name, verdict = self._user(method, metadata, self.table())
        if verdict.refusal is not None:
            return None, UnauthenticatedError(verdict.refusal, hint=CREDENTIALS_HINT, reason=verdict.reason)
        return name, None

    def refusal(
        self, method: str, metadata: Mapping[str, str], request: Any, user: str | None = None
    ) -> TidelogError | None:
        """Why this call may not run, or None (one read of the table for both questions). `user`:
        who signed, when the metadata already proved it."""
        table = self.table()
        if user is not None:
            identity = user
        else:
            try:
                identity = self.identify(method, metadata, request, table)
            except UnauthenticatedError as exc:
                return exc
        why = acl.authorize(identity, table, method, request)
        return None if why is None else PermissionDeniedError(why, reason=PERMISSION)

    async def _refuse(self, method: str, context: grpc.aio.ServicerContext, err: TidelogError) -> None:
        await _refuse(self.log, method, context, err)

    async def _admit(self, method: str, raw: bytes, parse: Parse, context: grpc.aio.ServicerContext) -> Any:
        """The request of one call, parsed only once its metadata let it be: refused (the call is
        aborted) unread for a missing or bad user signature or an unusable cluster token;
        INVALID_ARGUMENT for a body that does not parse; then the cluster token's MAC and the
        permission rules, which need the request."""
        metadata = metadata_of(context.invocation_metadata())
        err: TidelogError | None
        user, err = self.before_parse(method, metadata)
        if err is not None:
            await self._refuse(method, context, err)
        request = parse(raw)
        if isinstance(request, Malformed):
            await self._refuse(method, context, request.error())
        err = self.refusal(method, metadata, request, user)
        if err is not None:
            await self._refuse(method, context, err)
        return request

    async def _admit_stream(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """A streamed request has no one message the rules could read: only the cluster passes."""
        err = self.refusal(method, metadata_of(context.invocation_metadata()), None)
        if err is not None:
            await self._refuse(method, context, err)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        # grpc may keep the handler returned here for later calls of the method: it depends on
        # the method alone, and each call's metadata are read from its own context
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        service = method.rsplit("/", 2)[1] if method.count("/") >= 2 else ""
        if service in self.open_services:
            return _members_only(handler, method, self.log)

        async def admit(raw: bytes, parse: Parse, context: grpc.aio.ServicerContext) -> Any:
            return await self._admit(method, raw, parse, context)

        async def admit_stream(context: grpc.aio.ServicerContext) -> None:
            await self._admit_stream(method, context)

        return _guarded(handler, admit, admit_stream)


def member_problem(metadata: Mapping[str, str]) -> UnauthenticatedError | None:
    """Why a call's cluster token cannot verify whatever its request (missing, malformed, out of
    its time window), or None: decided from the metadata alone."""
    token = metadata.get(CALL_KEY)
    if token is None:
        return UnauthenticatedError("the call must prove the cluster secret", reason=CLUSTER_TOKEN)
    problem = token_problem(token, int(time.time() * 1000))
    return None if problem is None else UnauthenticatedError(problem, reason=CLUSTER_TOKEN)


async def _refuse(
    refusals: RefusalLog, method: str, context: grpc.aio.ServicerContext, err: TidelogError
) -> None:
    refusals.note(
        context.peer(), str(err.details.get("reason") or err.code.lower()), f"{method}: {err.message}"
    )
    await abort_with(context, err)


def _members_only(handler: grpc.RpcMethodHandler, method: str, refusals: RefusalLog) -> grpc.RpcMethodHandler:
    """A handler of a members-only service: refused unread without a usable cluster token, else
    parsed safely (its handler checks the token's MAC over the request)."""

    async def admit(raw: bytes, parse: Parse, context: grpc.aio.ServicerContext) -> Any:
        err = member_problem(metadata_of(context.invocation_metadata()))
        if err is not None:
            await _refuse(refusals, method, context, err)
        request = parse(raw)
        if isinstance(request, Malformed):
            await _refuse(refusals, method, context, request.error())
        return request

    async def admit_stream(context: grpc.aio.ServicerContext) -> None:
        err = member_problem(metadata_of(context.invocation_metadata()))
        if err is not None:
            await _refuse(refusals, method, context, err)

    return _guarded(handler, admit, admit_stream)


class SafeDecode(grpc.aio.ServerInterceptor):
    """A server without users' auth: a request that does not parse is answered INVALID_ARGUMENT
    with one rate-limited log line, where grpc would log a traceback per call; a call of a
    members-only service (`member_services`) without a usable cluster token is refused unread."""

    def __init__(
        self, member_services: frozenset[str] = frozenset(), refusal_log: RefusalLog | None = None
    ) -> None:
        self.member_services = member_services
        self.log = refusal_log if refusal_log is not None else RefusalLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        service = method.rsplit("/", 2)[1] if method.count("/") >= 2 else ""
        if service in self.member_services:
            return _members_only(handler, method, self.log)
        refusals = self.log

        async def admit(raw: bytes, parse: Parse, context: grpc.aio.ServicerContext) -> Any:
            request = parse(raw)
            if isinstance(request, Malformed):
                await _refuse(refusals, method, context, request.error())
            return request

        async def admit_stream(context: grpc.aio.ServicerContext) -> None:
            return None

        return _guarded(handler, admit, admit_stream)


class Malformed:
    """What a request that does not parse is handed on as (the parser never raises)."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def error(self) -> InvalidArgumentError:
        return InvalidArgumentError(f"the request does not parse: {self.problem}", reason=MALFORMED)


#: parses a request's bytes: the message, or Malformed
Parse = Callable[[bytes], Any]
#: (raw request, parse, context) -> the request to run with; aborts the call when it may not run
Admit = Callable[[bytes, Parse, grpc.aio.ServicerContext], Awaitable[Any]]
AdmitStream = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


def _parser(deserializer: Callable[[bytes], Any] | None) -> Parse:
    de = deserializer

    def parse(raw: bytes) -> Any:
        if de is None:
            return raw
        try:
            return de(raw)
        except Exception as exc:  # a DecodeError, or whatever a hostile body makes the parser raise
            return Malformed(f"{type(exc).__name__}: {str(exc)[:200]}")

    return parse


def _guarded(
    handler: grpc.RpcMethodHandler, admit: Admit, admit_stream: AdmitStream
) -> grpc.RpcMethodHandler:
    """`handler` taking its request as bytes, which `admit` checks against the call's metadata
    and parses (or refuses) before the behaviour runs: nothing is parsed before it is admitted,
    and grpc never sees a request that fails to parse. A streamed request is admitted by its
    metadata alone (`admit_stream`) and parsed by grpc as before."""
    ser = handler.response_serializer
    parse = _parser(handler.request_deserializer)
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            return await inner_uu(await admit(raw, parse, context), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, ser)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            request = await admit(raw, parse, context)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, ser)
    de = handler.request_deserializer
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await admit_stream(context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, de, ser)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await admit_stream(context)
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, de, ser)
