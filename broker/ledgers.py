"""The broker side of ledgers: create and add on the master; fence, read and LAC on every replica.

Theory of operation
-------------------
The index and the fences are `tidelog.ledger.store.LedgerIndex` (what this replica's log holds,
what it has fenced); this module adds the ledger rules of the master's write path, which is the
replica's one write path (`Replica.require_writable` / `append` / `persist`). The gRPC service
is `broker.ledger_service`; nothing here sees a protobuf.

**Adds (master only).** An add is appended as an ADD record and acknowledged once it is fsync'd
here and held by every member of the controller-confirmed SyncStateSet, and by at least AQ
replicas: every member, so that any broker the controller may elect next holds it (an
acknowledged entry survives failover); AQ, the ledger's own promise. Fewer members than AQ
fails fast with NotEnoughBookies before anything is written. Entry ids are sequenced per
ledger: the next id is appended; an id this replica already holds with the same digest waits
for that record (a retry after an unknown outcome); an id beyond the next waits briefly for the
gap to fill (pipelined calls can arrive out of order). Adds of one ledger complete in id order,
so the master's acknowledged LAC only ever covers a prefix.

**Batches (`add_batch`).** A writer's pipelined adds come as batches of consecutive entries. The
whole batch is checked first (shape, contiguous ids, sizes, password, fencing, closing, every
digest under one key derivation); then its leading entries this replica already holds with the
same digest (a retried batch) are skipped, the rest must continue the ledger (or wait briefly for
the gap, as above) and go to the log in ONE append, and the batch waits once for the fsync and
the replicas: the per-entry cost is building and indexing its record, nothing more. The batch is
one link of the ledger's order chain and is acknowledged, or fails, as a whole.

**What an add must prove.** Before anything is appended the master checks, besides the password,
that the ledger still takes writes and that the digest is the entry's:

- a fenced ledger refuses the writer's adds (LedgerFencedError); a ledger this replica holds a
  CLOSE record of refuses them too (LedgerClosedError), and a recovery add beyond its end;
- the digest must verify (DigestMatchError) under the ledger's digest type from its CREATE
  record, over (ledger id, entry id, LAC, length, data) exactly as the writer computes it
  (`tidelog.ledger.digest`). For MAC the HMAC key is derived from the password, and every add
  carries the password (checked against the CREATE record's hash just before), so the master
  derives the key per request and stores nothing more than before: no key material at rest
  beside the password hash. So a client that knows the password but sends a corrupt or forged
  entry, or a CRC computed over other fields, cannot get it stored and replicated.

**Sealing (`close`).** The writer, after its CAS OPEN → CLOSED in the controller, asks the
master to seal the ledger. The master reads the metadata from the controller itself and, only
if it is CLOSED, appends a CLOSE record at the metadata's end (see `ledger.store`); the record
replicates like every other, so a new master after a failover refuses the same adds.

**Fencing (every replica).** A fence, or a recovery read, first fences the ledger in the index
(durably), then answers with the LAC this replica can vouch for. On the master, a fence fails
every pending add of the ledger with LedgerFenced and refuses later ones. A slave also tells
its master (HA `LedgerFenced` frame, before any later ack), and the master fences the ledger
itself on receipt: the slave's later acks may cover records that are not entries on the slave,
so the master must not count them. A recovery add (RADD) is accepted on a fenced ledger.

**LAC.** The master knows the exact LAC (the last add it acknowledged); a slave knows the
largest LAC carried by the entries it holds. Either way a replica only answers a LAC whose
entry it holds, so the length it reports with it is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidelog.dataport_frames import LedgerAddCall
from tidelog.dataport_frames import (
    LedgerEntry as Entry,  # what a Read answers and an AddBatch carries per entry
)
from tidelog.errors import (
    CorruptRecordError,
    DigestMatchError,
    IllegalOpError,
    IncorrectParameterError,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReadError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    OffsetBelowRetentionError,
    UnauthorizedAccessError,
    UnavailableError,
)
from tidelog.ha.ackpolicy import EVERY_MEMBER
from tidelog.ledger.digest import Digester
from tidelog.ledger.metadata import LedgerMetadata, LedgerState, hash_password
from tidelog.ledger.store import (
    KIND_ADD,
    KIND_RECOVERY_ADD,
    IndexedEntry,
    LedgerIndex,
    LedgerView,
    add_message,
    close_message,
    create_message,
)
from tidelog.tasks import within

if TYPE_CHECKING:
    from tidelog.broker.ports import LedgerHost
    from tidelog.ha.master import HaMaster

log = logging.getLogger(__name__)

GAP_WAIT_S = 5.0  # how long an add beyond the next id waits for the ids before it
MAX_READ_ENTRIES = 10_000
DEFAULT_READ_BYTES = 4 << 20
MAX_DIGEST_BYTES = 64
MAX_BATCH_ENTRIES = 10_000  # per AddBatch; the writer sends at most 1,000 (ledger/writer.py)
MAX_BATCH_BYTES = 32 << 20  # entry data per AddBatch, well inside the 64 MiB gRPC message limit


@dataclass(frozen=True)
class AddRequest:
    """One add, as the service hands it over (the wire type stays at the gRPC edge)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    digest: bytes
    data: bytes
    password: bytes
    recovery: bool = False

    @property
    def entry(self) -> Entry:
        return Entry(self.entry_id, self.lac, self.length, self.digest, self.data)


@dataclass
class _Pending:
    """One appended add, so the next one can complete only after it."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    ok: bool = False


@dataclass
class _MasterLedger:
    """The master's in-memory state of one ledger (rebuilt lazily after a promotion)."""

    acked_lac: int = -1
    fenced: asyncio.Event = field(default_factory=asyncio.Event)
    appended: asyncio.Event = field(default_factory=asyncio.Event)
    tail: _Pending | None = None

    def chain(self) -> tuple[_Pending | None, _Pending]:
        """An add just appended joins the ledger's order: (the add before it, its own)."""
        pending = _Pending()
        prev, self.tail = self.tail, pending
        return prev, pending


#: Reads a ledger's metadata from the controller (NoSuchLedgerExistsError when it has none).
MetadataSource = Callable[[int], Awaitable[LedgerMetadata]]


def _fenced(ledger_id: int, entry_id: int) -> LedgerFencedError:
    return LedgerFencedError(
        f"entry {entry_id}: ledger {ledger_id} was fenced by a recovery before the entry was "
        f"acknowledged; whether it exists is for the recovery to decide",
        ledger_id=ledger_id,
        entry_id=entry_id,
    )


def _check_open(view: LedgerView, entry_id: int, recovery: bool) -> None:
    """A ledger this replica holds a CLOSE record of takes no writer's add, nor a recovery add past its end."""
    if view.closed_at is not None and (not recovery or entry_id > view.closed_at):
        raise LedgerClosedError(
            f"entry {entry_id}: ledger {view.ledger_id} is closed at entry {view.closed_at}",
            ledger_id=view.ledger_id,
            entry_id=entry_id,
            last_entry_id=view.closed_at,
        )


def _check_digest(view: LedgerView, digester: Digester, e: Entry) -> None:
    if not digester.matches(view.ledger_id, e.entry_id, e.lac, e.length, e.data, e.digest):
        raise DigestMatchError(
            f"entry {e.entry_id} of ledger {view.ledger_id} does not match its "
            f"{view.metadata.digest_type} digest; nothing was stored",
            ledger_id=view.ledger_id,
            entry_id=e.entry_id,
            hint="compute the digest over (ledger id, entry id, LAC, length, data) with the "
            "ledger's digest type and password (tidelog.ledger.digest)",
        )


def check_entry_shape(e: Entry, max_data: int) -> None:
    """What any add's entry must look like before its ledger is even looked at (pure)."""
    if e.entry_id < 0 or e.lac < -1 or e.lac >= e.entry_id or e.length < len(e.data):
        raise IncorrectParameterError(
            f"entry {e.entry_id}: need entry_id >= 0, -1 <= lac < entry_id and "
            f"length >= the entry's size (got lac {e.lac}, length {e.length})"
        )
    if len(e.data) > max_data:
        raise IncorrectParameterError(f"an entry holds at most {max_data} bytes, got {len(e.data)}")
    if len(e.digest) > MAX_DIGEST_BYTES:
        raise IncorrectParameterError(f"a digest has at most {MAX_DIGEST_BYTES} bytes")


def check_batch_shape(entries: Sequence[Entry], max_data: int) -> None:
    """An AddBatch holds 1..MAX_BATCH_ENTRIES well-formed entries with contiguous ids and at most
    MAX_BATCH_BYTES of data (pure; IncorrectParameterError naming the first thing wrong)."""
    if not entries:
        raise IncorrectParameterError("an add batch holds at least one entry")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise IncorrectParameterError(
            f"an add batch holds at most {MAX_BATCH_ENTRIES} entries, got {len(entries)}"
        )
    first = entries[0].entry_id
    total = 0
    for i, e in enumerate(entries):
        if e.entry_id != first + i:
            raise IncorrectParameterError(
                f"an add batch's entry ids are contiguous: entry {e.entry_id} follows {first + i - 1}"
            )
        check_entry_shape(e, max_data)
        total += len(e.data)
    if total > MAX_BATCH_BYTES:
        raise IncorrectParameterError(f"an add batch holds at most {MAX_BATCH_BYTES} bytes, got {total}")


def held_run(view: LedgerView, entries: Sequence[Entry]) -> tuple[int, int]:
    """(how many leading entries of a batch this replica holds already, where the last of them ends).

    A held entry must carry the same digest (a retry after an unknown outcome); the first entry not
    held must not lie below the ledger's last entry here: either is IncorrectParameterError."""
    held, end = 0, 0
    for e in entries:
        existing = view.entries.get(e.entry_id)
        if existing is None:
            break
        if existing.digest != e.digest:
            raise IncorrectParameterError(
                f"entry {e.entry_id} of ledger {view.ledger_id} already holds other data"
            )
        held, end = held + 1, existing.offset + existing.size
    if held < len(entries) and entries[held].entry_id <= view.last_entry:
        raise IncorrectParameterError(
            f"entry {entries[held].entry_id} of ledger {view.ledger_id} is below the last entry "
            f"{view.last_entry} and not held here"
        )
    return held, end


def _next_in_line(view: LedgerView, entries: Sequence[Entry], held: int) -> bool:
    """A batch can be appended now: it starts with entries held already (a retry) or with the
    ledger's next id; otherwise it waits for the ids before it."""
    return bool(held) or entries[0].entry_id == view.last_entry + 1


class LedgerReplica:
    """The ledger requests one broker serves, over its replica and commit log."""

    def __init__(self, replica: LedgerHost) -> None:
        self.replica = replica
        self.index = LedgerIndex(replica.log)
        self._master: dict[int, _MasterLedger] = {}
        self._master_epoch = -1
        # set by the broker process: how `close` learns what the controller says about a ledger
        self.metadata_source: MetadataSource | None = None
        # fences being made durable off the event loop, by ledger: a second fence of the same
        # ledger answers only once the first is on disk
        self._fence_writes: dict[int, asyncio.Future[None]] = {}

    @property
    def broker_id(self) -> int:
        return self.replica.broker_id

    @property
    def _ctx(self) -> str:
        return self.replica.ctx

    def _state(self, ledger_id: int) -> _MasterLedger:
        master = self.replica.ha_master
        epoch = master.epoch if master is not None else -1
        if epoch != self._master_epoch:  # a new mastership starts from what the log says
            self._master.clear()
            self._master_epoch = epoch
        st = self._master.get(ledger_id)
        if st is None:
            st = self._master[ledger_id] = _MasterLedger()
            if self.index.is_fenced(ledger_id):
                st.fenced.set()
        return st

    # --- checks ---------------------------------------------------------------------------

    def _view(self, ledger_id: int, password: bytes, *, what: str) -> LedgerView:
        view = self.index.view(ledger_id)
        if view is None:
            # Not "no such ledger": this replica may lag behind the CREATE record or have lost it
            # to retention. It cannot check the password nor vouch for anything.
            raise LedgerReadError(
                f"broker {self.broker_id} of {self.replica.cfg.broker_set} holds no CREATE "
                f"record of ledger {ledger_id}; it cannot answer {what}",
                ledger_id=ledger_id,
                broker_id=self.broker_id,
            )
        if hash_password(password) != view.metadata.password_hash:
            raise UnauthorizedAccessError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        return view

    async def _fence_here(self, ledger_id: int) -> None:
        """Fence `ledger_id` here; durable when this returns. The fence holds in memory at once
        (the writer's adds are refused from then on); its fdatasync runs off the event loop, so a
        storm of recoveries does not stall every other request for one sync each."""
        pending = self._fence_writes.get(ledger_id)
        if pending is not None:
            await asyncio.shield(pending)
            return
        if not self.index.mark_fenced(ledger_id):
            return
        if self.replica.ha_master is not None:
            self._state(ledger_id).fenced.set()
        slave = self.replica.ha_slave
        if slave is not None:
            slave.notify_fenced(ledger_id)
        write = asyncio.ensure_future(asyncio.to_thread(self.index.persist_fence, ledger_id))
        self._fence_writes[ledger_id] = write
        write.add_done_callback(lambda _: self._fence_writes.pop(ledger_id, None))
        await asyncio.shield(write)  # a caller gone meanwhile leaves the write to finish

    def on_fenced_by_slave(self, ledger_id: int) -> None:
        """A slave fenced `ledger_id`: fence it here too, failing its pending adds (synchronous)."""
        self.index.fence(ledger_id)
        self._state(ledger_id).fenced.set()

    def _lac(self, view: LedgerView) -> tuple[int, int]:
        acked = self._state(view.ledger_id).acked_lac if self.replica.ha_master is not None else -1
        return view.confirmed_point(acked)

    # --- master: create and add -----------------------------------------------------------

    async def create(self, metadata: bytes, ledger_id: int) -> None:
        meta = LedgerMetadata.decode(metadata)
        if meta.ledger_id != ledger_id:
            raise IncorrectParameterError(f"the metadata is for ledger {meta.ledger_id}, not {ledger_id}")
        if meta.state is not LedgerState.OPEN:
            raise IncorrectParameterError(f"a ledger is created OPEN, not {meta.state}")
        if meta.broker_set != self.replica.cfg.broker_set:
            raise IncorrectParameterError(
                f"ledger {ledger_id} belongs to broker set {meta.broker_set}, "
                f"this is {self.replica.cfg.broker_set}"
            )
        master = self.replica.require_writable()
        view = self.index.view(ledger_id)
        if view is not None:
            if view.metadata.encode() != meta.encode():
                raise IncorrectParameterError(
                    f"ledger {ledger_id} was already created here with other metadata"
                )
            record = self.replica.log.read_at(view.create_offset)
            end = view.create_offset + record.size
        else:
            _, placed = self.replica.append([create_message(meta)])
            end = placed[-1].phys_offset + placed[-1].size
        await self.replica.persist(master, end, EVERY_MEMBER, fsync=True)
        log.info(
            "%s created ledger %d (AQ %d, replicas %s)",
            self._ctx,
            ledger_id,
            meta.ack_quorum,
            list(meta.replicas),
        )

    async def add(self, req: AddRequest) -> list[int]:
        """Append entry `req.entry_id` and return the SyncStateSet that holds it once acknowledged."""
        entry = req.entry
        check_entry_shape(entry, self.replica.cfg.max_message_bytes - 1024)
        master = self.replica.require_writable()
        view = self._view(req.ledger_id, req.password, what="an add")
        st = self._state(req.ledger_id)
        if not req.recovery and st.fenced.is_set():
            raise _fenced(req.ledger_id, req.entry_id)
        _check_open(view, req.entry_id, req.recovery)
        # the password was checked against the CREATE record just before: its MAC key is the ledger's
        _check_digest(view, Digester(view.metadata.digest_type, req.password), entry)
        aq = view.metadata.ack_quorum
        members = self._require_members(master, req.ledger_id, aq)
        end = None if req.recovery else await self._held_or_next(view, st, req)
        appended = end is None
        if end is None:
            kind = KIND_RECOVERY_ADD if req.recovery else KIND_ADD
            end = self._append_entries(st, req.ledger_id, [entry], kind)
        prev = pending = None
        if appended and not req.recovery:  # a retry of a held entry does not join the order chain
            prev, pending = st.chain()
        ids = (req.entry_id, req.entry_id)
        return await self._acknowledge(
            master, st, end, max(aq, members), req.ledger_id, ids, prev, pending, req.recovery
        )

    async def add_batch(self, ledger_id: int, password: bytes, entries: Sequence[Entry]) -> list[int]:
        """Append a batch of consecutive entries as one run of records (one append, one fsync,
        one wait for the replicas) and return the SyncStateSet that holds them once acknowledged.

        The whole batch is checked before anything is written; any error answers the whole batch
        and acknowledges none of it. Entries already held with the same digest (a retried batch)
        are not written again; the batch then completes with the rest."""
        master, view, st, needed = self._checked_batch(ledger_id, password, entries)
        held, end = await self._held_batch_prefix(view, st, ledger_id, entries)
        prev = pending = None
        if held < len(entries):  # a batch wholly held already (a retry) does not join the order chain
            end = self._append_entries(st, ledger_id, entries[held:])
            prev, pending = st.chain()
        ids = (entries[0].entry_id, entries[-1].entry_id)
        return await self._acknowledge(master, st, end, needed, ledger_id, ids, prev, pending)

    async def add_batches(self, calls: Sequence[LedgerAddCall]) -> list[list[int] | Exception]:
        """Several ledgers' batches (one LEDGER_ADDS frame), each checked and answered as
        `add_batch` answers it, in order: the SyncStateSet that holds it, or its error. Those that
        can go now are appended together (one append, one fsync, one wait for the replicas for
        all of them); a batch that must wait for earlier ids, or a second batch of a ledger
        already in this append, takes `add_batch`'s path once this append is made."""
        outcomes: dict[int, list[int] | Exception] = {}
        ready, later = self._sort_batches(calls, outcomes)
        runs = [(calls[i].ledger_id, st, calls[i].entries[held:]) for i, _, st, _, held, _ in ready]
        runs = [r for r in runs if r[2]]
        try:
            ends = iter(self._append_runs(runs) if runs else ())
        except Exception as exc:  # the append failed (no longer master, a full disk): every ready batch's
            outcomes.update((i, exc) for i, *_ in ready)
            ready = []
        waits: dict[int, Awaitable[list[int]]] = {}
        for i, master, st, needed, held, end in ready:
            c = calls[i]
            prev = pending = None
            if held < len(c.entries):
                end = next(ends)
                prev, pending = st.chain()
            ids = (c.entries[0].entry_id, c.entries[-1].entry_id)
            waits[i] = self._acknowledge(master, st, end, needed, c.ledger_id, ids, prev, pending)
        waits.update(later)
        for i, result in zip(
            waits, await asyncio.gather(*waits.values(), return_exceptions=True), strict=True
        ):
            if not isinstance(result, list | Exception):
                raise result  # cancelled: the request is going away
            outcomes[i] = result
        return [outcomes[i] for i in range(len(calls))]

    def _sort_batches(
        self, calls: Sequence[LedgerAddCall], outcomes: dict[int, list[int] | Exception]
    ) -> tuple[list[tuple[int, HaMaster, _MasterLedger, int, int, int]], dict[int, Awaitable[list[int]]]]:
        """`add_batches`' checks: the batches to append now (call, master, state, replicas needed,
        entries held already, where they end), and `add_batch` calls for those that must wait;
        a refused batch's error goes to `outcomes`."""
        ready: list[tuple[int, HaMaster, _MasterLedger, int, int, int]] = []
        later: dict[int, Awaitable[list[int]]] = {}
        taken: set[int] = set()
        for i, c in enumerate(calls):
            try:
                master, view, st, needed = self._checked_batch(c.ledger_id, c.password, c.entries)
                held, end = held_run(view, c.entries)
                if c.ledger_id in taken or not _next_in_line(view, c.entries, held):
                    later[i] = self.add_batch(c.ledger_id, c.password, c.entries)
                    continue
            except Exception as exc:  # this batch's answer; the others go on
                outcomes[i] = exc
                continue
            taken.add(c.ledger_id)
            ready.append((i, master, st, needed, held, end))
        return ready, later

    def _checked_batch(
        self, ledger_id: int, password: bytes, entries: Sequence[Entry]
    ) -> tuple[HaMaster, LedgerView, _MasterLedger, int]:
        """A batch's checks before anything is written: (master, ledger view, master state, the
        replicas that must hold it)."""
        check_batch_shape(entries, self.replica.cfg.max_message_bytes - 1024)
        master = self.replica.require_writable()
        view = self._view(ledger_id, password, what="an add")
        st = self._state(ledger_id)
        first = entries[0].entry_id
        if st.fenced.is_set():
            raise _fenced(ledger_id, first)
        _check_open(view, first, False)
        digester = Digester(view.metadata.digest_type, password)  # one key derivation per batch
        for e in entries:
            _check_digest(view, digester, e)
        aq = view.metadata.ack_quorum
        return master, view, st, max(aq, self._require_members(master, ledger_id, aq))

    async def _acknowledge(
        self,
        master: HaMaster,
        st: _MasterLedger,
        end: int,
        needed: int,
        ledger_id: int,
        ids: tuple[int, int],
        prev: _Pending | None,
        pending: _Pending | None,
        recovery: bool = False,
    ) -> list[int]:
        """Wait until appended entries `ids` (first, last; or a retry held already, `pending`
        None) are held by `needed` replicas and fsync'd here, after the adds before them in the
        ledger's order; the SyncStateSet then holding them."""
        pending = pending or _Pending()
        try:
            acked = asyncio.ensure_future(self.replica.persist(master, end, needed, fsync=True))
            if recovery:  # a recovery's rewrite: the fence is the recovery's own
                await acked
            else:
                await self._acked_in_order(st, acked, ledger_id, ids[0], prev)
            pending.ok = True
        finally:
            pending.done.set()
        st.acked_lac = max(st.acked_lac, ids[1])
        self.replica.notify_confirmed()  # wake LAC long polls
        return sorted(master.ack_set)

    async def _acked_in_order(
        self,
        st: _MasterLedger,
        acked: asyncio.Future[None],
        ledger_id: int,
        entry_id: int,
        prev: _Pending | None,
    ) -> None:
        """Wait for `acked` unless the ledger is fenced first, then for the add before this one."""
        fenced = asyncio.ensure_future(st.fenced.wait())
        try:
            either: set[asyncio.Future[Any]] = {acked, fenced}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            fenced.cancel()
        # A fence seen at any point before completion fails the add: its outcome is then for the
        # recovery to decide (rule W2), and the slave that fenced may not hold it as an entry.
        if st.fenced.is_set():
            acked.cancel()
            with contextlib.suppress(BaseException):
                await acked
            raise _fenced(ledger_id, entry_id)
        await acked
        if prev is not None:
            await prev.done.wait()
        if st.fenced.is_set():
            raise _fenced(ledger_id, entry_id)
        if prev is not None and not prev.ok:
            raise IncorrectParameterError(
                f"entry {entry_id}: entry {entry_id - 1} of ledger {ledger_id} failed; retry from it",
                ledger_id=ledger_id,
                entry_id=entry_id,
            )

    @staticmethod
    def _require_members(master: HaMaster, ledger_id: int, aq: int) -> int:
        members = master.write_set_size
        if members < aq:
            raise NotEnoughBookiesError(
                f"ledger {ledger_id} needs {aq} replicas to acknowledge; the broker "
                f"set's SyncStateSet has {members}",
                ack_quorum=aq,
                in_sync=members,
            )
        return members

    async def _held_batch_prefix(
        self, view: LedgerView, st: _MasterLedger, ledger_id: int, entries: Sequence[Entry]
    ) -> tuple[int, int]:
        """Sequence a batch (`held_run`); a batch that starts beyond the next id waits briefly for
        the ids before it (pipelined batches can arrive out of order)."""
        deadline = time.monotonic() + GAP_WAIT_S
        while True:
            held, end = held_run(view, entries)
            if _next_in_line(view, entries, held):
                return held, end
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise IncorrectParameterError(
                    f"entry {entries[0].entry_id} of ledger {ledger_id} came before entry "
                    f"{view.last_entry + 1}; add entries in order"
                )
            with contextlib.suppress(TimeoutError):
                await within(st.appended.wait(), remaining)
            if st.fenced.is_set():
                raise _fenced(ledger_id, entries[0].entry_id)
            view = self.index.view(ledger_id) or view

    def _append_entries(
        self, st: _MasterLedger, ledger_id: int, entries: Sequence[Entry], kind: str = KIND_ADD
    ) -> int:
        return self._append_runs([(ledger_id, st, entries)], kind)[0]

    def _append_runs(
        self, runs: Sequence[tuple[int, _MasterLedger, Sequence[Entry]]], kind: str = KIND_ADD
    ) -> list[int]:
        """Append runs of entries (of one ledger each, several ledgers in one append) and fold them
        into the ledger index; the offset where each run ends."""
        _, placed = self.replica.append(
            [add_message(lid, e, kind) for lid, _, entries in runs for e in entries]
        )
        ends, at = [], 0
        for ledger_id, st, entries in runs:
            mine = placed[at : at + len(entries)]
            at += len(entries)
            self.index.note_adds(ledger_id, kind, mine, entries)
            st.appended.set()  # wakes the batches waiting for these ids; later ones wait on a new event
            st.appended = asyncio.Event()
            ends.append(mine[-1].phys_offset + mine[-1].size)
        return ends

    async def _held_or_next(self, view: LedgerView, st: _MasterLedger, req: AddRequest) -> int | None:
        """Sequence a (non-recovery) add: the end of the record when this replica already holds the
        entry with the same digest (a retry), None when it is the next id to append. An id beyond
        the next waits briefly for the ids before it (pipelined calls can arrive out of order)."""
        ledger_id, entry_id = req.ledger_id, req.entry_id
        deadline = time.monotonic() + GAP_WAIT_S
        while True:
            existing = view.entries.get(entry_id)
            if existing is not None:
                if existing.digest != req.digest:
                    raise IncorrectParameterError(
                        f"entry {entry_id} of ledger {ledger_id} already holds other data"
                    )
                return existing.offset + existing.size
            if entry_id == view.last_entry + 1:
                return None
            if entry_id <= view.last_entry:
                raise IncorrectParameterError(
                    f"entry {entry_id} of ledger {ledger_id} is below the last entry "
                    f"{view.last_entry} and not held here"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise IncorrectParameterError(
                    f"entry {entry_id} of ledger {ledger_id} came before entry "
                    f"{view.last_entry + 1}; add entries in order"
                )
            with contextlib.suppress(TimeoutError):
                await within(st.appended.wait(), remaining)
            if st.fenced.is_set():
                raise _fenced(ledger_id, entry_id)
            view = self.index.view(ledger_id) or view

    async def close(self, ledger_id: int, password: bytes) -> tuple[int, int]:
        """Seal `ledger_id` here at the end the controller's metadata records (it must be CLOSED);
        returns (last entry id, length) once the CLOSE record is fsync'd and held by the SyncStateSet."""
        view = self._view(ledger_id, password, what="a close")
        master = self.replica.require_writable()
        if view.closed_at is None:
            if self.metadata_source is None:
                raise UnavailableError(
                    f"broker {self.broker_id} cannot read ledger metadata from the controller"
                )
            meta = await self.metadata_source(ledger_id)
            if meta.state is not LedgerState.CLOSED:
                raise IllegalOpError(
                    f"ledger {ledger_id} is {meta.state} in the controller's metadata; only a CLOSED "
                    f"ledger is sealed on the brokers",
                    ledger_id=ledger_id,
                )
            view = self.index.view(ledger_id) or view
            if view.closed_at is None:  # not sealed by a concurrent call meanwhile
                msg = close_message(ledger_id, meta.last_entry_id, meta.length)
                _, placed = self.replica.append([msg])
                self.index.note_appended(placed[-1], msg)
                view = self.index.view(ledger_id) or view
                log.info(
                    "%s sealed ledger %d at entry %d (length %d)",
                    self._ctx,
                    ledger_id,
                    meta.last_entry_id,
                    meta.length,
                )
        if view.closed_at is None:  # pragma: no cover - the record was just folded in
            raise LedgerReadError(f"ledger {ledger_id}: the CLOSE record is not in the index")
        await self.replica.persist(master, view.close_end, EVERY_MEMBER, fsync=True)
        return view.closed_at, view.closed_length

    # --- every replica: fence, read, LAC --------------------------------------------------

    async def fence(self, ledger_id: int, password: bytes) -> tuple[int, int]:
        view = self._view(ledger_id, password, what="a fence")
        await self._fence_here(ledger_id)
        return self._lac(view)

    async def read(
        self, ledger_id: int, password: bytes, first: int, last: int, fence: bool, max_bytes: int
    ) -> tuple[list[Entry], int]:
        if first < 0 or last < first:
            raise IncorrectParameterError(f"read {first}..{last}: need 0 <= first <= last")
        if last - first >= MAX_READ_ENTRIES:
            last = first + MAX_READ_ENTRIES - 1
        view = self._view(ledger_id, password, what="a read")
        if fence:
            await self._fence_here(ledger_id)
            view = self.index.view(ledger_id) or view
        # clamped like a Pull: the reply must fit in a gRPC message whatever the request asks for
        budget = min(max_bytes or DEFAULT_READ_BYTES, self.replica.cfg.max_pull_bytes)
        out: list[Entry] = []
        for entry_id in range(first, last + 1):
            ent = self._entry_at(view, entry_id, first_of_reply=not out)
            if ent is None or (out and ent.size > budget):
                break
            try:
                data = self.index.read_entry(ent)
            except (CorruptRecordError, OffsetBelowRetentionError, InvalidArgumentError) as exc:
                if out:
                    break
                raise LedgerReadError(
                    f"broker {self.broker_id} cannot read entry {entry_id} of ledger "
                    f"{ledger_id}: {exc.message}",
                    ledger_id=ledger_id,
                    entry_id=entry_id,
                ) from None
            budget -= ent.size
            out.append(Entry(entry_id, ent.lac, ent.length, ent.digest, data))
        return out, self._lac(view)[0]

    def _entry_at(self, view: LedgerView, entry_id: int, *, first_of_reply: bool) -> IndexedEntry | None:
        """The index entry of `entry_id`; None ends a reply that already holds entries, and the
        first entry of a reply missing here says whether it never existed or retention took it."""
        ent = view.entries.get(entry_id)
        if ent is not None or not first_of_reply:
            return ent
        ledger_id = view.ledger_id
        if self.index.knows_whole_life(view):
            raise NoSuchEntryError(
                f"broker {self.broker_id} never had entry {entry_id} of ledger {ledger_id}",
                ledger_id=ledger_id,
                entry_id=entry_id,
                broker_id=self.broker_id,
            )
        raise LedgerReadError(
            f"broker {self.broker_id} no longer holds the start of ledger {ledger_id} "
            f"(retention); it cannot tell whether entry {entry_id} existed",
            ledger_id=ledger_id,
            entry_id=entry_id,
        )

    async def lac(
        self, ledger_id: int, password: bytes, previous: int, wait_ms: int
    ) -> tuple[int, int, bool]:
        view = self._view(ledger_id, password, what="a LAC read")

        def poll() -> tuple[tuple[int, int, bool], bool]:
            lac, length = self._lac(self.index.view(ledger_id) or view)
            return (lac, length, self.index.is_fenced(ledger_id)), lac > previous

        return await self.replica.long_poll(poll, wait_ms)
