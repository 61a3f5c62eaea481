"""The append path: lay a batch of messages out in the log, encode it, write it, index it.

A batch is validated whole before anything is written: one pass checks every message and decides
where each record lands (rolling to the next segment, behind a blank marker, when a record would
not fit), then the record codec (`record.encode_records`) encodes every record, joined into one
buffer per batch, which is written with one pwrite per segment touched. The records are visible to
`read_raw` on return; their consume-queue units are in memory (the flusher writes them).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog import speedups
from tidelog.commitlog.batch import STAMP, STAMP_AT, Checked
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.queues import AppendSlot, QueueIndex
from tidelog.commitlog.segments import Span
from tidelog.errors import InvalidArgumentError, MessageTooLargeError

#: Stamps of laid-out batches (`AppendSlot.batch`); appends are serialised by the log lock.
_BATCHES = itertools.count()


class Placement(NamedTuple):
    """Where one appended record landed."""

    phys_offset: int
    queue_offset: int
    size: int


class _Chunk:
    """The records of a batch that land in one segment, and the blank marker closing it (if any)."""

    __slots__ = ("base", "start", "buf_from", "records", "end", "blank")

    def __init__(self, base: int, start: int, buf_from: int) -> None:
        self.base = base
        self.start = start  # physical offset of the first record
        self.buf_from = buf_from  # where its bytes start in the batch's buffer
        self.records: list[rec.RecordFields] = []
        self.end = start  # physical offset after the last record
        self.blank = 0  # bytes the closing blank marker declares (0: the segment stays open)

    @property
    def buf_to(self) -> int:
        return self.buf_from + self.end - self.start + (rec.BLANK_SIZE if self.blank else 0)

    def span(self) -> Span:
        return (self.base, self.start, self.buf_from, self.buf_to, bool(self.blank))


def append_batch(core: LogCore, messages: Sequence[rec.Message], store_ts: int) -> list[Placement]:
    """Append `messages` (non-empty) at the max offset; the caller holds `core.lock`."""
    start = core.offsets.max
    chunks, placements, queues = _lay_out(core, messages, store_ts)
    data = _encode(chunks)
    try:
        core.segments.write_spans([c.span() for c in chunks], data)
    except OSError as exc:
        raise core.fail(f"append at {start} failed: {exc}", exc) from exc
    dirty = core.queues.dirty
    for q in queues:
        q.cq.extend(q.phys, q.sizes, q.tags)
        dirty.add(q.cq)
    core.appended(chunks[-1].end)
    return placements


def _lay_out(
    core: LogCore, messages: Sequence[rec.Message], store_ts: int
) -> tuple[list[_Chunk], list[Placement], list[AppendSlot]]:
    """Check every message and place its record; nothing is written. This loop is the hot path:
    locals only, and helpers only for what is rare (a new queue, a body not in bytes, a segment roll)."""
    epoch, limit, seg_bytes = core.epochs.last_epoch, core.max_message_bytes, core.segment_bytes
    room = seg_bytes - rec.BLANK_SIZE  # a record must leave space for a blank marker after it
    max_props, tags_hash, message_type = rec.MAX_PROPERTIES_BYTES, rec.tags_hash, rec.Message
    make, hsize, batch = tuple.__new__, rec.HEADER_SIZE, next(_BATCHES)
    pos = core.offsets.max
    chunk = _Chunk(pos - pos % seg_bytes, pos, 0)
    chunks, records, seg_base = [chunk], chunk.records, chunk.base
    placements: list[Placement] = []
    index = core.queues
    slots = index.slots
    queues: list[AppendSlot] = []  # the slots this batch touches, each once
    for m in messages:
        if m.__class__ is not message_type:
            raise InvalidArgumentError(f"append takes Message objects, not {type(m).__name__}")
        qid = m.queue_id
        q = slots.get((m.topic, qid))
        if q is None or q.batch != batch:
            q = _first_in_batch(index, q, m.topic, qid, batch, queues)
        body = m.body
        if body.__class__ is not bytes:
            body = _body_bytes(body)
        if m.key is None and m.tags is None and not m.properties and m.encoded_properties is None:
            props, tag = b"", 0
        else:  # inline, not a helper: a call per record costs ~2% of a batch append
            try:
                props = (
                    rec.encode_properties(m.key, m.tags, m.properties)
                    if m.encoded_properties is None
                    else _encoded_properties(m)
                )
            except (ValueError, UnicodeEncodeError, AttributeError) as exc:
                raise InvalidArgumentError(f"bad message properties: {exc}") from exc
            if len(props) > max_props:
                raise MessageTooLargeError(
                    f"key, tags and properties of {len(props)} bytes exceed the record format's "
                    f"fixed limit of {max_props} bytes (max_message_bytes does not change it)"
                )
            tag = tags_hash(m.tags)
        plen, blen = len(props), len(body)
        size = hsize + q.name_len + plen + blen
        if size > limit:
            raise MessageTooLargeError(f"a record of {size} bytes exceeds max_message_bytes={limit}")
        if pos - seg_base + size > room:
            chunk.end = pos
            chunk = _roll(chunks, chunk, seg_bytes)
            pos = seg_base = chunk.base
            records = chunk.records
        qoff = q.next
        q.next = qoff + 1
        born = m.born_ts
        records.append(
            (
                size,
                m.flags,
                q.name_len,
                qid,
                epoch,
                qoff,
                pos,
                store_ts if born is None else born,
                store_ts,
                plen,
                blen,
                q.name,
                props,
                body,
            )
        )
        placements.append(make(Placement, (pos, qoff, size)))
        q.phys.append(pos)
        q.sizes.append(size)
        q.tags.append(tag)
        pos += size
    chunk.end = pos
    return chunks, placements, queues


def _first_in_batch(
    index: QueueIndex, q: AppendSlot | None, topic: str, qid: int, batch: int, queues: list[AppendSlot]
) -> AppendSlot:
    """The slot of a queue the batch meets for the first time (made, name and id checked, on the
    queue's first append), its share of the batch started; a share an earlier batch left when it
    failed is dropped with its stamp."""
    if q is None:
        q = index.slot(topic, qid)
    q.batch, q.next = batch, q.cq.next_offset
    q.phys, q.sizes, q.tags = [], [], []
    queues.append(q)
    return q


def _roll(chunks: list[_Chunk], chunk: _Chunk, seg_bytes: int) -> _Chunk:
    """Close `chunk`'s segment with a blank marker; the batch goes on at the next segment."""
    chunk.blank = seg_bytes - (chunk.end - chunk.base)
    nxt = _Chunk(chunk.base + seg_bytes, chunk.base + seg_bytes, chunk.buf_to)
    chunks.append(nxt)
    return nxt


def _encoded_properties(m: rec.Message) -> bytes:
    props = m.encoded_properties
    if m.key is not None or m.tags is not None or m.properties or props.__class__ is not bytes:
        raise InvalidArgumentError(
            "encoded properties come as bytes, alone: no key, tags or properties beside them"
        )
    return props  # type: ignore[return-value]


def _body_bytes(body: object) -> bytes:
    if not isinstance(body, bytearray | memoryview):
        raise InvalidArgumentError(f"message body must be bytes, not {type(body).__name__}")
    return bytes(body)


def _encode(chunks: list[_Chunk]) -> bytes:
    """The batch's bytes: every chunk's records, each chunk closed by its blank marker if any."""
    parts: list[bytes] = []
    try:
        for c in chunks:
            rec.encode_records(c.records, parts)
            if c.blank:
                parts.append(rec.blank_marker(c.blank))
    except struct.error as exc:
        raise InvalidArgumentError(f"message field out of range: {exc}") from exc
    return b"".join(parts)


def append_encoded(
    core: LogCore, topic: str, queue_id: int, batch: bytearray, records: Sequence[Checked], store_ts: int
) -> tuple[int, list[int]]:
    """Append a producer's batch (checked by `batch.check_batch`) at the max offset, stamping each
    record's broker fields and CRC in `batch` itself; returns (first queue offset, physical offset
    of each record). The caller holds `core.lock`."""
    cq = core.queues.open(topic, queue_id)
    first = cq.next_offset
    epoch, seg_bytes = core.epochs.last_epoch, core.segment_bytes
    accel = speedups.native
    stamp = _stamp if accel is None else accel.stamp_batch
    phys, sizes, tags, rolls, pos = stamp(
        batch, records, queue_id, epoch, first, core.offsets.max, seg_bytes, store_ts
    )
    spans, data = _encoded_spans(core.offsets.max, batch, rolls, seg_bytes)
    try:
        core.segments.write_spans(spans, data)
    except OSError as exc:
        raise core.fail(f"append at {core.offsets.max} failed: {exc}", exc) from exc
    cq.extend(phys, sizes, tags)
    core.queues.dirty.add(cq)
    core.appended(pos)
    return first, phys


_Stamped = tuple[list[int], list[int], list[int], list[tuple[int, int, int]], int]


def _stamp(
    batch: bytearray,
    records: Sequence[Checked],
    queue_id: int,
    epoch: int,
    first: int,
    pos: int,
    seg_bytes: int,
    store_ts: int,
) -> _Stamped:
    """Stamp each checked record's broker fields and CRC in `batch`, placing it from `pos` on;
    returns (physical offsets, sizes, tags hashes, segment rolls, the offset after the batch).
    A roll is (batch position, segment base, blank marker size). The C loop `stamp_batch` is
    the same function."""
    room = seg_bytes - rec.BLANK_SIZE
    seg_base = pos - pos % seg_bytes
    stamp, head, stamp_at = STAMP.pack_into, rec.HEAD.pack_into, STAMP_AT
    phys: list[int] = []
    sizes: list[int] = []
    tags: list[int] = []
    rolls: list[tuple[int, int, int]] = []
    qoff = first
    with memoryview(batch) as mv:
        for at, size, tag, born in records:
            if pos - seg_base + size > room:
                rolls.append((at, seg_base, seg_bytes - (pos - seg_base)))
                pos = seg_base = seg_base + seg_bytes
            stamp(batch, at + stamp_at, queue_id, epoch, qoff, pos, born or store_ts, store_ts)
            head(batch, at, size, rec.MAGIC, crc32c(mv[at + 12 : at + size]))
            phys.append(pos)
            sizes.append(size)
            tags.append(tag)
            qoff += 1
            pos += size
    return phys, sizes, tags, rolls, pos


def _encoded_spans(
    start: int, batch: bytearray, rolls: list[tuple[int, int, int]], seg_bytes: int
) -> tuple[list[Span], bytes | bytearray]:
    """Where a stamped batch's bytes go: one span per segment touched, each segment the batch
    leaves closed by a blank marker (inserted into the bytes written)."""
    if not rolls:
        return [(start - start % seg_bytes, start, 0, len(batch), False)], batch
    parts: list[bytes | bytearray] = []
    spans: list[Span] = []
    cut, at_phys, out = 0, start, 0
    for pos, base, blank in rolls:
        piece = batch[cut:pos] + rec.blank_marker(blank)
        spans.append((base, at_phys, out, out + len(piece), True))
        parts.append(piece)
        out += len(piece)
        cut, at_phys = pos, base + seg_bytes
    parts.append(batch[cut:])
    spans.append((at_phys, at_phys, out, out + len(batch) - cut, False))
    return spans, b"".join(parts)
