"""The ledger client API: create, write, open (with or without recovery), read, tail, delete.

Theory of operation
-------------------
This module is the I/O shell around the pure cores of `metadata.py` and `recovery.py`: it talks
to the controller's versioned metadata store (every metadata change is a CAS) and to the brokers'
`Ledger` gRPC service, and it decides nothing the cores decide.

- **Create**: check every parameter first (no write before that), place the ledger on a broker
  set (`place_ledger`), take an id from the `ledger-id-counter` key by CAS, store the metadata
  under `ledger/{id:019d}`, then `Ledger.Create` on the set's master. If that fails, the metadata
  is deleted again (best effort) and the error raised.
- **Write** (`AsyncWriteHandle`): ids come from `WriterLedger` (0, 1, 2, …) at call time, adds are
  sent to the master at once (pipelined) and complete in id order once the master reports AQ
  replicas (rules W1–W3). "Not here / not now" answers are retried on the same entry id after a
  refresh of the master, until the add timeout; a fenced answer fails every pending add with
  LedgerFencedError; any other failure fails that add and every later pending one, and the
  handle refuses further adds.
- **Recovery open**: the password is checked against the metadata before anything is sent. Then
  `_RecoveryRun` drives `Recovery`: every action it hands back is carried out concurrently
  (fence and read every replica, rewrite through the master, CAS the metadata) and every answer
  fed back, until the core is DONE or ABORTED.
- **Read** (`AsyncReadHandle`): entries up to the LAC known to the handle, from any replica
  (slaves first, then the master), each entry's digest verified; a replica that fails or returns
  a corrupt entry is skipped for the next. The LAC comes from the replicas' `Lac` answers; the
  master's answer is exact, so tidelog readers do not lag one entry behind as BookKeeper's do.

The synchronous classes (`Ledgers`, `WriteHandle`, `ReadHandle`) run these on the sync
`tidelog.client.Client`'s event loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer, until_superseded
from tidelog.client.runner import SyncFacade
from tidelog.errors import (
    DigestMatchError,
    FlushSlaveTimeoutError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
    LedgerRecoveryError,
    LedgerTimeoutError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    NoSuchEntryError,
    NoSuchLedgerExistsError,
    NotEnoughBookiesError,
    NotMasterError,
    TidelogError,
    UnauthorizedAccessError,
    UnavailableError,
)
from tidelog.ledger.digest import Digester, parse_digest_type
from tidelog.ledger.metadata import (
    LedgerEvent,
    LedgerMetadata,
    LedgerState,
    _is_int,
    apply_transition,
    check_create_params,
    new_ledger_metadata,
)
from tidelog.ledger.recovery import (
    Action,
    CloseLedger,
    FenceOutcome,
    MarkInRecovery,
    ReadEntry,
    ReadOutcome,
    Recovery,
    RecoveryState,
    RewriteEntry,
    SendFence,
    WriterLedger,
)
from tidelog.proto import ledger_pb2 as lpb
from tidelog.wire import error_from_rpc

if TYPE_CHECKING:
    from tidelog.client.aio import AsyncClient
    from tidelog.proto import controller_pb2

log = logging.getLogger(__name__)

__all__ = [
    "COUNTER_KEY",
    "DEFAULT_ADD_TIMEOUT",
    "LEDGER_KEY_PREFIX",
    "MAX_ENTRY_BYTES",
    "AsyncLedgers",
    "AsyncReadHandle",
    "AsyncWriteHandle",
    "BrokerSetView",
    "LedgerEntry",
    "Ledgers",
    "ReadHandle",
    "ReplicaView",
    "WriteHandle",
    "broker_set_views",
    "check_entry_data",
    "check_entry_range",
    "fence_outcome",
    "ledger_id_of_key",
    "ledger_key",
    "place_ledger",
    "read_order",
    "read_outcome",
]

LEDGER_KEY_PREFIX = "ledger/"
COUNTER_KEY = "ledger-id-counter"  # value: decimal ASCII of the next ledger id
# One entry is one commit-log record on the broker, whose default cap (broker/config.py
# max_message_bytes) is 4 MiB including the record's own headers; the gRPC limit is 64 MiB.
MAX_ENTRY_BYTES = (4 << 20) - (64 << 10)
DEFAULT_ADD_TIMEOUT = 30.0
MAX_LEDGER_ID = 2**63 - 1

# Master answers that say "not here / not now": the same request is sent again after a refresh.
_RETRY_MASTER = (NotMasterError, UnavailableError, FlushSlaveTimeoutError, NotEnoughBookiesError)


# --- pure helpers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One entry as read: its id, payload, the writer's LAC when it was sent, and the ledger's
    cumulative length through it."""

    entry_id: int
    data: bytes
    lac: int
    length: int


def ledger_key(ledger_id: int) -> str:
    """The metadata key of a ledger; zero-padded so that keys sort like ids."""
    return f"{LEDGER_KEY_PREFIX}{ledger_id:019d}"


def ledger_id_of_key(key: str) -> int | None:
    """The ledger id of a `ledger_key`, or None for any other key."""
    if not key.startswith(LEDGER_KEY_PREFIX):
        return None
    rest = key[len(LEDGER_KEY_PREFIX):]
    return int(rest) if rest.isdigit() and rest.isascii() else None


def _check_ledger_id_to_open(ledger_id: object) -> int:
    # docs/reference/bookkeeper-ledger.md §1.2: opening (or asking for the metadata of) a negative id is "no such ledger";
    # something that is not an id at all is a bad parameter
    if not _is_int(ledger_id):
        raise IncorrectParameterError(f"a ledger id is an integer, got {ledger_id!r}")
    assert isinstance(ledger_id, int)
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise NoSuchLedgerExistsError(f"no ledger {ledger_id} (ledger ids are never negative)", ledger_id=ledger_id)
    return ledger_id


def _check_password(password: object) -> bytes:
    if not isinstance(password, bytes):
        raise IncorrectParameterError("a ledger password is bytes (empty is allowed)")
    return password


def check_entry_data(data: object, max_bytes: int = MAX_ENTRY_BYTES) -> bytes:
    """The entry payload as bytes, or IncorrectParameterError (not bytes, or larger than `max_bytes`)."""
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise IncorrectParameterError(f"entry data is bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise IncorrectParameterError(f"an entry holds at most {max_bytes} bytes, got {len(data)}",
                                      size=len(data), max_bytes=max_bytes)
    return data


def check_entry_range(first: object, last: object) -> tuple[int, int]:
    """(first, last) for a read, or IncorrectParameterError: ids are integers, 0 ≤ first ≤ last."""
    if not _is_int(first) or not _is_int(last):
        raise IncorrectParameterError(f"entry ids are integers, got first={first!r}, last={last!r}")
    assert isinstance(first, int) and isinstance(last, int)
    if first < 0 or last < 0:
        raise IncorrectParameterError(f"entry ids are never negative, got first={first}, last={last}")
    if first > last:
        raise IncorrectParameterError(f"first ({first}) is after last ({last})")
    if last > MAX_LEDGER_ID:
        raise IncorrectParameterError(f"entry id {last} is out of range")
    return first, last


@dataclass(frozen=True)
class ReplicaView:
    broker_id: int
    address: str
    alive: bool = True


@dataclass(frozen=True)
class BrokerSetView:
    """What the controller says about one broker set, as much as the ledger client needs."""

    name: str
    master_id: int | None
    master_address: str
    members: tuple[ReplicaView, ...]
    sync_state_set: frozenset[int] = frozenset()
    master_epoch: int = 0

    def address_of(self, broker_id: int) -> str | None:
        for m in self.members:
            if m.broker_id == broker_id:
                return m.address
        return None

    @property
    def member_ids(self) -> tuple[int, ...]:
        return tuple(sorted(m.broker_id for m in self.members))

    @property
    def available(self) -> int:
        """Replicas that can take writes now: the alive members, none without a master."""
        if self.master_id is None or not self.master_address:
            return 0
        return sum(1 for m in self.members if m.alive)


def broker_set_views(reply: controller_pb2.DescribeBrokerSetsReply) -> list[BrokerSetView]:
    """`DescribeBrokerSets`' answer as views; liveness counts only when the answer knows it."""
    out = []
    for b in reply.broker_sets:
        role = b.role
        alive_known = reply.liveness_known
        members = tuple(ReplicaView(int(m.broker_id), m.address, bool(m.alive) if alive_known else True)
                        for m in sorted(b.members, key=lambda m: m.broker_id))
        out.append(BrokerSetView(role.broker_set, int(role.master_id) if role.has_master else None,
                                 role.master_address if role.has_master else "", members,
                                 frozenset(int(i) for i in role.sync_state_set), int(role.master_epoch)))
    return sorted(out, key=lambda v: v.name)


def place_ledger(sets: Sequence[BrokerSetView], ledger_id: int, ensemble_size: int, write_quorum: int,
                 ack_quorum: int, *, broker_set: str | None = None) -> BrokerSetView:
    """The broker set a new ledger goes to (rules C1–C4).

    Named set: it must exist and match the quorums. Otherwise, among the sets with exactly
    `ensemble_size` members, those with a master and every member alive are candidates, and the
    ledger id picks one (ids are sequential, so ledgers spread evenly). No set of that size:
    IncorrectParameterError (can never succeed); sets of that size but none ready:
    NotEnoughBookiesError (retryable).
    """
    def check(view: BrokerSetView) -> None:
        check_create_params(ensemble_size, write_quorum, ack_quorum, view.available,
                            set_replicas=len(view.members), password=b"", custom_metadata={})

    if broker_set is not None:
        named = [s for s in sets if s.name == broker_set]
        if not named:
            raise IncorrectParameterError(f"no broker set {broker_set!r} (known: {sorted(s.name for s in sets)})",
                                          broker_set=broker_set)
        check(named[0])
        return named[0]
    fitting = sorted((s for s in sets if len(s.members) == ensemble_size), key=lambda s: s.name)
    if not fitting:
        sizes = {s.name: len(s.members) for s in sets}
        raise IncorrectParameterError(
            f"tidelog requires ensemble_size == write_quorum == the replicas of a broker set; no broker set has "
            f"{ensemble_size} replicas (sizes: {sizes})", sizes=sizes)
    ready = [s for s in fitting if s.available >= ensemble_size]
    if not ready:
        # let the core word the error for the best of them (quorum errors come first)
        check(max(fitting, key=lambda s: s.available))
        raise NotEnoughBookiesError(f"no broker set of {ensemble_size} replicas has all of them available")
    chosen = ready[ledger_id % len(ready)]
    check(chosen)
    return chosen


def read_order(view: BrokerSetView, replicas: Iterable[int]) -> list[tuple[int, str]]:
    """(broker id, address) of the replicas to read from: slaves first, the master last, so reads
    stay off the node that takes the writes. Replicas the set no longer knows are left out."""
    out = []
    for r in replicas:
        address = view.address_of(r)
        if address:
            out.append((r, address))
    return sorted(out, key=lambda ra: (ra[0] == view.master_id, ra[0]))


def fence_outcome(err: BaseException) -> FenceOutcome:
    """A failed Fence call as the core sees it: refused password, no answer in time, or an error."""
    if isinstance(err, UnauthorizedAccessError):
        return FenceOutcome.UNAUTHORIZED
    if isinstance(err, UnavailableError | LedgerTimeoutError | TimeoutError):
        return FenceOutcome.TIMEOUT
    return FenceOutcome.ERROR


def read_outcome(err: BaseException) -> ReadOutcome:
    """A failed recovery read as the core sees it. Only NoSuchEntry says the replica *knows* it
    never had the entry; everything else — a failed digest, a lost or unknown ledger included —
    is an unknown, which can abort a recovery but never shorten a ledger (RULES.md R6)."""
    if isinstance(err, NoSuchEntryError):
        return ReadOutcome.NO_SUCH_ENTRY
    if isinstance(err, UnauthorizedAccessError):
        return ReadOutcome.UNAUTHORIZED
    if isinstance(err, UnavailableError | LedgerTimeoutError | TimeoutError):
        return ReadOutcome.TIMEOUT
    return ReadOutcome.ERROR


def _entry(e: lpb.Entry) -> LedgerEntry:
    return LedgerEntry(int(e.entry_id), bytes(e.data), int(e.lac), int(e.length))


# --- the API --------------------------------------------------------------------------------


class AsyncLedgers:
    """Ledger operations of one `AsyncClient` (its controller client and broker channels)."""

    def __init__(self, client: AsyncClient, *, add_timeout: float = DEFAULT_ADD_TIMEOUT,
                 rpc_timeout: float | None = None, max_entry_bytes: int = MAX_ENTRY_BYTES) -> None:
        self.client = client
        self.controller = client.controller
        self.add_timeout = add_timeout
        self.rpc_timeout = rpc_timeout or client.rpc_timeout
        self.max_entry_bytes = max_entry_bytes
        self._sets: dict[str, tuple[float, BrokerSetView]] = {}
        self.set_ttl = 5.0

    # --- plumbing ---

    async def broker_set(self, name: str, *, refresh: bool = False) -> BrokerSetView:
        cached = self._sets.get(name)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self.set_ttl:
            return cached[1]
        views = broker_set_views(await self.controller.describe_broker_sets([name]))
        for v in views:
            self._sets[v.name] = (time.monotonic(), v)
        found = self._sets.get(name)
        if found is None or found[1].name != name:
            raise UnavailableError(f"broker set {name} is not registered with the controller")
        return found[1]

    async def _master_epoch(self, broker_set: str) -> int | None:
        return (await self.broker_set(broker_set, refresh=True)).master_epoch

    async def call(self, address: str, method: str, request: Any, timeout: float) -> Any:
        """One call of the Ledger service on one broker; errors come back typed."""
        try:
            return await getattr(self.client.ledger_stub(address), method)(request, timeout=max(0.05, timeout))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    async def call_master(self, broker_set: str, method: str, request: Any, *, deadline: float,
                          what: str) -> Any:
        """Call the set's master, retrying "not here / not now" after a refresh until `deadline`;
        then LedgerTimeoutError naming the last answer (the outcome is unknown)."""
        refresh = False
        backoff = 0.02
        last: TidelogError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LedgerTimeoutError(f"{what}: no confirmation within the timeout; last answer: {last}",
                                         cause=str(last))
            try:
                view = await self.broker_set(broker_set, refresh=refresh)
                refresh = False
                if not view.master_address:
                    raise UnavailableError(f"broker set {broker_set} has no master right now")
                call = self.call(view.master_address, method, request,
                                 min(self.rpc_timeout, deadline - time.monotonic()))
                return await until_superseded(call, broker_set, view.master_address, view.master_epoch,
                                              lambda: self._master_epoch(broker_set))
            except _RETRY_MASTER as exc:
                last = exc
                refresh = True
            await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, 0.5)

    async def read_metadata(self, ledger_id: int) -> LedgerMetadata:
        try:
            entry = await self.controller.meta_get(ledger_key(ledger_id))
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(f"no ledger {ledger_id}", ledger_id=ledger_id) from None
        return LedgerMetadata.decode(entry.value, version=entry.version)

    async def cas_metadata(self, new: LedgerMetadata, expected_version: int, password: bytes) -> LedgerMetadata | None:
        """Write `new` if the stored version is still `expected_version`: the stored metadata, or
        None when another write came first (re-read and decide again). The controller takes the
        write only with the ledger's `password` (RULES.md M8)."""
        try:
            entry = await self.controller.meta_cas(ledger_key(new.ledger_id), new.encode(), expected_version,
                                                   ledger_password=password)
        except MetadataVersionMismatchError:
            return None
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(f"ledger {new.ledger_id} was deleted", ledger_id=new.ledger_id) from None
        return LedgerMetadata.decode(entry.value, version=entry.version)

    async def seal_on_brokers(self, meta: LedgerMetadata, password: bytes) -> None:
        """Ask the set's master to seal a CLOSED ledger (`Ledger.Close`), so that every replica
        refuses later adds with LedgerClosedError. The master checks the controller's metadata
        itself. Best effort: the metadata is the ledger's end whatever happens here, and readers
        never read past it; a failure is logged, not raised."""
        try:
            await self.call_master(meta.broker_set, "Close", lpb.CloseRequest(ledger_id=meta.ledger_id,
                                                                              password=password),
                                   deadline=time.monotonic() + self.rpc_timeout, what=f"seal of ledger {meta.ledger_id}")
        except TidelogError as exc:
            log.warning("ledger %d is closed, but its broker set could not seal it (readers still stop at the "
                        "metadata's end): %s", meta.ledger_id, exc)

    async def query_lac(self, meta: LedgerMetadata, password: bytes, *, previous: int = -1,
                        wait_ms: int = 0) -> tuple[int, int, bool]:
        """(LAC, length through it, whether a replica has the ledger fenced), asked of every
        replica at once. The master's answer is exact and ends the wait; otherwise the largest
        answer wins once all are in (or, long polling, the first above `previous`)."""
        view = await self.broker_set(meta.broker_set)
        targets = read_order(view, meta.replicas)
        if not targets:
            raise LedgerReadError(f"no replica of ledger {meta.ledger_id} is known to broker set {meta.broker_set}")
        req = lpb.LacRequest(ledger_id=meta.ledger_id, password=password, previous=previous, wait_ms=wait_ms)
        timeout = self.rpc_timeout + wait_ms / 1000
        tasks = {asyncio.ensure_future(self.call(address, "Lac", req, timeout)): r for r, address in targets}
        best, best_length, fenced, answered = -1, 0, False, 0
        errors: dict[int, TidelogError] = {}
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                final = False
                for t in done:
                    try:
                        reply = t.result()
                    except TidelogError as exc:
                        errors[tasks[t]] = exc
                        continue
                    answered += 1
                    fenced = fenced or reply.fenced
                    if reply.lac > best or (reply.lac == best and reply.length > best_length):
                        best, best_length = int(reply.lac), int(reply.length)
                    final = final or reply.is_master or (wait_ms > 0 and reply.lac > previous)
                if final:
                    break
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if not answered:
            for err in errors.values():
                if isinstance(err, UnauthorizedAccessError):
                    raise err
            raise LedgerReadError(f"no replica of ledger {meta.ledger_id} answered a LAC read: "
                                  f"{ {r: str(e) for r, e in sorted(errors.items())} }")
        return best, best_length, fenced

    # --- operations ---

    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int, password: bytes,
                            digest: str = "crc32c", custom_metadata: Mapping[str, bytes] | None = None,
                            *, broker_set: str | None = None) -> AsyncWriteHandle:
        kind = parse_digest_type(digest)
        custom = {} if custom_metadata is None else custom_metadata
        # every parameter that does not depend on placement is checked before anything is written
        check_create_params(ensemble_size, write_quorum, ack_quorum, ensemble_size, set_replicas=ensemble_size,
                            password=password, digest_type=kind, custom_metadata=custom)
        if broker_set is not None and not isinstance(broker_set, str):
            raise IncorrectParameterError(f"broker_set is a name, got {broker_set!r}")
        views = broker_set_views(await self.controller.describe_broker_sets())
        while True:
            ledger_id, counter_version = await self._peek_counter()
            view = place_ledger(views, ledger_id, ensemble_size, write_quorum, ack_quorum, broker_set=broker_set)
            meta = new_ledger_metadata(ledger_id, view.name, view.member_ids, ack_quorum, password=password,
                                       digest_type=kind, custom_metadata=custom, ctime_ms=int(time.time() * 1000))
            if not await self._take_counter(ledger_id, counter_version):
                continue
            try:
                entry = await self.controller.meta_create(ledger_key(ledger_id), meta.encode())
            except MetadataExistsError:
                continue  # a ledger stored under this id by other means: never overwrite it, take the next id
            break
        meta = LedgerMetadata.decode(entry.value, version=entry.version)
        self._sets[view.name] = (time.monotonic(), view)
        try:
            await self.call_master(view.name, "Create", lpb.CreateRequest(ledger_id=ledger_id, metadata=meta.encode()),
                                   deadline=time.monotonic() + self.add_timeout, what=f"create of ledger {ledger_id}")
        except BaseException:
            with contextlib.suppress(Exception):
                await self.controller.meta_delete(ledger_key(ledger_id), ledger_password=password)
            raise
        log.info("created ledger %d on %s (E=WQ=%d, AQ=%d)", ledger_id, view.name, ensemble_size, ack_quorum)
        return AsyncWriteHandle(self, meta, password)

    async def _peek_counter(self) -> tuple[int, int | None]:
        try:
            entry = await self.controller.meta_get(COUNTER_KEY)
        except MetadataNotFoundError:
            return 0, None
        return int(entry.value.decode("ascii")), entry.version

    async def _take_counter(self, ledger_id: int, version: int | None) -> bool:
        value = str(ledger_id + 1).encode("ascii")
        try:
            if version is None:
                await self.controller.meta_create(COUNTER_KEY, value)
            else:
                await self.controller.meta_cas(COUNTER_KEY, value, version)
        except (MetadataExistsError, MetadataVersionMismatchError):
            return False  # another creator took it (or our own retried write did): take the next
        return True

    async def open_ledger(self, ledger_id: int, password: bytes, *, recovery: bool = True,
                          digest: str | None = None) -> AsyncReadHandle:
        ledger_id = _check_ledger_id_to_open(ledger_id)
        password = _check_password(password)
        meta = await self.read_metadata(ledger_id)
        # docs/reference/bookkeeper-ledger.md §2.4 step 0: the password (and the digest type, when named) are checked before
        # anything is sent to a replica, so a wrong password fences nothing
        if not meta.check_password(password):
            raise UnauthorizedAccessError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        if digest is not None and parse_digest_type(digest) is not meta.digest_type:
            raise DigestMatchError(f"ledger {ledger_id} uses {meta.digest_type}, not {digest}", ledger_id=ledger_id)
        if recovery:
            meta = await _RecoveryRun(self, meta, password).run()
            return AsyncReadHandle(self, meta, password, meta.last_entry_id, meta.length)
        if meta.state is LedgerState.CLOSED:
            return AsyncReadHandle(self, meta, password, meta.last_entry_id, meta.length)
        lac, length, fenced = await self.query_lac(meta, password)
        handle = AsyncReadHandle(self, meta, password, lac, length)
        if fenced:
            await handle.refresh_metadata()
        return handle

    async def delete_ledger(self, ledger_id: int, password: bytes) -> None:
        """Remove the ledger's metadata. Its entries stay in the commit logs until retention
        removes them; nobody can open the ledger any more. Unlike BookKeeper's deleteLedger this
        takes the ledger's password: the controller deletes ledger metadata only with it
        (UnauthorizedAccessError otherwise, RULES.md M8)."""
        if not _is_int(ledger_id) or ledger_id < 0:
            raise IncorrectParameterError(f"a ledger id is a non-negative integer, got {ledger_id!r}")
        password = _check_password(password)
        try:
            await self.controller.meta_delete(ledger_key(ledger_id), ledger_password=password)
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(f"no ledger {ledger_id}", ledger_id=ledger_id) from None

    async def list_ledgers(self) -> list[int]:
        ids = (ledger_id_of_key(e.key) for e in await self.controller.meta_list(LEDGER_KEY_PREFIX))
        return sorted(i for i in ids if i is not None)

    async def get_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self.read_metadata(_check_ledger_id_to_open(ledger_id))


@dataclass
class _PendingAdd:
    entry_id: int
    request: lpb.AddRequest
    future: asyncio.Future[int]
    task: asyncio.Task[None] | None = None


class AsyncWriteHandle:
    """The writer of one ledger (the handle `create_ledger` returns; the only one that adds)."""

    def __init__(self, ledgers: AsyncLedgers, metadata: LedgerMetadata, password: bytes) -> None:
        self._ledgers = ledgers
        self._meta = metadata
        self._password = password
        self.ledger_id = metadata.ledger_id
        self._core = WriterLedger(metadata.replicas, metadata.ack_quorum)
        self._digester = Digester(metadata.digest_type, password)
        self._pending: dict[int, _PendingAdd] = {}
        self._pushed_length = 0
        self._failure: TidelogError | None = None
        self._closing: asyncio.Future[None] | None = None

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._core.lac

    @property
    def last_add_pushed(self) -> int:
        return self._core.lap

    @property
    def length(self) -> int:
        """Bytes through the LAC."""
        return self._core.length

    @property
    def is_closed(self) -> bool:
        return self._core.closed or self._failure is not None

    async def add_entry(self, data: bytes) -> int:
        return await self.add_entry_async(data)

    def add_entry_async(self, data: bytes) -> asyncio.Future[int]:
        """Send an entry now and return a future of its id, which completes once AQ replicas hold
        it, in id order. Bad data raises IncorrectParameterError and a closed or failed handle
        LedgerClosedError here, at call time: the id is handed out only if the entry is sent."""
        data = check_entry_data(data, self._ledgers.max_entry_bytes)
        if self._failure is not None and not self._core.closed:
            raise LedgerClosedError(f"ledger {self.ledger_id}: the handle failed and takes no more adds "
                                    f"({self._failure})", ledger_id=self.ledger_id)
        entry_id = self._core.begin_add(len(data))  # LedgerClosedError once closed or fenced
        self._pushed_length += len(data)
        lac = self._core.lac
        request = lpb.AddRequest(
            ledger_id=self.ledger_id, entry_id=entry_id, password=self._password, lac=lac,
            length=self._pushed_length,
            digest=self._digester.compute(self.ledger_id, entry_id, lac, self._pushed_length, data), data=data)
        loop = asyncio.get_running_loop()
        add = _PendingAdd(entry_id, request, loop.create_future())
        self._pending[entry_id] = add
        add.task = loop.create_task(self._send(add))
        return add.future

    async def _send(self, add: _PendingAdd) -> None:
        deadline = time.monotonic() + self._ledgers.add_timeout
        while True:
            try:
                reply = await self._ledgers.call_master(
                    self._meta.broker_set, "Add", add.request, deadline=deadline,
                    what=f"add of ledger {self.ledger_id} entry {add.entry_id}")
            except LedgerFencedError:
                self._on_fenced(add.entry_id)
                return
            except TidelogError as err:
                # The master completes adds in id order and refuses this one when an earlier one
                # failed there; if that earlier one is still being retried here, wait for it and
                # send this one again (its id stays the same), rather than fail the handle.
                earlier = [a.future for e, a in self._pending.items() if e < add.entry_id and not a.future.done()]
                if earlier and time.monotonic() < deadline:
                    await asyncio.wait(earlier, timeout=deadline - time.monotonic())
                    if add.future.done():
                        return  # an earlier add failed for good, and this one with it
                    if not any(f.done() and not f.cancelled() and f.exception() is not None for f in earlier):
                        continue
                self._on_failed(add.entry_id, err)
                return
            self._on_added(add.entry_id, reply)
            return

    def _on_added(self, entry_id: int, reply: lpb.AddReply) -> None:
        if self._core.closed or entry_id not in self._pending:
            return  # the add was failed already (fence, close, an earlier failure)
        holders = sorted(set(reply.replicas) & set(self._core.replicas))
        if len(holders) < self._meta.ack_quorum:
            self._on_failed(entry_id, NotEnoughBookiesError(
                f"entry {entry_id}: the master reported {sorted(reply.replicas)}, fewer than "
                f"{self._meta.ack_quorum} replicas of the ensemble {list(self._core.replicas)}"))
            return
        confirmed: list[int] = []
        for r in holders:
            confirmed.extend(self._core.on_ack(entry_id, r))
        for e in confirmed:  # in id order (W1)
            add = self._pending.pop(e, None)
            if add is not None and not add.future.done():
                add.future.set_result(e)

    def _fail(self, errors: Mapping[int, BaseException], *, keep: asyncio.Task[None] | None = None) -> None:
        for e in sorted(errors):
            add = self._pending.pop(e, None)
            if add is None:
                continue
            if not add.future.done():
                add.future.set_exception(errors[e])
                add.future.exception()  # retrieved: a caller that dropped the future is not warned
            if add.task is not None and add.task is not keep and add.task is not asyncio.current_task():
                add.task.cancel()

    def _on_fenced(self, entry_id: int) -> None:
        log.info("ledger %d: entry %d refused as fenced; the writer is closed", self.ledger_id, entry_id)
        self._fail(self._core.on_fenced(entry_id))

    def _on_failed(self, entry_id: int, err: TidelogError) -> None:
        if self._core.closed:
            return
        log.warning("ledger %d: add of entry %d failed: %s", self.ledger_id, entry_id, err)
        if self._failure is None:
            self._failure = err
        # the failed add and every later one fail; earlier ones may still be confirmed
        self._fail({e: err for e in self._pending if e >= entry_id})

    async def close(self) -> None:
        """Seal the ledger at its LAC (rule W3): pending adds fail with LedgerClosedError, then the
        metadata is CAS'd OPEN → CLOSED. LedgerFencedError if a recovery is under way,
        MetadataVersionError if someone else closed it elsewhere. A second close waits for the first."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        failed, last, length = self._core.close()
        leftover = {e: LedgerClosedError(f"entry {e}: the handle was closed", entry_id=e)
                    for e in self._pending if e not in failed}
        tasks = [a.task for a in self._pending.values() if a.task is not None]
        self._fail({**failed, **leftover})
        await asyncio.gather(*tasks, return_exceptions=True)
        current = self._meta
        while True:
            new = apply_transition(current, LedgerEvent.WRITER_CLOSE, last_entry_id=last, length=length)
            if new is None:
                break  # CLOSED already at our end (our own earlier close whose answer was lost)
            stored = await self._ledgers.cas_metadata(new, current.version, self._password)
            if stored is not None:
                current = stored
                break
            current = await self._ledgers.read_metadata(self.ledger_id)
        self._meta = current
        await self._ledgers.seal_on_brokers(current, self._password)
        log.info("closed ledger %d at entry %d (length %d)", self.ledger_id, last, length)

    async def __aenter__(self) -> AsyncWriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReadHandle:
    """A read-only handle: reads up to the LAC it knows, refreshes the LAC, tails with a long poll."""

    def __init__(self, ledgers: AsyncLedgers, metadata: LedgerMetadata, password: bytes, lac: int,
                 length: int) -> None:
        self._ledgers = ledgers
        self._meta = metadata
        self._password = password
        self.ledger_id = metadata.ledger_id
        self._lac = lac
        self._length = length
        self._digester = Digester(metadata.digest_type, password)
        self._handle_closed = False

    @property
    def metadata(self) -> LedgerMetadata:
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._length

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is sealed (its metadata says CLOSED), as last seen by this handle."""
        return self._meta.state is LedgerState.CLOSED

    def _raise_lac(self, lac: int, length: int) -> None:
        if self._meta.state is LedgerState.CLOSED:
            return  # the metadata's end is the end
        if lac > self._lac or (lac == self._lac and length > self._length):
            self._lac, self._length = lac, length

    def _adopt(self, meta: LedgerMetadata) -> None:
        self._meta = meta
        if meta.state is LedgerState.CLOSED:
            self._lac, self._length = meta.last_entry_id, meta.length

    async def refresh_metadata(self) -> LedgerMetadata:
        self._adopt(await self._ledgers.read_metadata(self.ledger_id))
        return self._meta

    async def read_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries `first`..`last`, all at or below the LAC this handle knows (LedgerReadError
        otherwise, without asking any replica)."""
        first, last = check_entry_range(first, last)
        if last > self._lac:
            raise LedgerReadError(f"ledger {self.ledger_id}: entry {last} is beyond the last add confirmed "
                                  f"({self._lac}); refresh it with read_last_add_confirmed",
                                  last_add_confirmed=self._lac)
        return await self._read(first, last)

    async def read_unconfirmed_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries `first`..`last` whether or not the LAC covers them. Entries beyond the LAC may
        be cut off by a later recovery (docs/reference/bookkeeper-ledger.md §2.9 hazard 8). Missing ones: NoSuchEntryError."""
        first, last = check_entry_range(first, last)
        if self._meta.state is LedgerState.CLOSED and last > self._meta.last_entry_id:
            raise NoSuchEntryError(f"ledger {self.ledger_id} is closed at entry {self._meta.last_entry_id}",
                                   last_entry_id=self._meta.last_entry_id)
        return await self._read(first, last)

    async def _read(self, first: int, last: int) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        nxt = first
        refresh = refreshed = False
        while nxt <= last:
            view = await self._ledgers.broker_set(self._meta.broker_set, refresh=refresh)
            refresh = False
            try:
                # Slaves first; a silent one is passed over after SPECULATIVE_READ_S.
                _, got = await first_answer(read_order(view, self._meta.ensemble_for(nxt)),
                                            lambda ra, start=nxt: self._read_from(ra[1], start, last),
                                            after_s=SPECULATIVE_READ_S,
                                            give_up=lambda exc: not isinstance(exc, TidelogError))
            except AllFailed as failed:
                errors: dict[int, TidelogError] = {r: e for (r, _), e in failed.errors.items()
                                                   if isinstance(e, TidelogError)}
            else:
                out.extend(got)
                nxt += len(got)
                continue
            if not refreshed and not all(isinstance(e, NoSuchEntryError) for e in errors.values()):
                refresh = refreshed = True  # addresses may have moved; try once more with a fresh view
                continue
            raise self._read_failure(nxt, errors)
        return out

    async def _read_from(self, address: str, first: int, last: int) -> list[LedgerEntry]:
        """Entries from `first` on as one replica returns them, up to the first that is missing
        or fails its digest. Nothing usable raises."""
        reply = await self._ledgers.call(address, "Read", lpb.ReadRequest(
            ledger_id=self.ledger_id, password=self._password, first=first, last=last, fence=False),
            self._ledgers.rpc_timeout)
        got: list[LedgerEntry] = []
        problem: TidelogError | None = None
        for e in reply.entries:
            if e.entry_id != first + len(got) or e.entry_id > last:
                problem = LedgerReadError(f"replica returned entry {e.entry_id} where {first + len(got)} was due")
                break
            if not self._digester.matches(self.ledger_id, e.entry_id, e.lac, e.length, e.data, e.digest):
                problem = DigestMatchError(f"ledger {self.ledger_id} entry {e.entry_id} failed its digest check",
                                           entry_id=int(e.entry_id))
                break
            got.append(_entry(e))
        # the replica's LAC moves ours up when we also know the length there (a returned entry)
        for entry in got:
            if entry.entry_id == reply.lac:
                self._raise_lac(entry.entry_id, entry.length)
        if not got:
            raise problem or LedgerReadError(f"replica returned no entry from {first}")
        return got

    def _read_failure(self, entry_id: int, errors: Mapping[int, TidelogError]) -> TidelogError:
        for err in errors.values():
            if isinstance(err, UnauthorizedAccessError):
                return err
        if errors and all(isinstance(e, NoSuchEntryError) for e in errors.values()):
            return NoSuchEntryError(f"no replica of ledger {self.ledger_id} has entry {entry_id}", entry_id=entry_id)
        # as in BookKeeper, a real answer outweighs an unreachable replica
        real = [e for e in errors.values() if not isinstance(e, UnavailableError)] or list(errors.values())
        if real and all(type(e) is type(real[0]) for e in real):
            return real[0]
        detail = {r: str(e) for r, e in sorted(errors.items())} or "no replica is known"
        return LedgerReadError(f"ledger {self.ledger_id} entry {entry_id}: no replica could serve it: {detail}",
                               entry_id=entry_id)

    async def read_last_add_confirmed(self) -> int:
        """Ask the replicas for the LAC (the master's answer is exact); the handle's LAC only moves up."""
        if self._meta.state is LedgerState.CLOSED:
            return self._lac
        lac, length, fenced = await self._ledgers.query_lac(self._meta, self._password)
        self._raise_lac(lac, length)
        if fenced:
            await self.refresh_metadata()  # a recovery may have sealed it: adopt its end
        return self._lac

    async def wait_for_lac(self, previous: int, timeout: float) -> int:
        """Wait up to `timeout` seconds until the LAC is above `previous`; return the LAC then
        (still ≤ previous if nothing arrived). A CLOSED ledger answers its last entry at once."""
        if not _is_int(previous) or previous < -1:
            raise IncorrectParameterError(f"previous is an entry id or -1, got {previous!r}")
        if not isinstance(timeout, int | float) or timeout < 0:
            raise IncorrectParameterError(f"timeout is a non-negative number of seconds, got {timeout!r}")
        if self._lac > previous or self._meta.state is LedgerState.CLOSED:
            return self._lac
        lac, length, fenced = await self._ledgers.query_lac(self._meta, self._password, previous=previous,
                                                            wait_ms=int(timeout * 1000))
        self._raise_lac(lac, length)
        if fenced and self._lac <= previous:
            await self.refresh_metadata()
        return self._lac

    async def close(self) -> None:
        """Nothing to release: a read handle holds no resources of its own."""
        self._handle_closed = True

    async def __aenter__(self) -> AsyncReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- the recovery shell ---------------------------------------------------------------------


_Feed = Callable[[], list[Action]]


class _RecoveryRun:
    """Carries out `Recovery`'s actions and feeds their outcomes back, until DONE or ABORTED.

    Every action runs as its own task; each task ends by queueing exactly one feed (a function
    that hands the outcome to the core and returns the next actions), so the core is only ever
    touched from this loop, one answer at a time.
    """

    def __init__(self, ledgers: AsyncLedgers, metadata: LedgerMetadata, password: bytes) -> None:
        self.ledgers = ledgers
        self.password = password
        self.ledger_id = metadata.ledger_id
        self.core = Recovery(metadata)
        self.digester = Digester(metadata.digest_type, password)
        self.feeds: asyncio.Queue[_Feed] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.found: dict[int, lpb.Entry] = {}  # the first copy read of each recovered entry
        self.view: BrokerSetView | None = None
        self.timeout = ledgers.rpc_timeout

    async def run(self) -> LedgerMetadata:
        try:
            self._launch(self.core.start())
            while self.core.state not in (RecoveryState.DONE, RecoveryState.ABORTED):
                if self.feeds.empty() and not self.tasks:
                    raise LedgerRecoveryError(f"recovery of ledger {self.ledger_id} stalled in {self.core.state}")
                feed = await self.feeds.get()
                self._launch(feed())
        except (UnauthorizedAccessError, NoSuchLedgerExistsError, LedgerRecoveryError):
            raise
        except TidelogError as err:
            # R9: every other failure of a recovery open is retryable LedgerRecoveryError
            raise LedgerRecoveryError(f"recovery of ledger {self.ledger_id} failed: {err}", cause=err.code) from err
        finally:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.core.state is RecoveryState.ABORTED:
            assert self.core.error is not None
            raise self.core.error
        assert self.core.result is not None
        log.info("recovered ledger %d: closed at entry %d (length %d)", self.ledger_id,
                 self.core.result.last_entry_id, self.core.result.length)
        return self.core.result.metadata

    def _launch(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, MarkInRecovery):
                self._spawn(self._mark(self.core.metadata, action))
            elif isinstance(action, CloseLedger):
                self._spawn(self._close(self.core.metadata, action))
            elif isinstance(action, SendFence):
                for r in action.replicas:
                    self._spawn(self._fence(r))
            elif isinstance(action, ReadEntry):
                for r in action.replicas:
                    self._spawn(self._read(action.entry_id, r))
            elif isinstance(action, RewriteEntry):
                self._spawn(self._rewrite(action))
            else:  # pragma: no cover - the core hands out only the actions above
                raise LedgerRecoveryError(f"unknown recovery action {action!r}")

    def _spawn(self, coro: Coroutine[Any, Any, _Feed]) -> None:
        async def run() -> None:
            try:
                feed = await coro
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # surfaces in `run`, never lost in a task
                error = exc

                def feed() -> list[Action]:
                    raise error
            self.feeds.put_nowait(feed)

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _view(self) -> BrokerSetView:
        if self.view is None:
            self.view = await self.ledgers.broker_set(self.core.metadata.broker_set, refresh=True)
        return self.view

    async def _cas(self, new: LedgerMetadata, expected: int) -> LedgerMetadata:
        stored = await self.ledgers.cas_metadata(new, expected, self.password)
        return stored if stored is not None else await self.ledgers.read_metadata(self.ledger_id)

    async def _mark(self, meta: LedgerMetadata, action: MarkInRecovery) -> _Feed:
        new = apply_transition(meta, LedgerEvent.RECOVERY_OPEN)
        after = meta if new is None else await self._cas(new, action.expected_version)
        return lambda: self.core.on_metadata(after)

    async def _close(self, meta: LedgerMetadata, action: CloseLedger) -> _Feed:
        new = apply_transition(meta, LedgerEvent.RECOVERY_CLOSE, last_entry_id=action.last_entry_id,
                               length=action.length)
        after = meta if new is None else await self._cas(new, action.expected_version)
        return lambda: self.core.on_metadata(after)

    async def _fence(self, replica: int) -> _Feed:
        address = (await self._view()).address_of(replica)
        if address is None:
            # the broker id left the set (e.g. its data was wiped and it came back under a new id)
            return lambda: self.core.on_fence_response(replica, FenceOutcome.ERROR)
        try:
            reply = await self.ledgers.call(address, "Fence", lpb.FenceRequest(
                ledger_id=self.ledger_id, password=self.password), self.timeout)
        except TidelogError as exc:
            outcome = fence_outcome(exc)
            log.info("ledger %d: fence of replica %d: %s (%s)", self.ledger_id, replica, outcome, exc)
            return lambda: self.core.on_fence_response(replica, outcome)
        lac, length = int(reply.lac), int(reply.length)
        return lambda: self.core.on_fence_response(replica, FenceOutcome.FENCED, lac, length)

    async def _read(self, entry_id: int, replica: int) -> _Feed:
        address = (await self._view()).address_of(replica)
        if address is None:
            return lambda: self.core.on_read_response(entry_id, replica, ReadOutcome.ERROR)
        try:
            reply = await self.ledgers.call(address, "Read", lpb.ReadRequest(
                ledger_id=self.ledger_id, password=self.password, first=entry_id, last=entry_id, fence=True),
                self.timeout)
        except TidelogError as exc:
            outcome = read_outcome(exc)
            return lambda: self.core.on_read_response(entry_id, replica, outcome)
        entry = next((e for e in reply.entries if e.entry_id == entry_id), None)
        if entry is None or not self.digester.matches(self.ledger_id, entry.entry_id, entry.lac, entry.length,
                                                      entry.data, entry.digest):
            # an empty answer or a corrupt copy is an unknown, never "no such entry"
            why = "no entry" if entry is None else "a failed digest"
            log.warning("ledger %d: recovery read of entry %d from replica %d returned %s",
                        self.ledger_id, entry_id, replica, why)
            return lambda: self.core.on_read_response(entry_id, replica, ReadOutcome.ERROR)
        found = entry

        def feed() -> list[Action]:
            self.found.setdefault(entry_id, found)
            return self.core.on_read_response(entry_id, replica, ReadOutcome.PRESENT, bytes(found.data),
                                              int(found.length))
        return feed

    async def _rewrite(self, action: RewriteEntry) -> _Feed:
        entry = self.found[action.entry_id]
        request = lpb.AddRequest(ledger_id=self.ledger_id, entry_id=entry.entry_id, password=self.password,
                                 lac=entry.lac, length=entry.length, digest=entry.digest, data=entry.data,
                                 recovery=True)
        try:
            reply = await self.ledgers.call_master(
                self.core.metadata.broker_set, "Add", request, deadline=time.monotonic() + self.timeout,
                what=f"recovery rewrite of ledger {self.ledger_id} entry {entry.entry_id}")
            holders = set(reply.replicas)
        except UnauthorizedAccessError:
            raise
        except TidelogError as exc:
            log.warning("ledger %d: rewrite of entry %d failed: %s", self.ledger_id, entry.entry_id, exc)
            holders = set()

        def feed() -> list[Action]:
            actions: list[Action] = []
            for r in action.replicas:
                actions.extend(self.core.on_rewrite_response(action.entry_id, r, ok=r in holders))
            return actions
        return feed


# --- the synchronous faces ------------------------------------------------------------------


class WriteHandle(SyncFacade):
    """`AsyncWriteHandle` for synchronous callers; `add_entry_async` returns a
    `concurrent.futures.Future` of the entry id."""

    _target: AsyncWriteHandle

    def add_entry_async(self, data: bytes) -> concurrent.futures.Future[int]:
        async def start() -> concurrent.futures.Future[int]:
            inner = self._target.add_entry_async(data)
            outer: concurrent.futures.Future[int] = concurrent.futures.Future()
            outer.set_running_or_notify_cancel()

            def copy(f: asyncio.Future[int]) -> None:
                if f.cancelled():
                    outer.cancel()
                elif f.exception() is not None:
                    outer.set_exception(f.exception())
                else:
                    outer.set_result(f.result())
            inner.add_done_callback(copy)
            return outer
        return self._runner.run(start())

    def __enter__(self) -> WriteHandle:
        return self


class ReadHandle(SyncFacade):
    """`AsyncReadHandle` for synchronous callers."""

    _target: AsyncReadHandle

    def __enter__(self) -> ReadHandle:
        return self


class Ledgers(SyncFacade):
    """`AsyncLedgers` for synchronous callers: the handles it returns are sync too."""

    _target: AsyncLedgers

    def create_ledger(self, *args: Any, **kwargs: Any) -> WriteHandle:
        return WriteHandle(self._runner, self._runner.run(self._target.create_ledger(*args, **kwargs)))

    def open_ledger(self, *args: Any, **kwargs: Any) -> ReadHandle:
        return ReadHandle(self._runner, self._runner.run(self._target.open_ledger(*args, **kwargs)))
