"""Finding one message: by queue offset, by physical offset (a message id), by key; and the
indexer that keeps the key index (`commitlog/keyindex.py`) caught up with the log.

Every lookup returns the stored bytes of whole, CRC-checked user messages that end at or below
the confirm offset, as reads by queue offset do (docs/ARCHITECTURE.md §3.3).

A physical offset from outside (a message id) is trusted only once the consume queue agrees: the
header there must name a user message of (topic, queue, queue offset) whose consume-queue unit
points back at exactly that offset. Bytes inside a message's body can look like a record; a unit
cannot point into a body, so a forged offset is answered MESSAGE_NOT_FOUND, and damage is
reported (CORRUPT_RECORD) only where the index says a record starts.

The key index is dispatched from the log itself, like RocketMQ's ReputMessageService: the
indexer thread reads the records written since the index's end (appended by a master, copied by
a slave, or recovered after a crash: all the same bytes) and adds the keyed ones. Lookups first
bring it up to the confirm offset, so a lookup never misses a confirmed message because the
indexer had not got to it yet. Lock order: `KeyIndex.catchup` → the log's `lock` → `KeyIndex.lock`;
the log's truncation and retention take the log's locks and then the index's.
"""

from __future__ import annotations

import logging
import threading
import time

from tidelog.commitlog import keyformat as kf
from tidelog.commitlog import reads
from tidelog.commitlog import record as rec
from tidelog.commitlog.consumequeue import INTERNAL_TOPIC_PREFIX, check_topic_queue
from tidelog.commitlog.core import LogCore
from tidelog.errors import (
    CorruptRecordError,
    DataUnavailableError,
    InvalidArgumentError,
    MessageNotFoundError,
    OffsetBelowRetentionError,
    TidelogError,
)
from tidelog.invariants import stop_if_violated

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # log bytes the indexer reads at once
_CANDIDATES = 64  # index entries taken per round of a lookup
MAX_KEY_BYTES = 32 * 1024  # a key lives in the properties block, which is at most this


# --- the indexer ----------------------------------------------------------------------------------


def catch_up(core: LogCore, target: int | None = None) -> None:
    """Index every keyed record from the key index's end up to `target` (default: the log's end).
    Raises DataUnavailableError when the log cannot be read there."""
    keys = core.keys
    with keys.catchup:
        while True:
            with core.lock:
                if core.closed or core.failure is not None:
                    return
                low = core.min_offset
                if keys.end_phys < low:
                    keys.restart_at(low)  # retention deleted what was not indexed yet
                start = keys.end_phys
                stop = core.offsets.max if target is None else min(target, core.offsets.max)
                if start >= stop:
                    return
                generation = keys.generation
                try:
                    data, nxt = reads.read_raw_chunk(core, start, CHUNK_BYTES)
                except (CorruptRecordError, OSError) as exc:
                    raise DataUnavailableError(
                        f"the key index cannot be brought past offset {start}: {exc}"
                    ) from exc
            if not data:
                return
            items = kf.index_entries(data, start)
            with keys.lock:
                # a truncation or retention ran after the read: what was read may be gone
                if keys.generation == generation and keys.end_phys == start:
                    keys.add(items, nxt)


class KeyIndexer:
    """The thread that keeps the key index caught up (every `interval` seconds) and syncs it
    (every `sync_interval`). Failures are logged and retried: the index is derived data, and a
    lookup brings it up to date itself or says it cannot."""

    def __init__(self, core: LogCore, *, interval: float, sync_interval: float) -> None:
        self.core = core
        self.interval = interval
        self.sync_interval = sync_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sync = time.monotonic()
        self._failing = False

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name=f"keyindex:{self.core.directory}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                catch_up(self.core)
                if time.monotonic() - self._last_sync >= self.sync_interval:
                    self.core.keys.sync()
                    self._last_sync = time.monotonic()
                if self._failing:
                    log.info("key index of %s is being maintained again", self.core.directory)
                self._failing = False
            except (TidelogError, OSError) as exc:
                if not self._failing:  # once per spell of failures, not every round
                    log.warning(
                        "key index of %s cannot be maintained: %s; retrying", self.core.directory, exc
                    )
                self._failing = True
            except Exception as exc:  # a bug: keep the broker serving, the index is derived data
                stop_if_violated(exc)
                log.exception("key index of %s failed", self.core.directory)


# --- lookups -----------------------------------------------------------------------------------


def in_queue(core: LogCore, topic: str, queue_id: int, queue_offset: int) -> bytes:
    """The confirmed message at `queue_offset` of (topic, queue)."""
    core.check_open()
    check_topic_queue(topic, queue_id)
    if not isinstance(queue_offset, int) or queue_offset < 0:
        raise InvalidArgumentError(f"queue offset must be a non-negative integer, not {queue_offset!r}")
    data, count = reads.read_encoded(core, topic, queue_id, queue_offset, 1, 1)
    if not count:
        o = core.queues.offsets(topic, queue_id, core.offsets.confirm)
        raise MessageNotFoundError(
            f"{topic}/{queue_id} has no confirmed message at offset {queue_offset} "
            f"(readable offsets {o.min}..{o.confirmed - 1}, written up to {o.max - 1})",
            offset=queue_offset,
        )
    return data


def at_offset(core: LogCore, phys: int) -> bytes:
    """The confirmed user message whose record starts at physical offset `phys` (a message id)."""
    core.check_open()
    if not isinstance(phys, int) or phys < 0:
        raise InvalidArgumentError(f"a physical offset is a non-negative integer, not {phys!r}")
    low, confirm = core.min_offset, core.offsets.confirm
    if phys < low:
        raise OffsetBelowRetentionError(phys, low, what="message offset")
    size, topic, queue_id, qoff = _claimed_record(core, phys, confirm)
    cq = core.queues.get(topic, queue_id)
    if topic.startswith(INTERNAL_TOPIC_PREFIX) or cq is None or qoff >= cq.next_offset:
        raise MessageNotFoundError(f"no message starts at offset {phys}")
    cq.check_readable(qoff)  # a cut queue (deleted topic) or retention: OFFSET_BELOW_RETENTION
    if cq.units(qoff, qoff + 1)[0][0] != phys:
        raise MessageNotFoundError(f"no message starts at offset {phys}")
    data, seg = core.segments.pread(phys, size)
    kind, _, reason = rec.check_at(data, 0)
    if kind != rec.VALID:
        raise CorruptRecordError(seg.path, phys, reason, size=size)
    return data


def _claimed_record(core: LogCore, phys: int, confirm: int) -> tuple[int, str, int, int]:
    """(size, topic, queue, queue offset) the bytes at `phys` claim as a confirmed user message's
    header, not yet believed (the caller asks the consume queue); MESSAGE_NOT_FOUND if they
    cannot be one."""
    if phys + rec.HEADER_SIZE > confirm:
        raise MessageNotFoundError(f"no confirmed message at offset {phys} (confirmed below {confirm})")
    not_found = MessageNotFoundError(f"no message starts at offset {phys}")
    try:
        head, _ = core.segments.pread(phys, rec.HEADER_SIZE)
    except DataUnavailableError:  # the header would cross a segment's end: no record there
        raise not_found from None
    size, magic, _, flags, tlen, queue_id, _, qoff, own, _, _, plen, blen = rec.HEADER.unpack(head)
    if magic != rec.MAGIC or own != phys or flags or size != rec.HEADER_SIZE + tlen + plen + blen or not tlen:
        raise not_found
    if phys + size > confirm:
        raise MessageNotFoundError(
            f"the message at offset {phys} is not confirmed yet (confirmed below {confirm})"
        )
    try:
        topic = core.segments.pread(phys + rec.HEADER_SIZE, tlen)[0].decode()
    except (DataUnavailableError, UnicodeDecodeError):
        raise not_found from None
    return size, topic, queue_id, qoff


def by_key(
    core: LogCore,
    topic: str,
    key: str,
    begin_ts: int,
    end_ts: int,
    max_results: int,
    max_bytes: int,
) -> tuple[list[bytes], bool]:
    """The confirmed messages of `topic` with `key`, stored within [begin_ts, end_ts] (ms),
    newest first (by physical offset: the order they were stored in), at most `max_results` and
    `max_bytes` (at least one message when any matches); and whether more may match."""
    core.check_open()
    check_topic_queue(topic, 0)
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError("a key lookup needs a non-empty key")
    key_bytes = key.encode()
    if len(key_bytes) > MAX_KEY_BYTES:
        raise InvalidArgumentError(f"a key is at most {MAX_KEY_BYTES} bytes, not {len(key_bytes)}")
    if begin_ts < 0 or end_ts < begin_ts:
        raise InvalidArgumentError(f"the time range {begin_ts}..{end_ts} is empty or negative")
    if max_results < 1 or max_bytes < 1:
        raise InvalidArgumentError("a key lookup takes positive limits")
    catch_up(core, core.offsets.confirm)
    wanted = kf.key_hash(topic.encode(), key_bytes)
    out: list[bytes] = []
    used = 0
    cursor: tuple[int, int] | None = None
    while True:
        found, cursor = core.keys.candidates(wanted, begin_ts, end_ts, _CANDIDATES, cursor)
        for phys, _ in found:
            data = _matching(core, phys, topic, key)
            if data is None:
                continue
            if len(out) >= max_results or (out and used + len(data) > max_bytes):
                return out, True
            out.append(data)
            used += len(data)
        if cursor is None:
            return out, False


def _matching(core: LogCore, phys: int, topic: str, key: str) -> bytes | None:
    """The record an index entry points at, if it is a confirmed message of `topic` with `key`
    (hash collisions, records below retention and unconfirmed ones are not)."""
    if phys < core.min_offset or phys >= core.offsets.confirm:
        return None
    try:
        data = at_offset(core, phys)
    except (MessageNotFoundError, OffsetBelowRetentionError):
        return None
    m = rec.decode(data)
    return data if m.topic == topic and m.key == key else None
