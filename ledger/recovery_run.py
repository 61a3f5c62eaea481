"""The recovery shell: carries out the actions of the `Recovery` core (ledger/recovery.py) and
feeds their outcomes back, until the core is DONE or ABORTED.

A recovery open first fences the ledger on every replica and reads their LAC, then reads each
entry after it from the replicas, rewrites what it found through the master, and closes the
ledger's metadata where the acknowledged entries end (rules R1–R9 in RULES.md). Every action the
core hands back runs concurrently; `fence_outcome` / `read_outcome` turn a failed call into what
the core understands.

Latency: the replicas' addresses are looked up once, while the IN_RECOVERY compare-and-set is in
flight, and the entries just after the LAC are read `RECOVERY_READ_AHEAD` (ledger/recovery.py)
at a time, so the common end of a dead writer (its last entry acknowledged but not yet covered
by a LAC it sent) costs one round of reads, not two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from tidelog.errors import (
    LedgerRecoveryError,
    LedgerTimeoutError,
    NoSuchEntryError,
    NoSuchLedgerExistsError,
    PermissionDeniedError,
    TidelogError,
    UnauthenticatedError,
    UnauthorizedAccessError,
    UnavailableError,
)
from tidelog.invariants import InvariantViolation
from tidelog.ledger.calls import LedgerCalls
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import LedgerEvent, LedgerMetadata, LedgerState, apply_transition
from tidelog.ledger.placement import BrokerSetView
from tidelog.ledger.recovery import (
    RECOVERY_READ_AHEAD,
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
)
from tidelog.proto import ledger_pb2 as lpb

log = logging.getLogger(__name__)

__all__ = ["RecoveryRun", "fence_outcome", "read_outcome"]


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


_Feed = Callable[[], list[Action]]


class RecoveryRun:
    """Carries out `Recovery`'s actions and feeds their outcomes back, until DONE or ABORTED.

    Every action runs as its own task; each task ends by queueing exactly one feed (a function
    that hands the outcome to the core and returns the next actions), so the core is only ever
    touched from this loop, one answer at a time.
    """

    def __init__(self, ledgers: LedgerCalls, metadata: LedgerMetadata, password: bytes) -> None:
        self.ledgers = ledgers
        self.password = password
        self.ledger_id = metadata.ledger_id
        self.core = Recovery(metadata, read_ahead=RECOVERY_READ_AHEAD)
        self.digester = Digester(metadata.digest_type, password)
        self.feeds: asyncio.Queue[_Feed] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.found: dict[int, lpb.Entry] = {}  # the first copy read of each recovered entry
        self.view: asyncio.Future[BrokerSetView] | None = None
        self.timeout = ledgers.rpc_timeout

    async def run(self) -> LedgerMetadata:
        try:
            if self.core.metadata.state is not LedgerState.CLOSED:
                # the addresses, while the IN_RECOVERY CAS is in flight (a CLOSED ledger needs none)
                self._view_future()
            self._launch(self.core.start())
            while self.core.state not in (RecoveryState.DONE, RecoveryState.ABORTED):
                if self.feeds.empty() and not self.tasks:
                    raise LedgerRecoveryError(
                        f"recovery of ledger {self.ledger_id} stalled in {self.core.state}"
                    )
                feed = await self.feeds.get()
                self._launch(feed())
        # answers, not failures: a retry would get the same (a missing permission, unknown signer)
        except (
            UnauthorizedAccessError,
            NoSuchLedgerExistsError,
            LedgerRecoveryError,
            PermissionDeniedError,
            UnauthenticatedError,
        ):
            raise
        except TidelogError as err:
            # R9: every other failure of a recovery open is retryable LedgerRecoveryError
            raise LedgerRecoveryError(
                f"recovery of ledger {self.ledger_id} failed: {err}", cause=err.code
            ) from err
        finally:
            pending = [*self.tasks, *([self.view] if self.view is not None else [])]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self.core.state is RecoveryState.ABORTED:
            raise self.core.error or InvariantViolation("an aborted recovery names its error")
        if self.core.result is None:
            raise InvariantViolation("a finished recovery has a result")
        log.info(
            "recovered ledger %d: closed at entry %d (length %d)",
            self.ledger_id,
            self.core.result.last_entry_id,
            self.core.result.length,
        )
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

    def _view_future(self) -> asyncio.Future[BrokerSetView]:
        # one lookup shared by every fence and read (they start together and would each ask)
        if self.view is None:
            self.view = asyncio.ensure_future(
                self.ledgers.broker_set(self.core.metadata.broker_set, refresh=True)
            )
        return self.view

    async def _view(self) -> BrokerSetView:
        # shielded: one caller's cancellation must not cancel the lookup the others wait on
        return await asyncio.shield(self._view_future())

    async def _cas(self, new: LedgerMetadata, expected: int) -> LedgerMetadata:
        stored = await self.ledgers.cas_metadata(new, expected, self.password)
        return stored if stored is not None else await self.ledgers.read_metadata(self.ledger_id)

    async def _mark(self, meta: LedgerMetadata, action: MarkInRecovery) -> _Feed:
        new = apply_transition(meta, LedgerEvent.RECOVERY_OPEN)
        after = meta if new is None else await self._cas(new, action.expected_version)
        return lambda: self.core.on_metadata(after)

    async def _close(self, meta: LedgerMetadata, action: CloseLedger) -> _Feed:
        new = apply_transition(
            meta, LedgerEvent.RECOVERY_CLOSE, last_entry_id=action.last_entry_id, length=action.length
        )
        after = meta if new is None else await self._cas(new, action.expected_version)
        return lambda: self.core.on_metadata(after)

    async def _fence(self, replica: int) -> _Feed:
        address = (await self._view()).address_of(replica)
        if address is None:
            # the broker id left the set (e.g. its data was wiped and it came back under a new id)
            return lambda: self.core.on_fence_response(replica, FenceOutcome.ERROR)
        try:
            reply = await self.ledgers.call(
                address,
                "Fence",
                lpb.FenceRequest(ledger_id=self.ledger_id, password=self.password),
                self.timeout,
            )
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
            reply = await self.ledgers.call(
                address,
                "Read",
                lpb.ReadRequest(
                    ledger_id=self.ledger_id,
                    password=self.password,
                    first=entry_id,
                    last=entry_id,
                    fence=True,
                ),
                self.timeout,
            )
        except TidelogError as exc:
            outcome = read_outcome(exc)
            return lambda: self.core.on_read_response(entry_id, replica, outcome)
        entry = next((e for e in reply.entries if e.entry_id == entry_id), None)
        if entry is None or not self.digester.matches(
            self.ledger_id, entry.entry_id, entry.lac, entry.length, entry.data, entry.digest
        ):
            # an empty answer or a corrupt copy is an unknown, never "no such entry"
            why = "no entry" if entry is None else "a failed digest"
            log.warning(
                "ledger %d: recovery read of entry %d from replica %d returned %s",
                self.ledger_id,
                entry_id,
                replica,
                why,
            )
            return lambda: self.core.on_read_response(entry_id, replica, ReadOutcome.ERROR)
        found = entry

        def feed() -> list[Action]:
            self.found.setdefault(entry_id, found)
            return self.core.on_read_response(
                entry_id, replica, ReadOutcome.PRESENT, bytes(found.data), int(found.length)
            )

        return feed

    async def _rewrite(self, action: RewriteEntry) -> _Feed:
        entry = self.found[action.entry_id]
        request = lpb.AddRequest(
            ledger_id=self.ledger_id,
            entry_id=entry.entry_id,
            password=self.password,
            lac=entry.lac,
            length=entry.length,
            digest=entry.digest,
            data=entry.data,
            recovery=True,
        )
        try:
            reply = await self.ledgers.call_master(
                self.core.metadata.broker_set,
                self.ledgers.rpc("Add", request),
                deadline=time.monotonic() + self.timeout,
                what=f"recovery rewrite of ledger {self.ledger_id} entry {entry.entry_id}",
            )
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
