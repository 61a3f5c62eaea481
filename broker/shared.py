"""Shared subscriptions on the broker: receive with an invisible time, acknowledge each message,
change the invisible time, move dead messages to the group's dead-letter topic.

The rules are broker/sharedstate.py's (pure); this module stores and serves them. The state of
each (group, topic, queue) is a record of the reserved topic `%SHARED%` (queue 0), written whole
after every change through the master's one write path, so it is acknowledged under the same
replication rules as messages and a new master resumes from the last confirmed record: an
acknowledgement that was answered is never undone by a failover, and a lease given by a master
that died before its record was confirmed is simply given again (at-least-once).

Dead letters: a message delivered `max_attempts` times is copied, by the receive that finds its
last lease expired, to the topic `%DLQ%<group>` (queue 0 of the same broker set), with properties
naming where it came from; the copies and the state that finishes them are one write. A master
that died between the two leaves copies without a state: its successor, before it copies a
message, looks for that message's copy among the last `DLQ_SCAN` records of the dead-letter queue,
so a message lands there once.

A consumer may also give up on a message it holds (`dead_letter`, RocketMQ's
ForwardMessageToDeadLetterQueue): the same copy and state, one write, at once.

Calls on one (group, topic, queue) are serialized (a lock; a long poll waits outside it), and each
starts from the state the previous one wrote: two receives never hand out the same lease.

A receive may name every queue of the topic on this broker set at once (`receive_any`, queue
ANY_QUEUE on the wire), as RocketMQ's pop with queue id -1 does: it takes from the queues in turn,
starting one queue further on at each call of the (group, topic) so that a queue with a backlog
does not keep the others waiting, and its long poll wakes on the first message in any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from tidelog.broker import sharedstate as ss
from tidelog.broker.fold import TopicFold
from tidelog.client.modes import (
    DELIVERY_ATTEMPTS,
    MAX_ATTEMPTS,
    MAX_INVISIBLE_MS,
    MAX_RECEIVE,
    ORIGIN_MESSAGE_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    dlq_topic,
)
from tidelog.commitlog import CommitLog, Message, StoredMessage
from tidelog.commitlog.crc import crc32c
from tidelog.errors import (
    InvalidArgumentError,
    TidelogError,
    TopicNotFoundError,
    UnavailableError,
)

if TYPE_CHECKING:
    from tidelog.broker.ports import SharedHost

log = logging.getLogger(__name__)

SHARED_TOPIC = "%SHARED%"
FLAG_SHARED = 8
#: How far back in the dead-letter queue a master looks for a copy its predecessor made.
DLQ_SCAN = 1000
#: Bounds of one receive.

Key = tuple[str, str, int]  # (group, topic, queue)
#: What a receive hands out: (the stored records, their count, receipts, delivery counts).
Received = tuple[bytes, int, list[str], list[int]]


def state_message(key: Key, st: ss.SharedQueue) -> Message:
    """A whole state: written by receives and invisible-time changes."""
    group, topic, queue = key
    doc = {"g": group, "t": topic, "q": queue, "st": ss.encode(st)}
    return Message(SHARED_TOPIC, 0, json.dumps(doc, separators=(",", ":")).encode(), flags=FLAG_SHARED)


def ack_message(key: Key, offsets: list[int]) -> Message:
    """Acknowledged offsets, finished on the state before it: an acknowledgement writes only
    these, not the whole state (acks come one message at a time)."""
    group, topic, queue = key
    doc = {"g": group, "t": topic, "q": queue, "a": offsets}
    return Message(SHARED_TOPIC, 0, json.dumps(doc, separators=(",", ":")).encode(), flags=FLAG_SHARED)


def parse_record(body: bytes) -> tuple[Key, ss.SharedQueue | None, list[int]]:
    """A `%SHARED%` record: its key, and its whole state or the offsets it acknowledges;
    ValueError if it is not one."""
    try:
        doc = json.loads(body)
        key = (str(doc["g"]), str(doc["t"]), int(doc["q"]))
        if "st" in doc:
            return key, ss.decode(doc["st"]), []
        return key, None, [int(o) for o in doc["a"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a shared-subscription record: {exc}") from None


class SharedStates:
    """The state per (group, topic, queue), folded from `%SHARED%`: the latest whole state, and
    the acknowledgements after it.

    The master's fold reads its whole local log, confirmed or not: a master's log is the set's
    history (what it appended and has not had confirmed yet is what it answers next), and the next
    decision must start from the last one written, even while that record waits for its
    acknowledgements. Retention's fold (`confirmed_only`, broker/compaction.py) reads what is
    confirmed, and gives each state as one whole record to carry forward. A truncation (fork
    repair, when this broker was a master no more) folds again."""

    def __init__(self, commitlog: CommitLog, *, confirmed_only: bool = False) -> None:
        self._log = commitlog
        # the state, and the physical offset of the whole-state record it was folded from
        self._states: dict[Key, tuple[ss.SharedQueue, int]] = {}
        self._fold = TopicFold(
            commitlog, SHARED_TOPIC, self._apply, self._states.clear, confirmed_only=confirmed_only
        )

    def reset(self) -> None:
        self._fold.reset()

    def refresh(self) -> None:
        self._fold.refresh()

    def _apply(self, m: StoredMessage) -> None:
        try:
            key, whole, acked = parse_record(m.body)
        except ValueError as exc:
            log.error("skipping the %s record at %d: %s", SHARED_TOPIC, m.phys_offset, exc)
            return
        if whole is not None:
            self._states[key] = (whole, m.phys_offset)
        elif key in self._states:
            st = self._states[key][0]
            for off in acked:
                ss.finish(st, off)

    def get(self, key: Key, since: int = -1) -> ss.SharedQueue | None:
        """A copy of the state of `key` whose whole-state record was written at or after the
        physical offset `since` (the topic's latest generation marker: a state from before it
        belongs to a deleted topic of that name); None: the group never received from this queue
        of this topic."""
        self.refresh()
        found = self._states.get(key)
        return None if found is None or found[1] < since else found[0].copy()

    def whole(self) -> list[tuple[Key, int, bytes]]:
        """Every state as (key, the physical offset its fold starts at, one whole-state record's
        body): what retention carries forward."""
        self.refresh()
        return [(key, at, state_message(key, st).body) for key, (st, at) in self._states.items()]

    def pending(self) -> set[Key]:
        """Keys with a record not confirmed yet."""
        keys = set()
        for m in self._log.tail(SHARED_TOPIC, 0, self._fold.applied):
            with contextlib.suppress(ValueError):
                keys.add(parse_record(m.body)[0])
        return keys


class SharedSubscriptions:
    """The shared-mode calls of one broker (master only: every call writes the state)."""

    def __init__(self, replica: SharedHost) -> None:
        self.replica = replica
        self.states = SharedStates(replica.log)
        self._locks: dict[Key, asyncio.Lock] = {}
        self._acks: dict[Key, list[tuple[list[str], asyncio.Future[None]]]] = {}  # waiting for the lock
        # Lease numbers of this master term start above any an earlier master gave: a lease it gave
        # whose record was lost with it must not share a receipt with one given now.
        self._term: tuple[int, int] = (-1, 0)  # (master epoch, the term's first lease number)
        # (group, topic) -> the queue the next receive_any starts at
        self._turns: dict[tuple[str, str], int] = {}

    def _lock(self, key: Key) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _state(self, key: Key, start_latest: bool) -> ss.SharedQueue:
        """The state to change: the confirmed one, trimmed to retention, or a new one."""
        offsets = self.replica.queue_offsets(key[1], key[2])
        marks = self.replica.topic_table.marks
        marks.refresh()
        st = self.states.get(key, since=marks.marked_at(key[1]))
        if st is None:
            st = ss.start(offsets.confirmed if start_latest else offsets.min)
        ss.trim(st, offsets.min)
        epoch = self.replica.master_epoch
        if self._term[0] != epoch:
            self._term = (epoch, _now_ms() << 8)
        st.seq = max(st.seq, self._term[1])
        return st

    async def receive(
        self,
        key: Key,
        *,
        max_messages: int,
        invisible_ms: int,
        max_attempts: int,
        start_latest: bool,
        wait_ms: int,
        key_ordered: bool = False,
    ) -> tuple[bytes, int, list[str], list[int]]:
        """Up to `max_messages` messages: (their stored records, count, receipts, delivery counts);
        waits up to `wait_ms` for one."""
        _check_key(key)
        _check_receive(max_messages, invisible_ms, max_attempts, wait_ms)
        self.replica.queue_offsets(key[1], key[2])  # the queue exists here
        self.replica.require_master()
        return await self._until_received(
            lambda: self._receive_now(
                key, max_messages, invisible_ms, max_attempts, start_latest, key_ordered
            ),
            wait_ms,
        )

    async def _until_received(
        self, attempt: Callable[[], Awaitable[tuple[Received | None, int | None]]], wait_ms: int
    ) -> Received:
        """`attempt()` until it hands something out or `wait_ms` passes (then nothing)."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            got, due = await attempt()
            if got is not None:
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"", 0, [], []
            if due is not None:
                remaining = min(remaining, max(0.001, (due - _now_ms()) / 1000))
            # look again when the confirm offset moves (new messages in any queue of the set, or a
            # state record: an invisible time shortened, a message given back) or when the
            # earliest lease ends
            await self.replica.long_poll(_until_woken(), int(remaining * 1000) or 1)

    async def receive_any(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int,
        invisible_ms: int,
        max_attempts: int,
        start_latest: bool,
        wait_ms: int,
        key_ordered: bool = False,
    ) -> tuple[bytes, int, list[str], list[int]]:
        """`receive` over every queue of `topic` here: up to `max_messages` from the queues in turn
        (each record names its queue), the first queue one further on at each call of the group;
        waits up to `wait_ms` for a message in any of them."""
        _check_key((group, topic, 0))
        _check_receive(max_messages, invisible_ms, max_attempts, wait_ms)
        self.replica.queue_offsets(topic, 0)  # the topic is served here
        self.replica.require_master()

        async def every_queue() -> tuple[Received | None, int | None]:
            queues = max(1, self.replica.topics.get(topic, 0))
            first = self._turns.get((group, topic), 0) % queues
            self._turns[(group, topic)] = first + 1
            parts: list[Received] = []
            count, due = 0, None
            for i in range(queues):
                key = (group, topic, (first + i) % queues)
                got, next_due = await self._receive_now(
                    key, max_messages - count, invisible_ms, max_attempts, start_latest, key_ordered
                )
                if got is not None:
                    parts.append(got)
                    count += got[1]
                    if count >= max_messages:
                        break
                elif next_due is not None:
                    due = next_due if due is None else min(due, next_due)
            if not parts:
                return None, due
            joined = b"".join(p[0] for p in parts)
            return (joined, count, [r for p in parts for r in p[2]], [a for p in parts for a in p[3]]), due

        return await self._until_received(every_queue, wait_ms)

    async def _receive_now(
        self,
        key: Key,
        max_messages: int,
        invisible_ms: int,
        max_attempts: int,
        start_latest: bool,
        key_ordered: bool,
    ) -> tuple[tuple[bytes, int, list[str], list[int]] | None, int | None]:
        """(what a receive hands out now, or None and when to look again)."""
        group, topic, queue = key
        r = self.replica
        async with self._lock(key):
            now = _now_ms()
            st = self._state(key, start_latest)
            confirmed = r.queue_offsets(topic, queue).confirmed
            if not ss.deliverable(st, now, confirmed, ss.DEFAULT_WINDOW):
                return None, ss.next_visible(st)
            before = st.next
            got = ss.receive(
                st,
                now,
                confirmed,
                max_messages,
                invisible_ms,
                max_attempts,
                dead_letters=self._serves(dlq_topic(group)),
                keys=self._keys(st, topic, queue, confirmed, max_messages) if key_ordered else None,
            )
            if not got.deliveries and not got.dead and st.next == before:
                # only messages waiting for their key or for the dead-letter topic: look again soon
                return None, _now_ms() + 200
            copies = self._dead_letters(key, got.dead)
            await r.write([*copies, state_message(key, st)])
            if got.dead:
                log.info(
                    "group %s: %d message(s) of %s/%d moved to %s after %d deliveries",
                    group,
                    len(got.dead),
                    topic,
                    queue,
                    dlq_topic(group),
                    max_attempts,
                )
            if not got.deliveries:
                return None, _now_ms()  # only dead letters moved, or messages skipped: look again
            data, count = self._records(topic, queue, [d.offset for d in got.deliveries])
            return (
                data,
                count,
                [d.receipt for d in got.deliveries],
                [d.attempts for d in got.deliveries],
            ), None

    def _keys(
        self, st: ss.SharedQueue, topic: str, queue: int, confirmed: int, max_messages: int
    ) -> dict[int, int | None]:
        """Key order: the key (CRC32C of it; None: keyless) of the next new offsets a receive may
        hand out, a few times `max_messages` of them (those it skips are remembered)."""
        end = min(confirmed, st.floor + ss.DEFAULT_WINDOW, st.next + 4 * max_messages + 16)
        out: dict[int, int | None] = {}
        off = st.next
        while off < end:
            msgs = self.replica.log.read(topic, queue, off, end - off)
            if not msgs:
                break
            for m in msgs:
                out[m.queue_offset] = crc32c(m.key.encode()) if m.key else None
            off = msgs[-1].queue_offset + 1
        return out

    async def ack(self, key: Key, receipts: list[str]) -> None:
        """Finish every message of `receipts`; none is finished if one of them is invalid.

        Acknowledgements of one queue that arrive while another is being written wait for the
        lock together, and the first of them to get it writes them all in one record: members
        (and RocketMQ clients) acknowledging one message per call share the replicated write."""
        _check_key(key)
        _check_receipts(receipts)
        waiting = self._acks.setdefault(key, [])
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append((receipts, mine))
        async with self._lock(key):
            if self._acks.get(key) is waiting:
                del self._acks[key]
                await self._write_acks(key, waiting)
        await mine

    async def _write_acks(self, key: Key, calls: list[tuple[list[str], asyncio.Future[None]]]) -> None:
        """One record for the acknowledgements of `calls`; each call is all or nothing."""
        st = self._state(key, False)
        done: list[int] = []
        taken = []
        for receipts, fut in calls:
            trial = st.copy()
            try:
                offsets = [ss.ack(trial, text) for text in receipts]
            except TidelogError as exc:  # this call's receipts: the others go on
                fut.set_exception(exc)
                continue
            st = trial
            done += offsets
            taken.append(fut)
        if not done:
            return
        # The write goes on if the call that carries it is cancelled (its client went away): the
        # other calls in it still get their answer.
        write = asyncio.ensure_future(self.replica.write([ack_message(key, done)]))

        def settle(w: asyncio.Future[Any]) -> None:
            error = None if w.cancelled() else w.exception()
            for fut in taken:
                if fut.done():
                    continue
                if w.cancelled():
                    fut.cancel()
                elif error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(None)

        write.add_done_callback(settle)
        await asyncio.shield(write)

    async def change_invisible(self, key: Key, receipts: list[str], invisible_ms: int) -> list[str]:
        """Each message of `receipts` stays invisible `invisible_ms` from now (0: visible again now,
        a nack); returns their new receipts. None changes if one receipt is invalid."""
        _check_key(key)
        _check_receipts(receipts)
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvalidArgumentError(f"the invisible duration must be in [0, {MAX_INVISIBLE_MS}] ms")
        async with self._lock(key):
            st = self._state(key, False)
            now = _now_ms()
            out = [ss.change_invisible(st, text, now, invisible_ms).receipt for text in receipts]
            await self.replica.write([state_message(key, st)])
        return out

    async def dead_letter(self, key: Key, receipt: str) -> None:
        """Move the leased message of `receipt` to the group's dead-letter topic now (a consumer
        gives up on it): its copy and the state that finishes it are one write, as for a message
        out of attempts. UnavailableError while this broker does not serve that topic yet."""
        _check_key(key)
        _check_receipts([receipt])
        dlq = dlq_topic(key[0])
        if not self._serves(dlq):
            raise UnavailableError(
                f"topic {dlq} is not served by this broker yet",
                hint="create it (one queue), or retry once this broker has learned of it",
            )
        attempts = ss.parse_receipt(receipt)[1]
        async with self._lock(key):
            st = self._state(key, False)
            off = ss.ack(st, receipt)  # checks that the receipt is the current lease
            await self.replica.write([*self._dead_letters(key, [(off, attempts)]), state_message(key, st)])
        log.info("group %s: message %d of %s/%d moved to %s on request", key[0], off, key[1], key[2], dlq)

    def _serves(self, topic: str) -> bool:
        """Whether this broker serves `topic` now. A dead-letter copy written before the broker
        learned of its topic would land before the topic's generation marker: lost to readers."""
        try:
            self.replica.queue_offsets(topic, 0)
        except (InvalidArgumentError, TopicNotFoundError):
            return False
        return True

    def _records(self, topic: str, queue: int, offsets: list[int]) -> tuple[bytes, int]:
        """The stored bytes of the records at `offsets` (ascending), in that order."""
        parts: list[bytes] = []
        count = 0
        for first, n in _runs(offsets):
            off = first
            while off < first + n:
                data, got = self.replica.log.read_encoded(topic, queue, off, first + n - off, 64 << 20)
                if got == 0:
                    raise InvalidArgumentError(f"offset {off} of {topic}/{queue} is not readable now")
                parts.append(data)
                count += got
                off += got
        return b"".join(parts), count

    def _dead_letters(self, key: Key, dead: list[tuple[int, int]]) -> list[Message]:
        """Copies of the dead messages for the dead-letter topic, without those already there."""
        if not dead:
            return []
        group, topic, queue = key
        dlq = dlq_topic(group)
        there = set(self._copied(dlq, topic, queue))
        out = []
        for off, attempts in dead:
            if off in there:
                continue
            m = self.replica.log.read(topic, queue, off, 1)[0]
            props = dict(m.properties)
            props.update(
                {
                    ORIGIN_TOPIC: topic,
                    ORIGIN_QUEUE: str(queue),
                    ORIGIN_OFFSET: str(off),
                    ORIGIN_MESSAGE_ID: f"{self.replica.cfg.broker_set}:{m.phys_offset:x}",
                    DELIVERY_ATTEMPTS: str(attempts),
                }
            )
            out.append(Message(dlq, 0, m.body, m.key, m.tags, props, born_ts=m.born_ts))
        return out

    def _copied(self, dlq: str, topic: str, queue: int) -> Iterator[int]:
        """Origin offsets of `topic`/`queue` among the last DLQ_SCAN records of the dead-letter queue."""
        end = self.replica.log.queue_offsets(dlq, 0).max
        m: StoredMessage
        for m in self.replica.log.tail(dlq, 0, max(0, end - DLQ_SCAN)):
            p = m.properties
            if p.get(ORIGIN_TOPIC) == topic and p.get(ORIGIN_QUEUE) == str(queue):
                origin = p.get(ORIGIN_OFFSET, "")
                if origin.isdigit():
                    yield int(origin)


def _runs(offsets: list[int]) -> Iterator[tuple[int, int]]:
    """(first, count) of each run of consecutive offsets."""
    i = 0
    while i < len(offsets):
        j = i + 1
        while j < len(offsets) and offsets[j] == offsets[j - 1] + 1:
            j += 1
        yield offsets[i], j - i
        i = j


def _check_key(key: Key) -> None:
    group, topic, queue = key
    if not group or len(group) > 255 or "/" in group or "@" in group:
        raise InvalidArgumentError("group must be 1-255 characters without '/' or '@'")
    if not topic:
        raise InvalidArgumentError("topic must not be empty")
    if queue < 0:
        raise InvalidArgumentError("queue must not be negative")


def _until_woken() -> Callable[[], tuple[None, bool]]:
    """A long-poll condition met at the first wake-up: `long_poll` calls it once before it waits
    (not met), then once per wake-up."""
    calls = 0

    def woken() -> tuple[None, bool]:
        nonlocal calls
        calls += 1
        return None, calls > 1

    return woken


def _check_receive(max_messages: int, invisible_ms: int, max_attempts: int, wait_ms: int) -> None:
    if not 1 <= max_messages <= MAX_RECEIVE:
        raise InvalidArgumentError(f"max_messages must be in [1, {MAX_RECEIVE}]")
    if not 0 < invisible_ms <= MAX_INVISIBLE_MS:
        raise InvalidArgumentError(f"the invisible duration must be in (0, {MAX_INVISIBLE_MS}] ms")
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgumentError(f"max_attempts must be in [1, {MAX_ATTEMPTS}]")
    if wait_ms < 0:
        raise InvalidArgumentError("wait_ms must not be negative")


def _check_receipts(receipts: list[str]) -> None:
    if not 1 <= len(receipts) <= MAX_RECEIVE:
        raise InvalidArgumentError(f"name 1 to {MAX_RECEIVE} receipts")
    if len(set(receipts)) != len(receipts):
        raise InvalidArgumentError("a receipt is named twice")


def _now_ms() -> int:
    return int(time.time() * 1000)
