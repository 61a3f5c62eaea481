"""The slave side of replication: follow the master the controller named, repair forks, copy bytes.

Theory of operation
-------------------
`HaSlave.run()` loops until stopped: connect to the master's HA address, prove the cluster
secret both ways (over TLS when the broker has a `tls:` section), send a Handshake (this broker's id, epoch map and max offset) and read the
master's epoch map. What to do with it — refuse a deposed master, cut a forked tail (fork
repair), refuse a cut below the confirm offset after a clean election — and with every Transfer
that follows (record a new epoch, append, flush, ack, follow the confirm offset) is decided by
`ha.slavecore.SlaveCore.step`; this module carries out its actions on the log and the socket.

Any protocol violation or I/O error closes the connection and the loop starts over after a
short pause; it never stops the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

from tidelog.clusterauth import new_nonce
from tidelog.commitlog import CommitLog
from tidelog.errors import HaProtocolError, OffsetMismatchError, TidelogError
from tidelog.ha import auth as ha_auth
from tidelog.ha import slavecore as sc
from tidelog.ha.protocol import (
    MAX_AUTH_FRAME,
    MAX_REPAIR_BYTES,
    Ack,
    AuthChallenge,
    AuthHello,
    AuthProof,
    ErrorFrame,
    Handshake,
    HandshakeReply,
    LedgerFenced,
    RangeData,
    RangeRequest,
    Transfer,
    encode,
    read_frame,
)
from tidelog.invariants import stop_if_violated
from tidelog.tasks import cancel_and_wait, within
from tidelog.tlsconfig import ClientTls, open_connection

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class HaSlave:
    def __init__(
        self,
        commitlog: CommitLog,
        *,
        broker_set: str,
        broker_id: int,
        master_id: int,
        master_address: str,
        master_epoch: int,
        flush_sync: bool = False,
        ack_interval_ms: int = 1000,
        idle_timeout_ms: int = 5000,
        retry_ms: int = 500,
        on_progress: Callable[[], None] | None = None,
        fenced_ledgers: Callable[[], Iterable[int]] | None = None,
        secret: str = "",
        unclean_epoch: int = 0,
        tls: ClientTls | None = None,
    ) -> None:
        self.log = commitlog
        self.secret = secret
        self.tls = tls  # the master's HA port speaks TLS: verify it against this CA
        self.refusals = 0  # masters refused for demanding a cut below the confirm offset
        self._repairs: set[tuple[int, int]] = set()  # damaged ranges asked of the master
        self.repaired: list[tuple[int, int]] = []  # ranges rewritten from the master's copy
        self.broker_set = broker_set
        self.broker_id = broker_id
        self.master_id = master_id
        self.master_address = master_address
        self.master_epoch = master_epoch
        self.flush_sync = flush_sync
        self.ack_interval = ack_interval_ms / 1000.0
        self.idle_timeout = idle_timeout_ms / 1000.0
        self.retry = retry_ms / 1000.0
        self.on_progress = on_progress
        self.fenced_ledgers = fenced_ledgers
        self._writer: asyncio.StreamWriter | None = None
        self.connected = False
        self.handshakes = 0
        self.truncations: list[tuple[int, int]] = []  # (from max offset, to offset), for tests and status
        # The decisions (fork repair, what a transfer may do, acks): `unclean_epoch` is the last epoch
        # the controller elected outside the SyncStateSet; only a replica whose history ends before
        # it may have its confirmed tail cut by fork repair.
        self.core = sc.SlaveCore(
            master_id, master_epoch, flush_sync, unclean_epoch, seen_epoch=commitlog.epochs.last_epoch
        )
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._ctx = f"[{broker_set}/{broker_id} slave of {master_id}@{master_address} epoch {master_epoch}]"

    def start(self) -> HaSlave:
        self._task = asyncio.ensure_future(self.run())
        return self

    async def stop(self) -> None:
        self._stopped = True  # the loop ends even if a cancellation were lost on the way
        await cancel_and_wait(self._task)
        self._task = None
        self.connected = False

    async def run(self) -> None:
        while not self._stopped:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                log.info("%s connection lost: %s", self._ctx, exc or type(exc).__name__)
            except TidelogError as exc:
                log.warning("%s %s", self._ctx, exc)
            except (
                Exception
            ) as exc:  # a bug: log it and keep following the master (unless an invariant broke)
                stop_if_violated(exc)
                log.exception("%s replication failed", self._ctx)
            self.connected = False
            await asyncio.sleep(self.retry)

    async def _session(self) -> None:
        host, _, port = self.master_address.rpartition(":")
        reader, writer = await within(open_connection(host, int(port), self.tls), self.idle_timeout)
        try:
            await self._authenticate(reader, writer)
            writer.write(
                encode(
                    Handshake(
                        self.broker_set, self.broker_id, self.log.max_offset, tuple(self.log.epochs.pairs())
                    )
                )
            )
            await writer.drain()
            reply = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
            if isinstance(reply, ErrorFrame):
                raise HaProtocolError(f"master refused the handshake: {reply.code}: {reply.message}")
            if not isinstance(reply, HandshakeReply):
                raise HaProtocolError(f"expected a handshake reply, got {type(reply).__name__}")
            actions = self.core.step(
                sc.MasterAnswered(
                    reply.master_epoch, reply.min_offset, reply.max_offset, tuple(reply.epochs), self._local()
                ),
                now_ms(),
            )
            await self._carry_out(actions, writer, first_ack=True)
            self.handshakes += 1
            self._repairs.clear()  # asked on a connection that is gone: ask again on this one
            self._writer = writer
            await writer.drain()
            self.connected = True
            log.info("%s streaming from offset %d", self._ctx, self.log.max_offset)
            acker = asyncio.ensure_future(self._ack_loop(writer))
            try:
                await self._receive(reader, writer)
            finally:
                await cancel_and_wait(acker)
        finally:
            if self._writer is writer:
                self._writer = None
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Prove the cluster secret to the master and check its proof, before anything else: a
        stranger answering on the master's address never gets to steer this log."""
        nonce = new_nonce()
        writer.write(encode(AuthHello(self.broker_set, self.broker_id, nonce)))
        await writer.drain()
        challenge = await within(read_frame(reader, MAX_AUTH_FRAME), self.idle_timeout)
        if isinstance(challenge, ErrorFrame):
            raise HaProtocolError(f"master refused the connection: {challenge.code}: {challenge.message}")
        if not isinstance(challenge, AuthChallenge):
            raise HaProtocolError(f"expected the master's challenge, got {type(challenge).__name__}")
        if challenge.master_id != self.master_id:
            raise HaProtocolError(
                f"{self.master_address} answers as broker {challenge.master_id}, "
                f"not the master {self.master_id} the controller named"
            )
        fields = (
            self.broker_set,
            self.master_id,
            self.broker_id,
            challenge.master_epoch,
            nonce,
            challenge.nonce,
        )
        if not ha_auth.check_master(self.secret, challenge.proof, *fields):
            log.error(
                "%s %s did not prove the cluster secret: not following it", self._ctx, self.master_address
            )
            raise HaProtocolError(f"{self.master_address} did not prove the cluster secret")
        writer.write(encode(AuthProof(ha_auth.slave_proof(self.secret, *fields))))

    def request_repair(self, offset: int, length: int) -> bool:
        """Ask the master for its copy of bytes found damaged here; False when not connected."""
        if self._writer is None or self._writer.is_closing() or (offset, length) in self._repairs:
            return False
        log.error(
            "%s damaged bytes [%d, %d) in this replica's log: asking the master for its copy",
            self._ctx,
            offset,
            offset + length,
        )
        self._repairs.add((offset, length))
        self._writer.write(encode(RangeRequest(offset, length)))
        return True

    def _repair_range(self, frame: RangeData) -> None:
        self._repairs = {r for r in self._repairs if r[0] != frame.offset}
        try:
            self.log.repair_range(frame.offset, frame.data)
            self.repaired.append((frame.offset, frame.offset + len(frame.data)))
        except TidelogError as exc:  # the master's copy is no better, or the range moved: say so
            log.error(
                "%s could not repair [%d, %d) with the master's copy: %s",
                self._ctx,
                frame.offset,
                frame.offset + len(frame.data),
                exc,
            )

    def _send_range(self, req: RangeRequest, writer: asyncio.StreamWriter) -> None:
        """The master found bytes of its log damaged: send this log's copy of them. What this
        replica holds is the master's log up to its max offset (fork repair cut the rest at the
        handshake); the master checks every record before writing it. None here (damaged too,
        gone with retention, not yet copied): an empty answer, so that it asks another replica."""
        end = req.offset + req.length
        data = b""
        if (
            self.log.min_offset <= req.offset
            and end <= self.log.max_offset
            and req.length <= MAX_REPAIR_BYTES
        ):
            try:
                data, _ = self.log.read_raw_chunk(req.offset, req.length)
            except TidelogError as exc:
                log.error("%s cannot send the master [%d, %d): %s", self._ctx, req.offset, end, exc)
        log.warning(
            "%s master reports damaged bytes [%d, %d): sending %d bytes of this log's copy",
            self._ctx,
            req.offset,
            end,
            len(data),
        )
        writer.write(encode(RangeData(req.offset, data)))

    def notify_fenced(self, ledger_id: int) -> None:
        """Tell the master at once that this replica fenced `ledger_id` (before any later ack).

        Not connected: the next connection repeats every fence before its first ack."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode(LedgerFenced(ledger_id)))

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            frame = await within(read_frame(reader), self.idle_timeout)
            if isinstance(frame, ErrorFrame):
                raise HaProtocolError(f"master says {frame.code}: {frame.message}")
            if isinstance(frame, RangeData):
                self._repair_range(frame)
                continue
            if isinstance(frame, RangeRequest):
                self._send_range(frame, writer)
                continue
            if not isinstance(frame, Transfer):
                raise HaProtocolError(f"unexpected {type(frame).__name__} from the master")
            event = sc.TransferArrived(
                frame.offset,
                frame.epoch,
                frame.epoch_start,
                frame.confirm_offset,
                len(frame.data),
                self._local(),
            )
            await self._carry_out(self.core.step(event, now_ms()), writer, data=frame.data)
            if self.on_progress is not None:
                self.on_progress()
            await writer.drain()

    def _local(self) -> sc.LocalLog:
        return sc.LocalLog(
            tuple(self.log.epochs.pairs()),
            self.log.min_offset,
            self.log.max_offset,
            self.log.confirm_offset,
            self.log.flushed_offset,
        )

    async def _carry_out(
        self,
        actions: list[sc.Action],
        writer: asyncio.StreamWriter,
        *,
        data: bytes = b"",
        first_ack: bool = False,
    ) -> None:
        """Do what the core decided, in its order."""
        for action in actions:
            match action:
                case sc.Refuse(kind, reason):
                    self._refuse(kind, reason)
                case sc.Truncate(to, no_common):
                    self._truncate(to, no_common)
                case sc.StartAt(offset):
                    log.warning("%s empty replica: starting at the master's min offset %d", self._ctx, offset)
                    self.log.start_at(offset)
                case sc.RecordEpoch(epoch, start):
                    self.log.epochs.append(epoch, start)
                case sc.Append():
                    self.log.append_raw(self.log.max_offset, data)
                case sc.AwaitFlush(offset):
                    await self.log.flushed(offset)
                case sc.Ack(offset):
                    self._ack(writer, offset, first_ack)
                case sc.SetConfirm(offset):
                    self.log.confirm_offset = offset

    def _ack(self, writer: asyncio.StreamWriter, offset: int, first: bool) -> None:
        if first:
            # Fences first, then the first ack, with no await in between: a fence made after this
            # point goes out through notify_fenced on the same writer, so the master always learns
            # of a fence before it counts an ack that could cover a fenced ledger's record.
            for ledger_id in self.fenced_ledgers() if self.fenced_ledgers is not None else ():
                writer.write(encode(LedgerFenced(ledger_id)))
        writer.write(encode(Ack(offset)))

    def _refuse(self, kind: str, reason: str) -> NoReturn:
        if kind == "below-confirm":
            self.refusals += 1
            log.error(
                "%s refusing fork repair: %s (local epochs %s)", self._ctx, reason, self.log.epochs.pairs()
            )
        if kind in ("below-retention", "offset-mismatch"):
            raise OffsetMismatchError(reason)
        raise HaProtocolError(f"{self.master_address}: {reason}")

    def _truncate(self, to: int, no_common: bool) -> None:
        local_max = self.log.max_offset
        if no_common:
            log.error(
                "%s no epoch in common with the master (local epochs %s): discarding the local log from %d",
                self._ctx,
                self.log.epochs.pairs(),
                to,
            )
        log.warning(
            "%s fork repair: truncating from %d to %d (local epochs %s)",
            self._ctx,
            local_max,
            to,
            self.log.epochs.pairs(),
        )
        self.log.truncate(to)
        self.truncations.append((local_max, to))

    async def _ack_loop(self, writer: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(self.ack_interval)
            await self._carry_out(self.core.step(sc.AckTick(self._local()), now_ms()), writer)
            await writer.drain()
