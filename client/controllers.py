"""`ControllerClient`: the async client brokers, the Python client and the CLI use to talk to a
controller cluster.

It hides which node leads: a call goes first to the node that answered last (normally the
leader), follows CONTROLLER_NOT_LEADER to the leader it names, and moves on to the other nodes
when one is unreachable, until a bounded total time runs out. Typed errors that are answers
(unknown topic, fenced epoch, ...) are raised at once; only "not here / not now" is retried.

Brokers' addresses work here too (broker/lookups.py): a broker answers route lookups from the
cluster view its heartbeats bring, and points every other call at the controller it last heard
from. Route lookups go to the controllers first and then to the brokers this client knows (those
given, and every replica of a route it was told), so a client starts and keeps routing while no
controller answers. A call only a controller quorum can serve raises CONTROLLER_UNAVAILABLE once
no controller has answered at all for `quorum_timeout` (applications' clients and the command
line: `QUORUM_TIMEOUT_S`), rather than waiting out the whole `total_timeout`: waiting for a
quorum that is away helps nobody. Without one (brokers, tools that wait for controllers still
starting) the whole budget is used, and the error at its end is CONTROLLER_UNAVAILABLE all the same.

Every answer names its controller's cluster epoch (tidelog/clusterepoch.py); once an epoch is
seen, an answer of an older one (a controller a forced quorum recovery replaced) is refused as
CLUSTER_EPOCH_FENCED, logged, and the other nodes are asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tidelog import credentials as credentials_mod
from tidelog.clusterauth import CALL_KEY, secret_from_env, sign_call
from tidelog.clusterepoch import CALLER_EPOCH_KEY, EpochSeen, reply_epoch
from tidelog.credentials import Credentials, Signer
from tidelog.errors import (
    ClusterEpochFencedError,
    ControllerNotLeaderError,
    ControllerUnavailableError,
    InvalidArgumentError,
    TidelogError,
    UnavailableError,
)
from tidelog.proto import broker_pb2, broker_pb2_grpc
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.tasks import within
from tidelog.tlsconfig import CA_FILE_ENV, FROM_ENV, ClientTls, FromEnv, aio_channel, resolve_client
from tidelog.wire import CHANNEL_OPTIONS, ERROR_CODE_KEY, error_from_rpc, is_unreachable

log = logging.getLogger(__name__)

CONTROLLERS_ENV = "TIDE_CONTROLLERS"
#: In a broker's data dir: the highest controller cluster epoch it has seen, so that a restart
#: keeps refusing the controllers a forced recovery replaced.
SEEN_EPOCH_FILE = "controller-cluster.epoch"
# A read-only route call that has no answer this soon is also sent to the next controller node.
HEDGE_AFTER_S = 0.3
# A user's call that needs the controllers gives up with CONTROLLER_UNAVAILABLE when none of them
# has answered anything (not even "not the leader") for this long.
QUORUM_TIMEOUT_S = 5.0
META_PAGE = 10_000  # metadata entries asked per MetaList call
# Once a call found the quorum away, later calls give up after this long until a controller answers
# again: a consumer's heartbeat or a CLI's second call does not wait the whole QUORUM_TIMEOUT_S again.
AWAY_QUORUM_TIMEOUT_S = 1.0
# Route replies that a broker answers from its view (route-service calls and ListTopics).
_LOOKUPS = frozenset({"GetRoute", "DescribeBrokerSets", "ListTopics"})
# Calls that change cluster membership: they prove the cluster secret (tidelog.clusterauth).
SIGNED = frozenset(
    {
        "RegisterBroker",
        "Heartbeat",
        "AlterSyncStateSet",
        "ElectMaster",
        "CleanBrokerData",
        "DecommissionBroker",
        "RepairPlacement",
        # users and grants: an operator holding the secret manages them before any user exists
        "CreateUser",
        "DeleteUser",
        "ListUsers",
        "GrantAcl",
        "RevokeAcl",
        "ListAcls",
    }
)


def parse_addresses(addresses: str | Iterable[str]) -> list[str]:
    """'h1:p1,h2:p2' (also ';'-separated) or a list -> ['h1:p1', 'h2:p2']. A malformed address is
    refused at once: gRPC would quietly try port 443 for one without a port, and retry one it
    cannot parse for the whole call's budget."""
    items = addresses.replace(";", ",").split(",") if isinstance(addresses, str) else list(addresses)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise UnavailableError(
            "no controller address given", hint=f"pass --controllers or set ${CONTROLLERS_ENV}"
        )
    for address in out:
        problem = address_problem(address)
        if problem is not None:
            raise InvalidArgumentError(
                f"controller address {address!r} {problem}",
                hint=f"write each as host:port, such as 127.0.0.1:9701, in --controllers or ${CONTROLLERS_ENV}",
            )
    return out


#: Topics per ListTopics page when a caller wants them all: small replies, a bounded wait each.
LIST_PAGE = 5000
#: A bulk call's deadline (CreateTopics of up to 1,000 topics in one commit).
BULK_CALL_TIMEOUT_S = 30.0
# A designated election that replaces a live master is answered once the master's lease has run out
# (controller RULES.md L7: 3/4 of the heartbeat timeout): room for timeouts up to ~15 s.
HANDOVER_CALL_S = 15.0


def _read_epoch(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return max(0, int(path.read_text().strip() or 0))
    except FileNotFoundError:
        return 0
    except ValueError:
        log.warning("%s is unreadable; starting from cluster epoch 0", path)
        return 0


def _write_epoch(path: Path, epoch: int) -> None:
    """Durably, before the answer that raised it is acted on."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _EpochCheck(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Refuses the answers of a controller whose cluster epoch is older than one already seen, and
    names that epoch in every call, so that such a controller refuses the call before acting on it."""

    def __init__(self, address: str, seen: EpochSeen, on_raise: Callable[[int], None]) -> None:
        self.address = address
        self.seen = seen
        self.on_raise = on_raise
        self._warned = -1

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if self.seen.value > 0:
            # the controller refuses the call itself when its epoch is older (it must not act on it)
            extra = (CALLER_EPOCH_KEY, str(self.seen.value))
            details = grpc.aio.ClientCallDetails(
                details.method,
                details.timeout,
                grpc.aio.Metadata(*(details.metadata or ()), extra),
                details.credentials,
                details.wait_for_ready,
            )
        call = await continuation(details, request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if is_unreachable(exc) and not dict(exc.trailing_metadata() or ()).get(ERROR_CODE_KEY):
                raise  # no server answered: nothing to check
            self._check(exc.initial_metadata())
            raise
        self._check(await call.initial_metadata())
        return call

    def _check(self, metadata: Any) -> None:
        answered = reply_epoch(metadata)
        before = self.seen.value
        try:
            if self.seen.check(answered, f"the controller at {self.address}"):
                log.info("controllers: cluster epoch %d seen (was %d) at %s", answered, before, self.address)
                self.on_raise(answered)
        except ClusterEpochFencedError as err:
            if self._warned != answered:
                self._warned = answered
                log.warning("%s", err)
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata((ERROR_CODE_KEY, err.code)),
                details=err.message,
            ) from None


def address_problem(address: str) -> str | None:
    """What is wrong with a host:port address ("has no port", ...), or None when it is well formed."""
    host, colon, port = address.rpartition(":")
    if (
        not colon
        or (host.startswith("[") != host.endswith("]"))
        or (":" in host and not host.startswith("["))
    ):
        return "has no port"
    if not host.strip("[]"):
        return "has no host"
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"has no valid port ({port!r} is not a number from 1 to 65535)"
    return None


async def speaks_tls(address: str, timeout: float = 1.0) -> bool:
    """Whether the server at `address` completes (or refuses only for want of a client
    certificate) a TLS handshake: what a plain-text client's "Socket closed" means then."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        _, writer = await within(asyncio.open_connection(host.strip("[]"), int(port), ssl=context), timeout)
    except ssl.SSLError as exc:
        # a server asking for a client certificate answers with a TLS alert: it speaks TLS
        return "ALERT" in str(exc.reason or "")
    except (OSError, ValueError, TimeoutError):
        return False
    # no TLS shutdown: waiting for the server's close_notify took uvloop its 30 s timeout
    writer.transport.abort()
    return True


#: A controller that was down (restarted, or stopped for a forced recovery: docs/RUNBOOK-quorum.md)
#: is tried again at least every second, not every 3 s: the brokers' heartbeats and a master's
#: pending SyncStateSet change reach it a second after it listens, not up to 3 s later. There are
#: three controllers or so, so the extra connection attempts cost nothing.
CONTROLLER_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    *((k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.max_reconnect_backoff_ms"),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class _Conn:
    def __init__(
        self,
        address: str,
        tls: ClientTls | None,
        sign: Signer | None,
        seen: EpochSeen,
        on_raise: Callable[[int], None],
    ) -> None:
        self.address = address
        checks: list[Any] = [_EpochCheck(address, seen, on_raise)]
        if sign:
            checks.append(sign)
        self.channel = aio_channel(address, tls, CONTROLLER_CHANNEL_OPTIONS, interceptors=checks)
        self.broker = pb_grpc.ControllerBrokerStub(self.channel)
        self.route = pb_grpc.ControllerRouteStub(self.channel)
        self.admin = pb_grpc.ControllerAdminStub(self.channel)


#: What `_sweep` returns when no node answered (a reply may be any message, so not None).
_NO_REPLY = object()


_FIRST_BACKOFF = 0.05  # seconds between the first two rounds over the nodes (then doubling to 0.5)


@dataclass
class _Hedge:
    """One hedged route call: the nodes in the order to ask them, and what is in flight."""

    service: str
    method: str
    request: Any
    per_call: float
    deadline: float
    order: list[str]
    pending: dict[asyncio.Task[Any], str] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)
    last: TidelogError | None = None
    backoff: float = _FIRST_BACKOFF
    started: float = field(default_factory=time.monotonic)

    def fresh(self) -> list[str]:
        return [a for a in self.order if a not in self.tried]


def _retryable(err: TidelogError) -> bool:
    # Not-leader, "not serving yet" and a replaced controller (an older cluster epoch) say nothing
    # about the request; everything else is an answer.
    return isinstance(err, ControllerNotLeaderError | ClusterEpochFencedError) or type(err) in (
        UnavailableError,
        ControllerUnavailableError,
    )


def _tls_refusal(err: TidelogError) -> bool:
    text = err.message.lower()
    return any(word in text for word in ("ssl", "handshake", "certificate", "tls"))


def gave_up(last: TidelogError | None, addresses: Sequence[str], total: float) -> TidelogError:
    """The error a call raises when its budget ran out: the last "not here / not now" answer, or
    UNAVAILABLE naming the controllers tried when that answer names none of them (a call that
    timed out before its connection was up says only DEADLINE_EXCEEDED)."""
    if isinstance(last, ControllerUnavailableError):
        return last
    if isinstance(last, ControllerNotLeaderError) and not last.leader:
        # nodes answer, but none leads: no quorum
        return ControllerUnavailableError(last.message)
    if last is not None and (type(last) is not UnavailableError or any(a in last.message for a in addresses)):
        if type(last) is UnavailableError and not _tls_refusal(last):
            return ControllerUnavailableError(last.message)
        return last  # an answer, or a TLS refusal: fixing the client's setup helps, waiting does not
    why = f"; last error: {last.message}" if last is not None else ""
    return ControllerUnavailableError(
        f"no controller answered within {total:.1f}s (tried {', '.join(addresses)}){why}"
    )


class ControllerClient:
    """Async client for a controller cluster given as 'host:port[,host:port...]' or a list."""

    def __init__(
        self,
        addresses: str | Iterable[str],
        *,
        rpc_timeout: float = 3.0,
        total_timeout: float = 15.0,
        secret: str | None = None,
        tls: ClientTls | None | FromEnv = FROM_ENV,
        credentials: Credentials | None | credentials_mod.FromEnv = credentials_mod.FROM_ENV,
        member: bool = False,
        quorum_timeout: float | None = None,
        cluster_epoch: int = 0,
        epoch_file: Path | None = None,
    ) -> None:
        self._addresses = parse_addresses(addresses)
        # Addresses known to be brokers' (a route answer said so, or a route named them): asked for
        # lookups after the controllers, and last for everything else.
        self._brokers: list[str] = []
        # the highest cluster epoch seen; with `epoch_file` (a broker's), kept across restarts
        self.epoch_file = epoch_file
        self.epoch_seen = EpochSeen(max(cluster_epoch, _read_epoch(epoch_file)))
        # A user's calls are signed with its credentials (tools and applications: the environment's);
        # a cluster member (`member`) signs every call with the cluster secret instead.
        self.credentials = None if member else credentials_mod.resolve(credentials)
        self.member = member
        # TLS toward every node: brokers pass their own (or None), tools and applications take
        # $TIDE_CA_FILE (tidelog/tlsconfig.py)
        self.tls = resolve_client(tls)
        # Signs the membership calls (SIGNED); brokers pass theirs, operators' tools the environment's.
        self.secret = secret or secret_from_env()
        self._conns: dict[str, _Conn] = {}
        self._preferred: str = self._addresses[0]
        # heartbeat copies in flight, one per (node, broker): brokers may share a client
        self._copies: dict[tuple[str, str, int], asyncio.Task[None]] = {}
        self.rpc_timeout = rpc_timeout
        self.total_timeout = total_timeout
        self.quorum_timeout = quorum_timeout
        self._away = False  # the last call found no controller quorum
        # How old the last lookup answer was: 0 from a controller, the broker's view's age from one.
        self.last_lookup_age_ms = 0
        # Told once per call when no node answered the first round (the command line says what
        # it is still trying rather than waiting out the whole timeout in silence).
        self.on_wait: Callable[[str], None] | None = None
        # nodes a plain-text client found closing its connections, asked once whether they speak TLS
        self._tls_probed: set[str] = set()

    def _waiting(self, err: TidelogError | None, deadline: float) -> None:
        if self.on_wait is not None:
            self.on_wait(
                f"no controller answered yet ({err.message if err else 'no reply'}); still trying "
                f"{', '.join(self._addresses)} for up to {max(0.0, deadline - time.monotonic()):.0f} s"
            )

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    @property
    def brokers(self) -> list[str]:
        """The brokers' addresses this client falls back to for lookups."""
        return list(self._brokers)

    def learn_brokers(self, addresses: Iterable[str]) -> None:
        """Remember brokers' gRPC addresses (a route's replicas) to ask for lookups while no
        controller answers."""
        for a in addresses:
            if a and a not in self._brokers:
                self._brokers.append(a)

    def _order(self, preferred: str | None = None) -> list[str]:
        """Whom to ask: the preferred node, the other controllers, then the brokers."""
        first = preferred or self._preferred
        rest = [a for a in self._addresses if a != first]
        nodes = (
            [first] + [a for a in rest if a not in self._brokers] + [a for a in rest if a in self._brokers]
        )
        return nodes + [b for b in self._brokers if b not in nodes]

    def _note_lookup(self, address: str, reply: Any) -> bool:
        """Record where a lookup's answer came from; True when a controller gave it."""
        if getattr(reply, "from_broker", False):
            self.learn_brokers([address])
            self.last_lookup_age_ms = int(reply.metadata_age_ms)
            return False
        self.last_lookup_age_ms = 0
        return True

    @property
    def leader_hint(self) -> str:
        """The node the next call goes to first (the last one that answered)."""
        return self._preferred

    def _conn(self, address: str) -> _Conn:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = _Conn(
                address,
                self.tls,
                credentials_mod.signer(self.credentials),
                self.epoch_seen,
                self._epoch_raised,
            )
        return conn

    def _epoch_raised(self, epoch: int) -> None:
        if self.epoch_file is not None:
            _write_epoch(self.epoch_file, epoch)

    async def close(self) -> None:
        for task in list(self._copies.values()):
            task.cancel()
        conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            await c.channel.close()

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        timeout: float | None = None,
        total_timeout: float | None = None,
        address: str | None = None,
    ) -> Any:
        """Call `service.method` ('broker', 'route' or 'admin'), following the leader.

        With `address`, ask exactly that node once (no retries, no leader following).
        """
        per_call = timeout or self.rpc_timeout
        if address is not None:
            try:
                return await getattr(getattr(self._conn(address), service), method)(
                    request, timeout=per_call, metadata=self._signature(method, request)
                )
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc) from None
        total = total_timeout or self.total_timeout
        start = time.monotonic()
        deadline = start + total
        if method in _LOOKUPS and len(self._order()) > 1:
            deadline = min(deadline, start + self._quorum_budget(total, lookup=True))
            return await self._hedged(service, method, request, per_call, deadline)
        last: TidelogError | None = None
        backoff = _FIRST_BACKOFF
        heard = start  # when a node last answered at all ("not the leader" counts)
        quorum = self._quorum_budget(total)
        while True:
            limit = min(deadline, heard + quorum)
            reply, err, answered = await self._sweep(service, method, request, per_call, limit)
            if reply is not _NO_REPLY:
                self._away = False
                return reply
            last = err or last
            if answered:
                heard = time.monotonic()
                self._away = False
            if time.monotonic() >= min(deadline, heard + quorum):
                break
            if backoff == _FIRST_BACKOFF:
                self._waiting(last, deadline)
            await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, 0.5)
        err = gave_up(last, self._addresses, min(total, time.monotonic() - start))
        self._away = isinstance(err, ControllerUnavailableError)
        raise err

    def _quorum_budget(self, total: float, *, lookup: bool = False) -> float:
        """How long a call may go without any node answering before CONTROLLER_UNAVAILABLE."""
        if self.quorum_timeout is None or self.member:
            return total
        if lookup:
            # with brokers to ask a lookup is answered anyway; without, a live controller answers it at once
            return total if self._brokers else self.quorum_timeout
        return min(self.quorum_timeout, AWAY_QUORUM_TIMEOUT_S) if self._away else self.quorum_timeout

    async def _sweep(
        self, service: str, method: str, request: Any, per_call: float, deadline: float
    ) -> tuple[Any, TidelogError | None, bool]:
        """One pass over the nodes, the preferred one first, following a leader a node names.

        Returns the reply (`_NO_REPLY` when no node gave one), the last retryable error, and
        whether a node answered "not the leader" (the controllers are there, a quorum may form).
        """
        queue = [self._preferred] + [a for a in self._addresses if a != self._preferred]
        queue.sort(key=lambda a: a in self._brokers)  # the controllers first, in that order
        tried: set[str] = set()
        last: TidelogError | None = None
        answered = False
        while queue:
            addr = queue.pop(0)
            remaining = deadline - time.monotonic()
            if addr in tried or remaining <= 0:
                continue
            tried.add(addr)
            stub = getattr(self._conn(addr), service)
            try:
                reply = await getattr(stub, method)(
                    request, timeout=min(per_call, remaining), metadata=self._signature(method, request)
                )
            except grpc.aio.AioRpcError as exc:
                last = self._retryable_or_raise(await self._diagnose(exc, addr), addr)
                answered = answered or isinstance(last, ControllerNotLeaderError)
                leader = self._follow_leader(last, tried)
                if leader is not None:
                    log.debug("%s.%s: %s is not the leader, following %s", service, method, addr, leader)
                    queue.insert(0, leader)
                continue
            if method not in _LOOKUPS or self._note_lookup(addr, reply):
                self._preferred = addr
            return reply, last, True
        return _NO_REPLY, last, answered

    async def _diagnose(self, exc: grpc.aio.AioRpcError, addr: str) -> TidelogError:
        """The error an RPC failure stands for, told as what the user did wrong when the node is
        no controller (a broker answers UNIMPLEMENTED) or wants TLS from a plain-text client
        (it closes the connection, which gRPC reports as UNAVAILABLE "Socket closed")."""
        err = error_from_rpc(exc)
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            what = (
                "a broker, not a controller"
                if await self._is_broker(addr)
                else "not a controller: it does not serve tidelog's controller calls"
            )
            return InvalidArgumentError(
                f"{addr} is {what}",
                hint=f"pass a controller's address in --controllers or ${CONTROLLERS_ENV}",
            )
        if type(err) is UnavailableError and self.tls is None and addr not in self._tls_probed:
            self._tls_probed.add(addr)
            if await speaks_tls(addr):
                return InvalidArgumentError(
                    f"{addr} requires TLS: pass --ca-file (or ${CA_FILE_ENV})",
                    hint="the CA that `tide cluster up` made is <data-dir>/tls/ca.pem",
                )
        return err

    async def _is_broker(self, addr: str) -> bool:
        try:
            await broker_pb2_grpc.BrokerStub(self._conn(addr).channel).Status(
                broker_pb2.StatusRequest(), timeout=self.rpc_timeout
            )
        except grpc.aio.AioRpcError:
            return False
        return True

    def _retryable_or_raise(self, err: TidelogError, addr: str) -> TidelogError:
        """`err` when asking elsewhere may help; raised when it is the answer (`addr` answered)."""
        if not _retryable(err):
            if addr not in self._brokers:
                self._preferred = addr
                self._away = False  # a controller answered
            raise err from None  # the RPC failure it came from adds nothing for the caller
        return err

    def _follow_leader(self, err: TidelogError, tried: set[str]) -> str | None:
        """The leader `err` names, if not asked yet: remembered and preferred from now on."""
        leader: str | None = getattr(err, "leader", None)
        if not leader or leader in tried:
            return None
        if leader not in self._addresses:
            self._addresses.append(leader)
        self._preferred = leader
        return leader

    def _signature(self, method: str, request: Any) -> tuple[tuple[str, str], ...] | None:
        """The cluster-secret proof a membership call carries (a fresh one per attempt)."""
        if (method not in SIGNED and not self.member) or not self.secret:
            return None
        broker_id = -1
        if method == "Heartbeat":
            broker_id = request.broker_id
        elif method == "AlterSyncStateSet":
            broker_id = request.master_id
        elif method == "RegisterBroker" and request.HasField("broker_id"):
            broker_id = request.broker_id
        token = sign_call(
            self.secret,
            method,
            request.SerializeToString(deterministic=True),
            getattr(request, "broker_set", ""),
            broker_id,
            int(time.time() * 1000),
        )
        return ((CALL_KEY, token),)

    async def _hedged(self, service: str, method: str, request: Any, per_call: float, deadline: float) -> Any:
        """A read-only lookup to several nodes at once, the next one `HEDGE_AFTER_S` later.

        A controller node cut off by the network does not refuse, it goes silent: asking the
        nodes one after the other would spend a whole per-call timeout on it first. Route calls
        change nothing, so asking two nodes costs only a duplicate read; followers answer with
        the leader's address (CONTROLLER_NOT_LEADER) and the leader is asked next. The first
        answer wins; the others are cancelled. The brokers come after the controllers: they answer
        from a view that may be a heartbeat old, so they are asked only once every controller
        has had `HEDGE_AFTER_S` to answer.
        """
        h = _Hedge(service, method, request, per_call, deadline, order=self._order())
        try:
            while True:
                if not h.pending:
                    await self._hedge_next_round(h)
                done, _ = await asyncio.wait(
                    h.pending, timeout=HEDGE_AFTER_S, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    fresh = h.fresh()
                    if fresh:
                        self._hedge_start(h, fresh[0])
                    continue
                for task in done:
                    if await self._hedge_settle(h, task):
                        return task.result()
        finally:
            for task in h.pending:
                task.cancel()

    def _hedge_start(self, h: _Hedge, addr: str) -> None:
        h.tried.add(addr)
        remaining = max(0.05, min(h.per_call, h.deadline - time.monotonic()))
        stub = getattr(self._conn(addr), h.service)
        # a member's route calls prove the secret like all its others (users sign in the channel)
        call = getattr(stub, h.method)(
            h.request, timeout=remaining, metadata=self._signature(h.method, h.request)
        )
        h.pending[asyncio.ensure_future(call)] = addr

    async def _hedge_next_round(self, h: _Hedge) -> None:
        """Nothing in flight: ask the next node; every node asked: wait, then start over."""
        fresh = h.fresh()
        if not fresh:
            if time.monotonic() >= h.deadline:
                raise gave_up(h.last, h.order, h.deadline - h.started)
            if h.backoff == _FIRST_BACKOFF:
                self._waiting(h.last, h.deadline)
            await asyncio.sleep(min(h.backoff, max(0.0, h.deadline - time.monotonic())))
            h.backoff = min(h.backoff * 2, 0.5)
            h.tried.clear()
            fresh = list(h.order)
        self._hedge_start(h, fresh[0])

    async def _hedge_settle(self, h: _Hedge, task: asyncio.Task[Any]) -> bool:
        """True when `task` answered; an answer that is an error is raised; a retryable one is
        remembered, and the leader it names is asked at once."""
        addr = h.pending.pop(task)
        exc = task.exception()
        if exc is None:
            if self._note_lookup(addr, task.result()):
                self._preferred = addr  # a broker's answer does not make it the first to ask
            return True
        err = (
            await self._diagnose(exc, addr)
            if isinstance(exc, grpc.aio.AioRpcError)
            else UnavailableError(str(exc))
        )
        if addr in self._brokers and h.pending and not _retryable(err):
            # a broker's view may lag a controller that is still to answer (a topic just created)
            h.last = err
            return False
        h.last = self._retryable_or_raise(err, addr)
        leader = self._follow_leader(h.last, h.tried)
        if leader is not None:
            h.order = [leader] + [a for a in h.order if a != leader]
            self._hedge_start(h, leader)
        return False

    # --- broker-facing --------------------------------------------------------------------

    async def register_broker(
        self,
        broker_set: str,
        address: str,
        ha_address: str,
        *,
        identity: str,
        broker_id: int | None = None,
        datacenter: str = "",
        rack: str = "",
        cluster_id: str = "",
    ) -> pb.RegisterBrokerReply:
        req = pb.RegisterBrokerRequest(
            broker_set=broker_set,
            address=address,
            ha_address=ha_address,
            datacenter=datacenter,
            rack=rack,
            identity=identity,
            cluster_id=cluster_id,
        )
        if broker_id is not None:
            req.broker_id = broker_id
        return await self.call("broker", "RegisterBroker", req)

    async def heartbeat(
        self,
        broker_set: str,
        broker_id: int,
        *,
        epoch: int,
        max_offset: int,
        confirm_offset: int = -1,
        priority: int | None = None,
        total_timeout: float | None = None,
        acl_version: int = 0,
        topics_version: str = "",
        cluster_version: int = 0,
    ) -> pb.HeartbeatReply:
        """One heartbeat to the leader, answered with the broker's role, and a copy to every other
        node (controller RULES.md L0): a follower that becomes leader then knows which brokers
        fell silent and need not wait a whole timeout before failing a silent master over."""
        req = pb.HeartbeatRequest(
            broker_set=broker_set,
            broker_id=broker_id,
            epoch=epoch,
            max_offset=max_offset,
            confirm_offset=confirm_offset,
            acl_version=acl_version,
            topics_version=topics_version,
            cluster_version=cluster_version,
        )
        if priority is not None:
            req.priority = priority
        for addr in self._addresses:
            key = (addr, broker_set, broker_id)
            if addr != self._preferred and key not in self._copies:
                task = asyncio.ensure_future(self._copy(addr, req, total_timeout or self.rpc_timeout))
                self._copies[key] = task
                task.add_done_callback(lambda _t, k=key: self._copies.pop(k, None))  # type: ignore[misc]
        return await self.call("broker", "Heartbeat", req, total_timeout=total_timeout)

    async def _copy(self, address: str, req: pb.HeartbeatRequest, timeout: float) -> None:
        """Send a heartbeat copy; its only use is the node's table, so the answer is dropped,
        except that a node answering as leader becomes the next call's first choice. At most one
        copy per node and broker is in flight, so a silent node does not collect them (per broker:
        brokers sharing a client, as in an embedded cluster, would otherwise starve each other's
        copies when they beat in step)."""
        try:
            await self._conn(address).broker.Heartbeat(
                req, timeout=timeout, metadata=self._signature("Heartbeat", req)
            )
        except grpc.aio.AioRpcError:
            return
        self._preferred = address

    async def alter_sync_state_set(
        self,
        broker_set: str,
        master_id: int,
        master_epoch: int,
        new_sync_state_set: Iterable[int],
        sync_state_set_epoch: int,
        attempt: int = 0,
    ) -> pb.AlterSyncStateSetReply:
        """`attempt`: the master's number for this attempt, increasing within its epoch (0: none;
        controller/RULES.md A4b)."""
        req = pb.AlterSyncStateSetRequest(
            broker_set=broker_set,
            master_id=master_id,
            master_epoch=master_epoch,
            new_sync_state_set=sorted(new_sync_state_set),
            sync_state_set_epoch=sync_state_set_epoch,
            attempt=attempt,
        )
        return await self.call("broker", "AlterSyncStateSet", req)

    async def elect_master(
        self,
        broker_set: str,
        broker_id: int | None = None,
        *,
        designated: bool = False,
        restarted_epoch: int = 0,
        unclean: bool = False,
    ) -> pb.ElectMasterReply:
        """`restarted_epoch`: the asking broker is the recorded master of that epoch, back from a
        crash, and asks for a new one (controller/RULES.md E8). `unclean` (with `designated`):
        elect the named broker even from outside the SyncStateSet."""
        req = pb.ElectMasterRequest(
            broker_set=broker_set,
            designated=designated,
            restarted=restarted_epoch > 0,
            restarted_epoch=restarted_epoch,
            unclean=unclean,
        )
        if broker_id is not None:
            req.broker_id = broker_id
        # a designated election that replaces a live master waits out its lease on the controller
        # (3/4 of the heartbeat timeout, RULES.md L7) before it answers
        timeout = max(self.rpc_timeout, HANDOVER_CALL_S) if designated else None
        return await self.call("admin" if designated else "broker", "ElectMaster", req, timeout=timeout)

    # --- client-facing --------------------------------------------------------------------

    async def get_route(self, topic: str) -> pb.GetRouteReply:
        return await self.call("route", "GetRoute", pb.GetRouteRequest(topic=topic))

    async def describe_broker_sets(self, names: Iterable[str] = ()) -> pb.DescribeBrokerSetsReply:
        return await self.call("route", "DescribeBrokerSets", pb.DescribeBrokerSetsRequest(names=list(names)))

    # --- admin ----------------------------------------------------------------------------

    async def create_topic(
        self, name: str, queues: dict[str, int], perm: str = "rw", retention_ms: int = 0
    ) -> pb.TopicConfig:
        request = pb.CreateTopicRequest(name=name, queues=queues, perm=perm, retention_ms=retention_ms)
        reply = await self.call("admin", "CreateTopic", request)
        return reply.topic

    async def create_topics(self, requests: Iterable[pb.CreateTopicRequest]) -> list[pb.CreateTopicResult]:
        """Several topics in one call (at most 1,000): one result per request, in order.

        One commit of many topics may take longer than a single call's usual deadline, and a call
        retried after its deadline finds the topics its first try created (TOPIC_EXISTS): the call
        gets a longer deadline instead."""
        request = pb.CreateTopicsRequest(topics=list(requests))
        per_call = max(self.rpc_timeout, BULK_CALL_TIMEOUT_S)
        reply = await self.call(
            "admin",
            "CreateTopics",
            request,
            timeout=per_call,
            total_timeout=max(self.total_timeout, per_call),
        )
        return list(reply.results)

    async def delete_topic(self, name: str) -> None:
        await self.call("admin", "DeleteTopic", pb.DeleteTopicRequest(name=name))

    async def alter_topic_queues(self, name: str, queues: dict[str, int]) -> pb.TopicConfig:
        """Grow a topic's queues per broker set (never down: TOPIC_QUEUES_SHRINK)."""
        reply = await self.call(
            "admin", "AlterTopicQueues", pb.AlterTopicQueuesRequest(name=name, queues=queues)
        )
        return reply.topic

    async def alter_topic_retention(self, name: str, retention_ms: int) -> pb.TopicConfig:
        """Set how long a topic's messages stay readable (0: the brokers' retention_ms)."""
        request = pb.AlterTopicRetentionRequest(name=name, retention_ms=retention_ms)
        return (await self.call("admin", "AlterTopicRetention", request)).topic

    # --- users and grants ---

    # Changes to users and grants answer once every alive broker enforces them (or after two
    # heartbeat intervals): each returns the brokers ("set/id") not yet on it, empty when all are.

    async def create_user(self, name: str, access_key: str, signing_key: str) -> pb.CreateUserReply:
        req = pb.CreateUserRequest(name=name, access_key=access_key, signing_key=signing_key)
        reply: pb.CreateUserReply = await self.call("admin", "CreateUser", req)
        return reply

    async def delete_user(self, name: str) -> list[str]:
        reply = await self.call("admin", "DeleteUser", pb.DeleteUserRequest(name=name))
        return list(reply.not_yet_applied)

    async def list_users(self) -> list[pb.User]:
        return list((await self.call("admin", "ListUsers", pb.ListUsersRequest())).users)

    async def grant_acl(self, user: str, kind: str, pattern: str, permission: str) -> list[str]:
        grant = pb.Grant(user=user, kind=kind, pattern=pattern, permission=permission)
        reply = await self.call("admin", "GrantAcl", pb.GrantAclRequest(grant=grant))
        return list(reply.not_yet_applied)

    async def revoke_acl(self, user: str, kind: str, pattern: str, permission: str) -> list[str]:
        grant = pb.Grant(user=user, kind=kind, pattern=pattern, permission=permission)
        reply = await self.call("admin", "RevokeAcl", pb.RevokeAclRequest(grant=grant))
        return list(reply.not_yet_applied)

    async def list_acls(self, user: str = "") -> list[pb.Grant]:
        return list((await self.call("admin", "ListAcls", pb.ListAclsRequest(user=user))).grants)

    async def list_topics(self) -> list[pb.TopicConfig]:
        """Every topic, a page at a time (a controller before paging answers all at once)."""
        out: list[pb.TopicConfig] = []
        after = ""
        while True:
            page, after = await self.list_topics_page(start_after=after, limit=LIST_PAGE)
            out.extend(page)
            if not after:
                return out

    async def list_topics_page(
        self, *, prefix: str = "", start_after: str = "", limit: int = LIST_PAGE
    ) -> tuple[list[pb.TopicConfig], str]:
        """Topics in name order after `start_after` that begin with `prefix`, at most `limit` (0:
        all); with the name to start the next page after ("" when this was the last)."""
        request = pb.ListTopicsRequest(prefix=prefix, start_after=start_after, limit=limit)
        reply = await self.call("admin", "ListTopics", request)
        return list(reply.topics), reply.next_start_after

    async def clean_broker_data(
        self, broker_set: str, broker_ids: Iterable[int] = (), *, clean_living: bool = False
    ) -> None:
        await self.call(
            "admin",
            "CleanBrokerData",
            pb.CleanBrokerDataRequest(
                broker_set=broker_set, broker_ids=sorted(broker_ids), clean_living=clean_living
            ),
        )

    async def placement_audit(self) -> pb.PlacementAuditReply:
        return await self.call("admin", "PlacementAudit", pb.PlacementAuditRequest())

    async def decommission_broker(
        self, broker_set: str, broker_id: int, *, force: bool = False, replacement: int | None = None
    ) -> pb.DecommissionBrokerReply:
        req = pb.DecommissionBrokerRequest(broker_set=broker_set, broker_id=broker_id, force=force)
        if replacement is not None:
            req.replacement = replacement
        # a removal and its ledgers' re-replication are several Raft commits: more than one call's usual time
        return await self.call("admin", "DecommissionBroker", req, timeout=30.0)

    async def repair_placement(self, max_ledgers: int = 0) -> pb.RepairPlacementReply:
        return await self.call(
            "admin", "RepairPlacement", pb.RepairPlacementRequest(max_ledgers=max_ledgers), timeout=60.0
        )

    async def meta_create(self, key: str, value: bytes) -> pb.MetaEntry:
        return await self.call("admin", "MetaCreate", pb.MetaCreateRequest(key=key, value=value))

    async def meta_get(self, key: str) -> pb.MetaEntry:
        return await self.call("admin", "MetaGet", pb.MetaGetRequest(key=key))

    async def meta_cas(
        self, key: str, value: bytes, expected_version: int, *, ledger_password: bytes | None = None
    ) -> pb.MetaEntry:
        """`ledger_password`: required for ledger metadata (`ledger/` keys), the ledger's password."""
        req = pb.MetaCompareAndSetRequest(key=key, value=value, expected_version=expected_version)
        if ledger_password is not None:
            req.ledger_password = ledger_password
        return await self.call("admin", "MetaCompareAndSet", req)

    async def meta_delete(
        self, key: str, expected_version: int | None = None, *, ledger_password: bytes | None = None
    ) -> None:
        req = pb.MetaDeleteRequest(key=key)
        if expected_version is not None:
            req.expected_version = expected_version
        if ledger_password is not None:
            req.ledger_password = ledger_password
        await self.call("admin", "MetaDelete", req)

    async def meta_list(self, prefix: str = "", page: int = META_PAGE) -> list[pb.MetaEntry]:
        """Every entry under `prefix`, in key order, asked `page` at a time (a million ledgers'
        entries in one reply would pass gRPC's message limit). A controller of a release
        without pages answers all at once, with no next page."""
        out: list[pb.MetaEntry] = []
        start_after = ""
        while True:
            req = pb.MetaListRequest(prefix=prefix, start_after=start_after, limit=page)
            reply = await self.call("admin", "MetaList", req)
            out.extend(reply.entries)
            if not reply.next_start_after:
                return out
            start_after = reply.next_start_after

    async def cluster_status(self, address: str | None = None) -> pb.ClusterStatusReply:
        """Status of one node (`address`), or of whichever node answers first."""
        return await self.call("admin", "ClusterStatus", pb.ClusterStatusRequest(), address=address)
