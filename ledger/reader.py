"""`AsyncReadHandle`: reads a ledger up to the LAC it knows, refreshes the LAC, tails with a long poll.

Entries come from any replica (slaves first, then the master), each entry's digest verified; a
replica that fails or returns a corrupt entry is skipped for the next. The LAC comes from the
replicas' `Lac` answers (ledger/lac.py); the master's answer is exact, so tidelog readers do not
lag one entry behind as BookKeeper's do.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidelog.client.hedge import SPECULATIVE_READ_S, AllFailed, first_answer
from tidelog.errors import (
    DigestMatchError,
    IncorrectParameterError,
    LedgerReadError,
    NoSuchEntryError,
    TidelogError,
    UnauthorizedAccessError,
    UnavailableError,
)
from tidelog.ledger.calls import LedgerCalls
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import LedgerMetadata, LedgerState, is_int
from tidelog.ledger.params import LedgerEntry, check_entry_range, entry_of
from tidelog.ledger.placement import read_order
from tidelog.proto import ledger_pb2 as lpb

__all__ = ["AsyncReadHandle"]


class AsyncReadHandle:
    """A read-only handle: reads up to the LAC it knows, refreshes the LAC, tails with a long poll."""

    def __init__(
        self, ledgers: LedgerCalls, metadata: LedgerMetadata, password: bytes, lac: int, length: int
    ) -> None:
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
            raise LedgerReadError(
                f"ledger {self.ledger_id}: entry {last} is beyond the last add confirmed "
                f"({self._lac}); refresh it with read_last_add_confirmed",
                last_add_confirmed=self._lac,
            )
        return await self._read(first, last)

    async def read_unconfirmed_entries(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries `first`..`last` whether or not the LAC covers them. Entries beyond the LAC may
        be cut off by a later recovery (docs/reference/bookkeeper-ledger.md §2.9 hazard 8). Missing ones: NoSuchEntryError."""
        first, last = check_entry_range(first, last)
        if self._meta.state is LedgerState.CLOSED and last > self._meta.last_entry_id:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id} is closed at entry {self._meta.last_entry_id}",
                last_entry_id=self._meta.last_entry_id,
            )
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
                _, got = await first_answer(
                    read_order(view, self._meta.ensemble_for(nxt)),
                    lambda ra, start=nxt: self._read_from(ra[1], start, last),
                    after_s=SPECULATIVE_READ_S,
                    give_up=lambda exc: not isinstance(exc, TidelogError),
                )
            except AllFailed as failed:
                errors: dict[int, TidelogError] = {
                    r: e for (r, _), e in failed.errors.items() if isinstance(e, TidelogError)
                }
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
        reply = await self._ledgers.call(
            address,
            "Read",
            lpb.ReadRequest(
                ledger_id=self.ledger_id, password=self._password, first=first, last=last, fence=False
            ),
            self._ledgers.rpc_timeout,
        )
        got: list[LedgerEntry] = []
        problem: TidelogError | None = None
        for e in reply.entries:
            if e.entry_id != first + len(got) or e.entry_id > last:
                problem = LedgerReadError(
                    f"replica returned entry {e.entry_id} where {first + len(got)} was due"
                )
                break
            if not self._digester.matches(self.ledger_id, e.entry_id, e.lac, e.length, e.data, e.digest):
                problem = DigestMatchError(
                    f"ledger {self.ledger_id} entry {e.entry_id} failed its digest check",
                    entry_id=int(e.entry_id),
                )
                break
            got.append(entry_of(e))
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
            return NoSuchEntryError(
                f"no replica of ledger {self.ledger_id} has entry {entry_id}", entry_id=entry_id
            )
        # as in BookKeeper, a real answer outweighs an unreachable replica
        real = [e for e in errors.values() if not isinstance(e, UnavailableError)] or list(errors.values())
        if real and all(type(e) is type(real[0]) for e in real):
            return real[0]
        detail = {r: str(e) for r, e in sorted(errors.items())} or "no replica is known"
        return LedgerReadError(
            f"ledger {self.ledger_id} entry {entry_id}: no replica could serve it: {detail}",
            entry_id=entry_id,
        )

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
        if not is_int(previous) or previous < -1:
            raise IncorrectParameterError(f"previous is an entry id or -1, got {previous!r}")
        if not isinstance(timeout, int | float) or timeout < 0:
            raise IncorrectParameterError(f"timeout is a non-negative number of seconds, got {timeout!r}")
        if self._lac > previous or self._meta.state is LedgerState.CLOSED:
            return self._lac
        lac, length, fenced = await self._ledgers.query_lac(
            self._meta, self._password, previous=previous, wait_ms=int(timeout * 1000)
        )
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
