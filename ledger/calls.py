"""The ledger client's I/O plumbing: calls to the brokers' `Ledger` service and to the ledger
metadata in the controller's store. It carries out what it is asked and decides nothing.

- `call` is one gRPC call on one broker, its gRPC error turned into tidelog's typed error;
  `add_batch` is a batch of adds on one broker, through its data port when it has one (with
  other ledgers' batches for that broker, ledger/coalesce.py).
- `call_master` finds the broker set's master (a cached `BrokerSetView`, refreshed on a "not
  here / not now" answer) and retries there until a deadline; a call to a master the controller
  has since replaced is abandoned (`until_superseded`, client/hedge.py).
- `read_metadata` / `cas_metadata` read and compare-and-set `ledger/{id:019d}`; the controller
  takes a CAS only with the ledger's password (RULES.md M8).
- `query_lac` asks every replica for the LAC (ledger/lac.py).

`AsyncLedgers` (ledger/ledgers.py) is this plus the API's operations; the handles and the
recovery shell use only what is here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from tidelog import dataport_frames as df
from tidelog.client.hedge import until_superseded
from tidelog.errors import (
    FlushSlaveTimeoutError,
    LedgerReadError,
    LedgerTimeoutError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    NoSuchLedgerExistsError,
    NotEnoughBookiesError,
    NotMasterError,
    TidelogError,
    UnavailableError,
)
from tidelog.ledger.coalesce import AddCoalescer
from tidelog.ledger.lac import LacTally, ask_replicas
from tidelog.ledger.metadata import LedgerMetadata
from tidelog.ledger.params import DEFAULT_ADD_TIMEOUT, MAX_ENTRY_BYTES, ledger_key
from tidelog.ledger.placement import BrokerSetView, broker_set_views, read_order
from tidelog.proto import ledger_pb2 as lpb
from tidelog.wire import error_from_rpc

if TYPE_CHECKING:
    from tidelog.client.transport import Transport

log = logging.getLogger(__name__)

__all__ = ["LedgerCalls", "MasterCall"]

T = TypeVar("T")
# What `call_master` makes of the master it found: a call given its address and a timeout.
MasterCall = Callable[[str, float], Awaitable[T]]

# Master answers that say "not here / not now": the same request is sent again after a refresh.
_RETRY_MASTER = (NotMasterError, UnavailableError, FlushSlaveTimeoutError, NotEnoughBookiesError)


class LedgerCalls:
    """The ledger I/O of one client transport (its controller client and broker channels)."""

    def __init__(
        self,
        client: Transport,
        *,
        add_timeout: float = DEFAULT_ADD_TIMEOUT,
        rpc_timeout: float | None = None,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
    ) -> None:
        self.client = client
        self.controller = client.controller
        self.add_timeout = add_timeout
        self.rpc_timeout = rpc_timeout or client.rpc_timeout
        self.max_entry_bytes = max_entry_bytes
        self._sets: dict[str, tuple[float, BrokerSetView]] = {}
        self.set_ttl = 5.0
        # add batches of several ledgers bound for one broker leave in one frame
        self.adds = AddCoalescer(client.over_data_port)

    async def broker_set(self, name: str, *, refresh: bool = False) -> BrokerSetView:
        cached = self._sets.get(name)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self.set_ttl:
            return cached[1]
        views = broker_set_views(await self.controller.describe_broker_sets([name]))
        for v in views:
            self.remember_set(v)
        found = self._sets.get(name)
        if found is None or found[1].name != name:
            raise UnavailableError(f"broker set {name} is not registered with the controller")
        return found[1]

    def remember_set(self, view: BrokerSetView) -> None:
        """Cache a view just read from the controller (as `broker_set` does). Its members answer
        the set's lookups too while no controller does: adds to an open ledger need no controller."""
        self._sets[view.name] = (time.monotonic(), view)
        self.controller.learn_brokers(m.address for m in view.members)

    async def _master_epoch(self, broker_set: str) -> int | None:
        return (await self.broker_set(broker_set, refresh=True)).master_epoch

    async def call(self, address: str, method: str, request: Any, timeout: float) -> Any:
        """One gRPC call of the Ledger service on one broker; errors come back typed."""
        try:
            return await getattr(self.client.ledger_stub(address), method)(
                request, timeout=max(0.05, timeout)
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    def rpc(self, method: str, request: Any) -> MasterCall[Any]:
        """`call_master`'s call for one gRPC method and request."""
        return lambda address, timeout: self.call(address, method, request, timeout)

    async def add_batch(
        self,
        address: str,
        ledger_id: int,
        password: bytes,
        entries: Sequence[df.LedgerEntry],
        timeout: float,
    ) -> df.LedgerAdded:
        """One batch of adds to the broker at `address`: a LEDGER_ADD frame on its data port when
        it has one (the entries as they are, without gRPC's few hundred microseconds of Python a
        call on each side), sharing a LEDGER_ADDS frame with other ledgers' batches made for that
        broker in the same turn of the event loop (ledger/coalesce.py); else the gRPC `AddBatch`
        it stands for."""
        parts = df.ledger_add_request(ledger_id, password, entries)
        body = await self.adds.send(address, parts, timeout)
        if body is not None:
            return df.parse_ledger_added(body)
        request = lpb.AddBatchRequest(
            ledger_id=ledger_id, password=password, entries=[lpb.Entry(**e._asdict()) for e in entries]
        )
        reply = await self.call(address, "AddBatch", request, timeout)
        return df.LedgerAdded(
            reply.first_entry_id, reply.last_entry_id, reply.broker_id, tuple(reply.replicas)
        )

    async def call_master(self, broker_set: str, call: MasterCall[T], *, deadline: float, what: str) -> T:
        """`call(master address, timeout)` on the set's master, retried after a refresh on a "not
        here / not now" answer until `deadline`; then LedgerTimeoutError naming the last answer
        (the outcome is unknown)."""
        refresh = False
        backoff = 0.02
        last: TidelogError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LedgerTimeoutError(
                    f"{what}: no confirmation within the timeout; last answer: {last}", cause=str(last)
                )
            try:
                view = await self.broker_set(broker_set, refresh=refresh)
                refresh = False
                if not view.master_address:
                    raise UnavailableError(f"broker set {broker_set} has no master right now")
                timeout = max(0.05, min(self.rpc_timeout, deadline - time.monotonic()))
                return await until_superseded(
                    call(view.master_address, timeout),
                    broker_set,
                    view.master_address,
                    view.master_epoch,
                    lambda: self._master_epoch(broker_set),
                )
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

    async def cas_metadata(
        self, new: LedgerMetadata, expected_version: int, password: bytes
    ) -> LedgerMetadata | None:
        """Write `new` if the stored version is still `expected_version`: the stored metadata, or
        None when another write came first (re-read and decide again). The controller takes the
        write only with the ledger's `password` (RULES.md M8)."""
        try:
            entry = await self.controller.meta_cas(
                ledger_key(new.ledger_id), new.encode(), expected_version, ledger_password=password
            )
        except MetadataVersionMismatchError:
            return None
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(
                f"ledger {new.ledger_id} was deleted", ledger_id=new.ledger_id
            ) from None
        return LedgerMetadata.decode(entry.value, version=entry.version)

    async def seal_on_brokers(self, meta: LedgerMetadata, password: bytes) -> None:
        """Ask the set's master to seal a CLOSED ledger (`Ledger.Close`), so that every replica
        refuses later adds with LedgerClosedError. The master checks the controller's metadata
        itself. Best effort: the metadata is the ledger's end whatever happens here, and readers
        never read past it; a failure is logged, not raised."""
        try:
            await self.call_master(
                meta.broker_set,
                self.rpc("Close", lpb.CloseRequest(ledger_id=meta.ledger_id, password=password)),
                deadline=time.monotonic() + self.rpc_timeout,
                what=f"seal of ledger {meta.ledger_id}",
            )
        except TidelogError as exc:
            log.warning(
                "ledger %d is closed, but its broker set could not seal it (readers still stop at the "
                "metadata's end): %s",
                meta.ledger_id,
                exc,
            )

    async def query_lac(
        self, meta: LedgerMetadata, password: bytes, *, previous: int = -1, wait_ms: int = 0
    ) -> tuple[int, int, bool]:
        """(LAC, length through it, whether a replica has the ledger fenced), asked of every
        replica at once. The master's answer is exact and ends the wait; otherwise the largest
        answer wins once all are in (or, long polling, the first above `previous`)."""
        view = await self.broker_set(meta.broker_set)
        targets = read_order(view, meta.replicas)
        if not targets:
            raise LedgerReadError(
                f"no replica of ledger {meta.ledger_id} is known to broker set {meta.broker_set}"
            )
        req = lpb.LacRequest(ledger_id=meta.ledger_id, password=password, previous=previous, wait_ms=wait_ms)
        timeout = self.rpc_timeout + wait_ms / 1000
        tally = LacTally(previous, wait_ms)
        await ask_replicas(lambda address: self.call(address, "Lac", req, timeout), targets, tally)
        return tally.result(meta.ledger_id)
