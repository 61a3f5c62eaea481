"""Delayed and transactional RocketMQ messages on the master of a broker set: kept in internal
topics of its log, moved into their topic when due or committed.

The rules are broker/delayrules.py's and broker/txstate.py's (pure); this module stores and moves.
Everything lives in the broker set's log, so it replicates like messages and a new master resumes:

- `%DELAY%`, queue `bucket(delay)`: a DELAY message until its delivery time, as it will be stored
  in its topic plus where it goes and when (rocketmqrules.PROP_TARGET_*, PROP_DELIVER_AT).
  `%DELAYOP%` (queue 0): the mover's progress per bucket, stored whole after every move.
- `%HALF%` (queue 0): a TRANSACTION message until its transaction ends (a *half* message);
  `%HALFOP%` (queue 0): the transaction state (txstate.TxState), stored whole after every change.

A move (a due delayed message, a committed half message) writes the copies for the topic and the
state that records them as one write. A master that died between the two records leaves copies
without a state: its successor, before the first copy of its term into a queue, looks among the
last `LOOKBACK` records of that queue for copies (their PROP_ORIGIN) and does not copy those
again, so each message reaches its topic once.

Checks of orphaned transactions go out through `on_check` (the RocketMQ endpoint sends them to a
producer of the topic over its Telemetry stream); the check count is stored before the check is
sent, so `rocketmq_tx_max_checks` holds across failovers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tidelog.broker import delayrules as dr
from tidelog.broker import rocketmqrules as rules
from tidelog.broker import txstate as tx
from tidelog.broker.fold import TopicFold
from tidelog.commitlog import CommitLog, Message, StoredMessage
from tidelog.commitlog.crc import crc32c
from tidelog.errors import (
    InvalidArgumentError,
    NotMasterError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)
from tidelog.ha.roles import MASTER
from tidelog.invariants import stop_if_violated

if TYPE_CHECKING:
    from tidelog.broker.replica import Replica

log = logging.getLogger(__name__)

DELAY_TOPIC = "%DELAY%"
DELAY_PROGRESS_TOPIC = "%DELAYOP%"
HALF_TOPIC = "%HALF%"
HALF_STATE_TOPIC = "%HALFOP%"
FLAG_RMQ_STATE = 16
#: How far back in a queue a new master looks for copies its predecessor made.
LOOKBACK = 1000
#: How often the master looks for due messages and checks.
TICK_S = 0.2
#: Messages moved by one write.
MOVE_BATCH = 256
#: Open transactions of a broker set: the state of all of them is one record, written at every
#: end, so their number is bounded (a new half message beyond it: TOO_MANY_REQUESTS, retried).
MAX_OPEN = 10_000

CheckSender = Callable[[str, StoredMessage, str], None]  # (topic, half message, transaction id)


class LatestStates:
    """The latest whole-state record per key of an internal topic (queue 0), folded from the
    master's whole local log (broker/fold.py): a master's log is the set's history, and its next
    decision starts from the last record it wrote. A truncation (fork repair) folds again."""

    def __init__(self, commitlog: CommitLog, topic: str) -> None:
        self.topic = topic
        self._latest: dict[str, Any] = {}
        self._fold = TopicFold(commitlog, topic, self._apply, self._latest.clear)

    def reset(self) -> None:
        self._fold.reset()

    def refresh(self) -> dict[str, Any]:
        self._fold.refresh()
        return self._latest

    def _apply(self, m: StoredMessage) -> None:
        try:
            doc = json.loads(m.body)
            self._latest[str(doc["k"])] = doc["s"]
        except (ValueError, KeyError, TypeError) as exc:
            log.error("skipping the %s record at %d: %s", self.topic, m.phys_offset, exc)

    def record(self, key: str, state: Any) -> Message:
        body = json.dumps({"k": key, "s": state}, separators=(",", ":")).encode()
        return Message(self.topic, 0, body, flags=FLAG_RMQ_STATE)


class Scheduled:
    """Delayed and half messages of one broker (master only: every call writes)."""

    def __init__(self, replica: Replica, on_check: CheckSender) -> None:
        self.replica = replica
        self.cfg = replica.cfg
        self.on_check = on_check
        self.policy = tx.Policy(self.cfg.rocketmq_tx_check_interval_ms, self.cfg.rocketmq_tx_max_checks)
        self.delay_progress = LatestStates(replica.log, DELAY_PROGRESS_TOPIC)
        self.tx_states = LatestStates(replica.log, HALF_STATE_TOPIC)
        self._delay_lock = asyncio.Lock()
        self._tx_lock = asyncio.Lock()
        # on a replica that is not master: the checks of each open transaction relayed so far
        self._relayed: dict[int, int] = {}
        # copies found by the look-back of this master term, per target queue
        self._origins: dict[tuple[str, int], set[str]] = {}
        # per bucket: the range last looked at and when its first message is due, so an idle
        # bucket is not read again before then (or before a message is added)
        self._idle: dict[int, tuple[tuple[int, int], int | None]] = {}
        self._term = -1
        self._rr = 0
        life = self.policy.check_interval_ms * (self.policy.max_checks + 1)
        if self.cfg.retention_ms and life >= self.cfg.retention_ms:
            log.warning(
                "broker set %s: a half message may wait %d ms for its checks, retention_ms is %d: "
                "retention may delete it before it ends (lower rocketmq_tx_check_interval_ms)",
                self.cfg.broker_set,
                life,
                self.cfg.retention_ms,
            )

    def max_delay_ms(self) -> int:
        """The longest delay served: the configured bound, and less than retention_ms, so a
        waiting message is never deleted by the age limit."""
        bound = self.cfg.rocketmq_max_delay_ms
        if self.cfg.retention_ms > 0:
            bound = min(bound, self.cfg.retention_ms - 60_000)
        return max(0, bound)

    # --- storing ---

    def _target_queue(self, topic: str, key: str | None) -> int:
        """A queue of `topic` in this broker set (the key's, as tidelog's producer chooses)."""
        self.replica.require_writable()
        queues = self.replica.topics.get(topic, 0)
        if queues <= 0:
            raise UnavailableError(
                f"topic {topic} has no queue in broker set {self.cfg.broker_set}",
                hint="send to the endpoint of a master that serves the topic (its route names it)",
            )
        if key:
            queue = crc32c(key.encode()) % queues
        else:
            self._rr += 1
            queue = self._rr % queues
        self.replica.queue_offsets(topic, queue)  # served here now (its generation marker)
        return queue

    async def store_delayed(
        self, topic: str, body: bytes, stored: rules.Stored, deliver_at_ms: int, born_ts: int
    ) -> tuple[str, int, str]:
        """Keep a delayed message until `deliver_at_ms`; (its message id, offset in `%DELAY%`,
        the recall handle that drops it before then)."""
        wait = dr.delay_ms(deliver_at_ms, _now_ms(), self.max_delay_ms())
        queue = self._target_queue(topic, stored.key)
        props = {
            **stored.properties,
            rules.PROP_TARGET_TOPIC: topic,
            rules.PROP_TARGET_QUEUE: str(queue),
            rules.PROP_DELIVER_AT: str(deliver_at_ms),
        }
        b = dr.bucket(wait)
        msg = Message(DELAY_TOPIC, b, body, stored.key, stored.tags, props, born_ts=born_ts)
        (placed,) = await self.replica.write([msg])
        log.info(
            "broker set %s: delayed message for %s/%d kept at %s/%d offset %d until %d",
            self.cfg.broker_set,
            topic,
            queue,
            DELAY_TOPIC,
            b,
            placed.queue_offset,
            deliver_at_ms,
        )
        handle = rules.encode_recall_handle(self.cfg.broker_set, b, placed.queue_offset)
        return self._id(placed.phys_offset), placed.queue_offset, handle

    async def store_half(
        self, topic: str, body: bytes, stored: rules.Stored, born_ts: int
    ) -> tuple[str, str, int]:
        """Keep a half message; (its message id, its transaction id, its offset in `%HALF%`)."""
        queue = self._target_queue(topic, stored.key)
        async with self._tx_lock:
            st = self._tx_state()
            waiting = len(st.open) + self.replica.log.queue_offsets(HALF_TOPIC, 0).max - st.next
        if waiting >= MAX_OPEN:
            raise UnavailableError(
                f"{waiting} transactions are open in broker set {self.cfg.broker_set}: at most {MAX_OPEN}",
                rocketmq="TOO_MANY_REQUESTS",
            )
        props = {**stored.properties, rules.PROP_TARGET_TOPIC: topic, rules.PROP_TARGET_QUEUE: str(queue)}
        msg = Message(HALF_TOPIC, 0, body, stored.key, stored.tags, props, born_ts=born_ts)
        (placed,) = await self.replica.write([msg])
        txid = rules.encode_transaction_id(self.cfg.broker_set, placed.queue_offset)
        log.info("broker set %s: half message %s for %s/%d kept", self.cfg.broker_set, txid, topic, queue)
        return self._id(placed.phys_offset), txid, placed.queue_offset

    def _id(self, phys_offset: int) -> str:
        return f"{self.cfg.broker_set}:{phys_offset:x}"

    # --- recalling a delayed message ---

    async def recall(self, topic: str, handle: rules.RecallHandle) -> str:
        """RecallMessage: the delayed message of `handle` (one of `topic`) is never delivered; its
        message id. It is marked moved in its bucket's progress, without a copy, under the lock
        the mover holds: either the recall or the move comes first, never both. Once delivered
        (or recalled) it is refused with RocketMQ's answer to a late recall (`_not_recalled`) and
        nothing changes (not MESSAGE_NOT_FOUND, which the Python client takes for success: it
        answers an empty receive)."""
        if handle.broker_set != self.cfg.broker_set or not 0 <= handle.bucket < dr.BUCKETS:
            raise InvalidArgumentError(
                f"recall handle of broker set {handle.broker_set}, bucket {handle.bucket}: not one "
                f"broker set {self.cfg.broker_set} gave",
                rocketmq="BAD_REQUEST",
            )
        self.replica.require_writable()
        b, offset = handle.bucket, handle.offset
        async with self._delay_lock:
            self._new_term()
            got = self.replica.log.read(DELAY_TOPIC, b, offset, 1)
            kept = got[0] if got and got[0].queue_offset == offset else None
            if kept is None:
                raise _not_recalled(
                    f"no delayed message at {DELAY_TOPIC}/{b}/{offset} (delivered and deleted?)"
                )
            if kept.properties.get(rules.PROP_TARGET_TOPIC) != topic:
                raise InvalidArgumentError(
                    f"the recall handle names a message of another topic than {topic}", rocketmq="BAD_REQUEST"
                )
            doc = self.delay_progress.refresh().get(str(b))
            p = dr.Progress() if doc is None else dr.decode(doc)
            dr.trim(p, self.replica.log.queue_offsets(DELAY_TOPIC, b).min)
            if offset < p.floor or offset in p.done:
                raise _not_recalled(
                    f"the delayed message {self._id(kept.phys_offset)} was delivered (or recalled) "
                    "already: a recall must come before its delivery time"
                )
            dr.mark(p, [offset])
            await self.replica.write([self.delay_progress.record(str(b), dr.encode(p))])
            self._idle.pop(b, None)
        log.info(
            "broker set %s: delayed message %s/%d/%d recalled", self.cfg.broker_set, DELAY_TOPIC, b, offset
        )
        return self._id(kept.phys_offset)

    # --- ending a transaction ---

    async def end(self, topic: str, transaction_id: str, commit: bool) -> None:
        """EndTransaction: COMMIT moves the half message into its topic, ROLLBACK drops it.
        INVALID_TRANSACTION_ID for an id that names no open transaction of `topic` here."""
        parsed = rules.decode_transaction_id(transaction_id)
        if parsed is None:
            raise _invalid(f"{transaction_id[:100]!r} is not a transaction id this cluster gave")
        broker_set, offset = parsed
        if broker_set != self.cfg.broker_set:
            raise _invalid(
                f"transaction {transaction_id} belongs to broker set {broker_set}, not {self.cfg.broker_set}"
            )
        self.replica.require_writable()
        async with self._tx_lock:
            self._new_term()
            st = self._tx_state()
            added = self._add_halves(st, until=offset)
            half = self._half(offset) if offset < st.next else None
            if half is not None and half.properties.get(rules.PROP_TARGET_TOPIC) != topic:
                raise _invalid(f"transaction {transaction_id} is not one of topic {topic}")
            actions = tx.step(st, tx.End(offset, commit), _now_ms(), self.policy)
            refused = [a for a in actions if isinstance(a, tx.Refuse)]
            if refused:
                if added:  # what was seen is stored anyway: the next decision starts from it
                    await self.replica.write([self.tx_states.record("tx", tx.encode(st))])
                why = "was never sent" if refused[0].why == "unknown" else "has ended already"
                raise _invalid(f"transaction {transaction_id} {why}")
            copies = self._copies([half]) if commit and half is not None else []
            await self.replica.write([*copies, self.tx_states.record("tx", tx.encode(st))])
        log.info(
            "broker set %s: transaction %s of %s %s",
            self.cfg.broker_set,
            transaction_id,
            topic,
            "committed" if commit else "rolled back",
        )

    def _tx_state(self) -> tx.TxState:
        doc = self.tx_states.refresh().get("tx")
        st = tx.TxState() if doc is None else tx.decode(doc)
        tx.trim(st, self.replica.log.queue_offsets(HALF_TOPIC, 0).min)
        return st

    def _add_halves(self, st: tx.TxState, until: int | None = None) -> bool:
        """Add the half messages from `st.next` (up to `until`); whether any was. Those not
        confirmed yet too: a producer may have its receipt before every replica holds the half
        message (adaptive acks), and a state record written after it goes if it goes."""
        added = False
        for m in self.replica.log.tail(HALF_TOPIC, 0, st.next):
            if until is not None and m.queue_offset > until:
                break
            tx.step(st, tx.Added(m.queue_offset, m.store_ts), _now_ms(), self.policy)
            added = True
        return added

    def _half(self, offset: int) -> StoredMessage | None:
        got = self.replica.log.read(HALF_TOPIC, 0, offset, 1)
        return got[0] if got and got[0].queue_offset == offset else None

    # --- moving ---

    def _copies(self, kept: Iterable[StoredMessage]) -> list[Message]:
        """The copies of `kept` (delayed or half messages) for their topics, without those a
        predecessor made already; messages whose topic is gone are dropped (logged)."""
        out = []
        for m in kept:
            p = dict(m.properties)
            topic = p.pop(rules.PROP_TARGET_TOPIC, "")
            queue = int(p.pop(rules.PROP_TARGET_QUEUE, "0"))
            origin = f"{m.topic}/{m.queue_id}/{m.queue_offset}"
            try:
                self.replica.queue_offsets(topic, queue)
            except (InvalidArgumentError, TopicNotFoundError) as exc:
                log.warning("broker set %s: %s is dropped: %s", self.cfg.broker_set, origin, exc)
                continue
            if origin in self._copied(topic, queue):
                log.info("broker set %s: %s is in %s/%d already", self.cfg.broker_set, origin, topic, queue)
                continue
            p[rules.PROP_ORIGIN] = origin
            p[rules.PROP_ORIGIN_ID] = self._id(m.phys_offset)
            out.append(Message(topic, queue, m.body, m.key, m.tags, p, born_ts=m.born_ts))
        return out

    def _new_term(self) -> None:
        """A new master term folds its states again from its log (which fork repair may have
        cut and refilled since it last read it) and looks back afresh before it copies."""
        if self._term != self.replica.master_epoch:
            self._term = self.replica.master_epoch
            self._origins.clear()
            self._idle.clear()
            self.delay_progress.reset()
            self.tx_states.reset()

    def _copied(self, topic: str, queue: int) -> set[str]:
        """Origins of the copies among the last LOOKBACK records of `topic`/`queue` when this
        master term first copied into it (later copies of the term are in its states)."""
        found = self._origins.get((topic, queue))
        if found is None:
            end = self.replica.log.queue_offsets(topic, queue).max
            found = {
                m.properties[rules.PROP_ORIGIN]
                for m in self.replica.log.tail(topic, queue, max(0, end - LOOKBACK))
                if rules.PROP_ORIGIN in m.properties
            }
            self._origins[(topic, queue)] = found
        return found

    async def move_due(self) -> int:
        """Move the due delayed messages of every bucket into their topics; how many moved."""
        moved = 0
        async with self._delay_lock:
            self._new_term()
            for b in range(dr.BUCKETS):
                moved += await self._move_bucket(b)
        return moved

    async def _move_bucket(self, b: int) -> int:
        offsets = self.replica.log.queue_offsets(DELAY_TOPIC, b)
        if offsets.max == 0:
            return 0
        doc = self.delay_progress.refresh().get(str(b))
        p = dr.Progress() if doc is None else dr.decode(doc)
        dr.trim(p, offsets.min)
        first, last = dr.scan_range(p, offsets.min, offsets.confirmed)
        if first >= last:
            return 0
        idle = self._idle.get(b)
        now = _now_ms()
        if idle is not None and idle[0] == (first, last) and (idle[1] is None or idle[1] > now):
            return 0
        kept: dict[int, StoredMessage] = {}
        for m in self.replica.log.tail(DELAY_TOPIC, b, first, confirmed_only=True):
            if m.queue_offset >= last:
                break
            kept[m.queue_offset] = m
        times = [(off, int(m.properties.get(rules.PROP_DELIVER_AT, "0"))) for off, m in kept.items()]
        due = dr.due(p, times, now)[:MOVE_BATCH]
        if not due:
            self._idle[b] = ((first, last), dr.next_due(p, times))
            return 0
        copies = self._copies(kept[off] for off in due)
        dr.mark(p, due)
        await self.replica.write([*copies, self.delay_progress.record(str(b), dr.encode(p))])
        for c in copies:
            log.info(
                "broker set %s: delayed message %s moved to %s/%d",
                self.cfg.broker_set,
                (c.properties or {}).get(rules.PROP_ORIGIN),
                c.topic,
                c.queue_id,
            )
        return len(due)

    async def check_orphans(self) -> None:
        """Add new half messages, send the checks that are due, roll back those out of checks."""
        async with self._tx_lock:
            self._new_term()
            st = self._tx_state()
            added = self._add_halves(st)
            if not added and (tx.next_check(st) or 1 << 62) > _now_ms():
                return
            actions = tx.step(st, tx.Tick(), _now_ms(), self.policy)
            await self.replica.write([self.tx_states.record("tx", tx.encode(st))])
        for a in actions:
            about = self._transaction(a.offset)
            if about is None:
                continue
            half, topic, txid = about
            if isinstance(a, tx.Drop):
                log.warning(
                    "broker set %s: transaction %s of %s rolled back after %d checks without an answer",
                    self.cfg.broker_set,
                    txid,
                    topic,
                    self.policy.max_checks,
                )
            elif isinstance(a, tx.Check):
                log.info(
                    "broker set %s: checking transaction %s of %s (check %d)",
                    self.cfg.broker_set,
                    txid,
                    topic,
                    a.attempt,
                )
                self.on_check(topic, half, txid)

    def relay_checks(self) -> None:
        """On a replica that is not master: pass on the checks its master made to the producers
        connected to this broker's endpoint (a route names every replica's endpoint, so a
        producer's Telemetry stream may be here rather than on the master's). A check shows in the
        replicated state as an open transaction's count of checks going up; the producer's answer
        comes back through this endpoint, which passes the EndTransaction on to the master. A check
        sent twice (here and by the master to a producer there) is answered twice: the second end
        is refused and changes nothing."""
        st = self._tx_state()
        self._relayed = {off: n for off, n in self._relayed.items() if off in st.open}
        for off, o in st.open.items():
            if o.checks <= self._relayed.get(off, 0):
                continue
            self._relayed[off] = o.checks
            about = self._transaction(off)
            if about is not None:
                half, topic, txid = about
                self.on_check(topic, half, txid)

    def _transaction(self, offset: int) -> tuple[StoredMessage, str, str] | None:
        """The half message at `offset` of `%HALF%`, its topic and its transaction id (None: gone)."""
        half = self._half(offset)
        if half is None:
            return None
        topic = half.properties.get(rules.PROP_TARGET_TOPIC, "")
        return half, topic, rules.encode_transaction_id(self.cfg.broker_set, offset)

    # --- the master's loop ---

    def _is_master(self) -> bool:
        return self.replica.role == MASTER and self.replica.ha_master is not None

    async def run(self) -> None:
        """While this broker is master: move due messages and check orphans, every TICK_S; while it
        is not, relay its master's checks to the producers connected here."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                if not self._is_master():
                    self.relay_checks()
                    continue
                self._relayed.clear()
                await self.move_due()
                await self.check_orphans()
            except (NotMasterError, UnavailableError) as exc:
                log.debug("broker set %s: scheduled messages wait: %s", self.cfg.broker_set, exc)
            except TidelogError as exc:
                log.warning("broker set %s: scheduled messages: %s", self.cfg.broker_set, exc)
            except Exception as exc:
                # the loop must outlive a bad record (logged, looked at again next tick), but
                # not a broken invariant
                stop_if_violated(exc)
                log.exception("broker set %s: scheduled messages failed", self.cfg.broker_set)
                await asyncio.sleep(1.0)


def _not_recalled(message: str) -> InvalidArgumentError:
    """A recall that came after its message's delivery time: refused as RocketMQ refuses it. Its
    broker answers ILLEGAL_OPERATION "recall failed, timestamp invalid", which its proxy's
    ResponseBuilder (mapping only a few remoting codes) turns into INTERNAL_SERVER_ERROR: the code
    and the words the official clients meet there, meet here too."""
    return InvalidArgumentError(
        f"recall failed, timestamp invalid: {message}", rocketmq="INTERNAL_SERVER_ERROR"
    )


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, rocketmq="INVALID_TRANSACTION_ID")


def _now_ms() -> int:
    return int(time.time() * 1000)
