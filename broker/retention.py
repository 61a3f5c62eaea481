"""Retention in a running broker: the background loop that gathers floors, carries metadata
forward and deletes whole old segments (docs/ARCHITECTURE.md §6.4).

Each round (every `retention_check_interval_ms`) does the slow part first — on a slave asks its
master for the master's min offset; when some segment could go, asks the controller which of the
ledgers in the way (and of those fenced here) still exist — then,
without awaiting anything, gathers the floors, decides with the pure rule
(`commitlog/retentionpolicy.py::decide`), lets the master append copies of the live metadata
records in the segments that would go (`broker/compaction.py`), decides again with the
metadata floor and deletes. Nothing else runs on the event loop between the floors and the
delete, so no floor can move under the decision.

Floors (a segment reaching any of them stays, and so does everything after it):

- `confirm`: the confirm offset — on a master what every SyncStateSet member holds, on a slave
  what it has confirmed; `recovery`: the flushed and durable consume-queue offsets;
- `slaves` (master): the ack of every connected slave, and the last ack of one that left less
  than `retention_slave_hold_ms` ago, so a slave that is down can still catch up on its return;
- `master-min` (slave): the master's min offset as last learned (nothing is deleted before it
  is known), so this replica never holds less than its master: were it elected, every slave the
  old master kept for would still catch up;
- `groups`: the next message of each `retention_respect_groups` group in every queue it
  committed;
- `metadata`: the oldest live group commit or topic marker not yet superseded by a confirmed
  copy, and the CREATE record of every ledger the controller still has;
- `topic:<name>`: a topic whose own retention is longer than the broker's — its first record in
  the oldest segment young enough to hold one it must keep (`commitlog/topicretention.py`).

Each round also applies the topics' own retention shorter than the broker's: their consume
queues are cut past the segments older than it, so readers get OFFSET_BELOW_RETENTION there
while the bytes go with the broker's rule. Rounds run whenever some topic has its own
retention, even with the broker's retention off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from tidelog.broker.compaction import MetadataFold, carry_plan, copy_message
from tidelog.broker.ports import RetentionHost
from tidelog.commitlog.retentionpolicy import Decision, RetentionRules, decide
from tidelog.commitlog.topicretention import plan
from tidelog.credentials import signer
from tidelog.errors import NoSuchLedgerExistsError, OffsetBelowRetentionError, TidelogError
from tidelog.ha.roles import MASTER, SLAVE
from tidelog.proto import broker_pb2 as pb
from tidelog.proto import broker_pb2_grpc
from tidelog.tasks import within
from tidelog.tlsconfig import aio_channel, member_client

log = logging.getLogger(__name__)

__all__ = ["RetentionLoop"]

MAX_LEDGER_LOOKUPS = 256  # per round: existence checks asked of the controller


class RetentionLoop:
    """The retention rounds of one broker replica."""

    def __init__(self, replica: RetentionHost, *, clock: Callable[[], float] = time.time) -> None:
        self.replica = replica
        self.cfg = replica.cfg
        self.log = replica.log
        self.clock = clock
        self.rules = RetentionRules(self.cfg.retention_ms, self.cfg.retention_bytes)
        self.fold = MetadataFold(replica.log)
        self.slave_acks: dict[int, tuple[int, int]] = {}  # slave id -> (last ack, when seen, ms)
        self.master_min: tuple[int, int] | None = None  # (master epoch, its min offset)
        self.deleted_segments = 0  # counters for status and metrics
        self.carried_records = 0
        self.cut_messages = 0  # queue units cut by topics' own retention
        self.last_decision: Decision | None = None
        self.dead_ledgers: set[int] = set()  # ledgers the controller said it no longer has

    @property
    def enabled(self) -> bool:
        """Whether the broker's own rule deletes anything (topics' retentions aside)."""
        return self.rules.retention_ms > 0 or self.rules.retention_bytes > 0

    def topic_retentions(self) -> dict[str, int]:
        """The topics served here with a retention of their own (ms)."""
        return {t: ms for t, ms in self.replica.topic_table.retention.items() if ms > 0}

    async def run(self, stopping: asyncio.Event) -> None:
        """Rounds until `stopping` is set; a failed round is logged and the next one tried.
        With the broker's rule off a round does nothing until some topic has its own retention
        (the controller may give one at any heartbeat)."""
        interval = self.cfg.retention_check_interval_ms / 1000
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), interval)
            if stopping.is_set():
                return
            try:
                await self.check_once()
            except TidelogError as exc:
                log.warning("%s retention round failed: %s", self.replica.ctx, exc)
            except Exception:
                log.exception("%s retention round failed", self.replica.ctx)

    async def check_once(self) -> int:
        """One round; returns how many segments were deleted."""
        role = self.replica.role
        if role not in (MASTER, SLAVE):
            return 0
        self.cut_topics(int(self.clock() * 1000))
        if not self.enabled or len(self.log.segment_infos()) < 2:
            return 0
        if role == SLAVE:
            await self._learn_master_min()
        now_ms = int(self.clock() * 1000)
        # A first look without the metadata floor: when nothing could go, nobody is asked anything.
        first = decide(self.log.segment_infos(), now_ms, self.rules, self._floors(now_ms))
        if not first.count:
            self.last_decision = first
            return 0
        dead = await self._dead_ledgers(first.new_min)
        return self._decide_and_delete(int(self.clock() * 1000), dead)

    # ------------------------------------------------------------------ the synchronous part

    def _decide_and_delete(self, now_ms: int, dead: set[int]) -> int:
        self.replica.ledgers.index.prune_fences(dead)
        if self.replica.role not in (MASTER, SLAVE):
            return 0
        segments = self.log.segment_infos()
        floors = self._floors(now_ms)
        first = decide(segments, now_ms, self.rules, floors)
        plan = None
        if first.count:
            live, pending = self.fold.refresh()
            starts = self.replica.ledgers.index.ledger_starts()
            plan = carry_plan(live, pending, first.new_min, starts, dead)
            floors["metadata"] = plan.floor
        decision = decide(segments, now_ms, self.rules, floors)
        self.last_decision = decision
        if plan is not None and plan.carry and self._writable():
            _, placed = self.replica.append([copy_message(r) for r in plan.carry])
            self.carried_records += len(placed)
            log.info("%s retention carried %d metadata records forward", self.replica.ctx, len(placed))
        if not decision.count:
            return 0
        before = self.log.min_offset
        new_min = self.log.delete_before(decision.new_min)
        self.deleted_segments += decision.count
        log.info(
            "%s retention deleted %d segments: min offset %d -> %d (next held: %s)",
            self.replica.ctx,
            decision.count,
            before,
            new_min,
            decision.held_by,
        )
        return decision.count

    def cut_topics(self, now_ms: int) -> int:
        """Cut the queues of topics whose own retention is shorter than the broker's past the
        segments older than it; returns how many queue units went."""
        topics = self.topic_retentions()
        if not topics:
            return 0
        limit = self.log.max_offset  # read before the times: later records are never cut
        cuts = plan(self.log.segment_infos(), now_ms, self.rules.retention_ms, topics, limit).cut_below
        cut = 0
        for topic, queue in self.log.queues():
            below = cuts.get(topic)
            if below is None:
                continue
            start = self.log.queue_offsets(topic, queue).min
            offset, _ = self.log.queue_unit_at(topic, queue, below)
            if offset > start:
                self.log.cut_queue(topic, queue, offset)
                cut += offset - start
                log.info(
                    "%s topic retention of %s: queue %d starts at %d (records below %d are older than %d ms)",
                    self.replica.ctx,
                    topic,
                    queue,
                    offset,
                    below,
                    topics[topic],
                )
        self.cut_messages += cut
        return cut

    def _topic_floors(self, now_ms: int) -> dict[str, int | None]:
        """`topic:<name>` floors: the first record of each topic with a retention longer than the
        broker's in the oldest segment that may hold one younger than it."""
        topics = self.topic_retentions()
        if not topics or self.rules.retention_ms <= 0:
            return {}
        young = plan(self.log.segment_infos(), now_ms, self.rules.retention_ms, topics, self.log.max_offset)
        found: dict[str, int] = {}
        for topic, queue in self.log.queues():
            start = young.young_from.get(topic)
            if start is None:
                continue
            _, phys = self.log.queue_unit_at(topic, queue, start)
            if phys is not None:
                found[topic] = min(phys, found.get(topic, phys))
        return {f"topic:{topic}": at for topic, at in found.items()}

    def _writable(self) -> bool:
        try:
            self.replica.require_writable()
        except TidelogError:
            return False  # not master, or its lease lapsed: the copies wait for the next round
        return True

    def _floors(self, now_ms: int) -> dict[str, int | None]:
        floors: dict[str, int | None] = {
            "confirm": self.log.confirm_offset,
            "recovery": self.log.recovery_floor,
            "groups": self._group_floor(),
            **self._topic_floors(now_ms),
        }
        if self.replica.role == MASTER:
            floors["slaves"] = self._slave_floor(now_ms)
            self.master_min = None
        else:
            floors["master-min"] = self._master_min_floor()
            self.slave_acks.clear()
        return floors

    def _slave_floor(self, now_ms: int) -> int | None:
        master = self.replica.ha_master
        if master is not None:
            for slave, ack in master.acks().items():
                self.slave_acks[slave] = (ack, now_ms)
        hold = self.cfg.retention_slave_hold_ms
        self.slave_acks = {s: v for s, v in self.slave_acks.items() if now_ms - v[1] <= hold}
        return min((ack for ack, _ in self.slave_acks.values()), default=None)

    def _master_min_floor(self) -> int:
        learned = self.master_min
        if learned is None or learned[0] != self.replica.master_epoch:
            return self.log.min_offset  # not known for this master: delete nothing
        return learned[1]

    def _group_floor(self) -> int | None:
        groups = self.cfg.retention_respect_groups
        if not groups:
            return None
        marks = self.replica.topic_table.marks
        floor: int | None = None
        for topic, queue in self.log.queues():
            if topic.startswith("%"):
                continue
            for group in groups:
                offset = self.replica.offsets.fetch(group, topic, queue, since=marks.marked_at(topic))
                if offset is None:
                    continue
                try:
                    msgs = self.log.read(topic, queue, offset, 1, confirmed_only=False)
                except OffsetBelowRetentionError:
                    continue  # already gone: nothing left to keep for it
                if msgs:
                    floor = msgs[0].phys_offset if floor is None else min(floor, msgs[0].phys_offset)
        return floor

    # ------------------------------------------------------------------ the asynchronous part

    async def _dead_ledgers(self, limit: int) -> set[int]:
        """Ledgers the controller no longer has, among those created below `limit` or fenced here.
        A ledger the controller cannot be asked about counts as existing; a deleted one never
        comes back (ids are not reused), so it is asked about once."""
        source = self.replica.ledgers.metadata_source
        if source is None:
            return set(self.dead_ledgers)
        index = self.replica.ledgers.index
        ids = set(index.fenced_ledgers()) | {lid for lid, at in index.ledger_starts().items() if at < limit}
        for ledger_id in sorted(ids - self.dead_ledgers)[:MAX_LEDGER_LOOKUPS]:
            try:
                await source(ledger_id)
            except NoSuchLedgerExistsError:
                self.dead_ledgers.add(ledger_id)
            except TidelogError as exc:
                log.debug("ledger %d: existence unknown (%s)", ledger_id, exc)
        return set(self.dead_ledgers)

    async def _learn_master_min(self) -> None:
        """Ask the master (gRPC Status) for its min offset; kept with the epoch it belongs to."""
        address, epoch = self.replica.master_address, self.replica.master_epoch
        if not address:
            return
        try:
            sign = signer(None, self.cfg.secret) if self.cfg.auth is not None else None
            async with aio_channel(
                address, member_client(self.cfg.tls), interceptors=[sign] if sign else ()
            ) as channel:
                reply = await broker_pb2_grpc.BrokerStub(channel).Status(pb.StatusRequest(), timeout=2.0)
        except grpc.aio.AioRpcError as exc:
            log.debug("retention: the master's min offset is unknown (%s)", exc.code())
            return
        if reply.role == MASTER and reply.broker_set == self.cfg.broker_set and reply.master_epoch == epoch:
            self.master_min = (epoch, int(reply.min_offset))
