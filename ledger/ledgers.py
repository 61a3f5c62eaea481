"""`AsyncLedgers`: the ledger API's operations — create, open (with or without recovery), delete,
list, read metadata — on top of the I/O plumbing of `LedgerCalls` (ledger/calls.py).

- **Create**: check every parameter first (no write before that), place the ledger on a broker
  set (`place_ledger`), take an id from the `ledger-id-counter` key by CAS, store the metadata
  under `ledger/{id:019d}`, then `Ledger.Create` on the set's master. If that fails, the metadata
  is deleted again (best effort) and the error raised.
- **Open**: the password (and the digest type, when named) is checked against the metadata
  before anything is sent. A recovery open hands the ledger to `RecoveryRun`
  (ledger/recovery_run.py), which fences and closes it; a plain open asks the replicas for the LAC.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping

from tidelog.errors import (
    DigestMatchError,
    IncorrectParameterError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionMismatchError,
    NoSuchLedgerExistsError,
    UnauthorizedAccessError,
)
from tidelog.ledger.calls import LedgerCalls
from tidelog.ledger.digest import parse_digest_type
from tidelog.ledger.metadata import (
    LedgerMetadata,
    LedgerState,
    check_create_params,
    is_int,
    new_ledger_metadata,
)
from tidelog.ledger.params import (
    COUNTER_KEY,
    LEDGER_KEY_PREFIX,
    check_ledger_id_to_open,
    check_password,
    ledger_id_of_key,
    ledger_key,
)
from tidelog.ledger.placement import broker_set_views, place_ledger
from tidelog.ledger.reader import AsyncReadHandle
from tidelog.ledger.recovery_run import RecoveryRun
from tidelog.ledger.writer import AsyncWriteHandle
from tidelog.proto import ledger_pb2 as lpb

log = logging.getLogger(__name__)

__all__ = ["AsyncLedgers"]


class AsyncLedgers(LedgerCalls):
    """Ledger operations of one `AsyncClient`: `AsyncLedgers(client, add_timeout=..., ...)`."""

    async def create_ledger(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        password: bytes,
        digest: str = "crc32c",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        broker_set: str | None = None,
    ) -> AsyncWriteHandle:
        kind = parse_digest_type(digest)
        custom = {} if custom_metadata is None else custom_metadata
        # every parameter that does not depend on placement is checked before anything is written
        check_create_params(
            ensemble_size,
            write_quorum,
            ack_quorum,
            ensemble_size,
            set_replicas=ensemble_size,
            password=password,
            digest_type=kind,
            custom_metadata=custom,
        )
        if broker_set is not None and not isinstance(broker_set, str):
            raise IncorrectParameterError(f"broker_set is a name, got {broker_set!r}")
        views = broker_set_views(await self.controller.describe_broker_sets())
        while True:
            ledger_id, counter_version = await self._peek_counter()
            view = place_ledger(
                views, ledger_id, ensemble_size, write_quorum, ack_quorum, broker_set=broker_set
            )
            meta = new_ledger_metadata(
                ledger_id,
                view.name,
                view.member_ids,
                ack_quorum,
                password=password,
                digest_type=kind,
                custom_metadata=custom,
                ctime_ms=int(time.time() * 1000),
            )
            if not await self._take_counter(ledger_id, counter_version):
                continue
            try:
                entry = await self.controller.meta_create(ledger_key(ledger_id), meta.encode())
            except MetadataExistsError:
                continue  # a ledger stored under this id by other means: never overwrite it, take the next id
            break
        meta = LedgerMetadata.decode(entry.value, version=entry.version)
        self.remember_set(view)
        try:
            await self.call_master(
                view.name,
                self.rpc("Create", lpb.CreateRequest(ledger_id=ledger_id, metadata=meta.encode())),
                deadline=time.monotonic() + self.add_timeout,
                what=f"create of ledger {ledger_id}",
            )
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

    async def open_ledger(
        self, ledger_id: int, password: bytes, *, recovery: bool = True, digest: str | None = None
    ) -> AsyncReadHandle:
        ledger_id = check_ledger_id_to_open(ledger_id)
        password = check_password(password)
        meta = await self.read_metadata(ledger_id)
        # docs/reference/bookkeeper-ledger.md §2.4 step 0: the password (and the digest type, when named) are checked before
        # anything is sent to a replica, so a wrong password fences nothing
        if not meta.check_password(password):
            raise UnauthorizedAccessError(f"wrong password for ledger {ledger_id}", ledger_id=ledger_id)
        if digest is not None and parse_digest_type(digest) is not meta.digest_type:
            raise DigestMatchError(
                f"ledger {ledger_id} uses {meta.digest_type}, not {digest}", ledger_id=ledger_id
            )
        if recovery:
            meta = await RecoveryRun(self, meta, password).run()
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
        if not is_int(ledger_id) or ledger_id < 0:
            raise IncorrectParameterError(f"a ledger id is a non-negative integer, got {ledger_id!r}")
        password = check_password(password)
        try:
            await self.controller.meta_delete(ledger_key(ledger_id), ledger_password=password)
        except MetadataNotFoundError:
            raise NoSuchLedgerExistsError(f"no ledger {ledger_id}", ledger_id=ledger_id) from None

    async def list_ledgers(self) -> list[int]:
        ids = (ledger_id_of_key(e.key) for e in await self.controller.meta_list(LEDGER_KEY_PREFIX))
        return sorted(i for i in ids if i is not None)

    async def get_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self.read_metadata(check_ledger_id_to_open(ledger_id))
