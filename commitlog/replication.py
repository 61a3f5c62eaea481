"""Raw replication appends: bytes copied from a master, written at exactly this log's max offset.

Every record is validated (length, magic, CRC, its own physical offset, segment fit) before any
byte is written, and a blank marker must close its segment exactly; then the bytes are written
as they came (replicas stay byte-identical) and the records are indexed in the consume queues.
"""

from __future__ import annotations

from collections.abc import Container

from tidelog.commitlog import record as rec
from tidelog.commitlog import speedups
from tidelog.commitlog.consumequeue import check_topic_queue
from tidelog.commitlog.core import LogCore
from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.segments import Span
from tidelog.errors import CorruptRecordError, InvalidArgumentError, OffsetMismatchError

_WHERE = "<replicated data>"


#: A replicated record's consume-queue unit: (where its topic starts in the data, topic length,
#: queue id, queue offset, physical offset, size, properties length). Positions, not slices: one is
#: made per record on the slave's hot path, and the topic is read once per run of one queue.
_Unit = tuple[int, int, int, int, int, int, int]
#: The records of one run: (topic bytes, queue id, first queue offset, physical offsets, sizes, tags hashes).
_Run = tuple[bytes, int, int, list[int], list[int], list[int]]


def start_at(core: LogCore, offset: int) -> None:
    """See `CommitLog.start_at`."""
    core.check_open()
    with core.flush_lock, core.lock:
        if core.offsets.max != core.min_offset or len(core.epochs.pairs()):
            raise OffsetMismatchError(f"only an empty log can start at {offset}", expected=core.offsets.max)
        if offset % core.segment_bytes or offset < core.offsets.max:
            raise OffsetMismatchError(
                f"a log starts at a segment boundary at or after its end, not {offset}",
                expected=core.offsets.max,
            )
        core.segments.start_empty(offset)
        core.offsets.restore(offset, offset)
        core.write_checkpoint(clean=False)


def append_raw(core: LogCore, phys_offset: int, data: bytes) -> int:
    """See `CommitLog.append_raw`."""
    core.check_open()
    if phys_offset != core.offsets.max:
        raise OffsetMismatchError(
            f"raw append at {phys_offset}, but the max offset is {core.offsets.max}",
            expected=core.offsets.max,
        )
    accel = speedups.native
    split = None if accel is None else accel.split_raw(data, phys_offset, core.segment_bytes)
    if split is None:  # the Python loop: the reference, and the one that names what is wrong
        spans, units, end = _split(data, phys_offset, core.segment_bytes)
        runs = _runs(data, units)
    else:
        spans, runs, end = split
    # before any byte is written: a run that cannot be indexed is refused whole
    topics = _topics(runs, core.queues.by_key)
    with core.lock:
        try:
            core.segments.write_spans(spans, data)
        except OSError as exc:
            raise core.fail(f"raw append at {phys_offset} failed: {exc}", exc) from exc
        _index(core, runs, topics)
        core.appended(end)
    return end


def _split(data: bytes, at: int, seg_bytes: int) -> tuple[list[Span], list[_Unit], int]:
    """Validate `data` (to land at `at`) record by record; returns the spans to write (one per
    segment touched), the records' units and the offset after the data. One header unpack and one
    CRC per record: this loop is the slave's hot path."""
    spans: list[Span] = []
    units: list[_Unit] = []
    n = len(data)
    blank_magic = rec.BLANK_MAGIC
    pos = 0
    span_from, span_at = 0, at
    with memoryview(data) as mv:
        while pos < n:
            in_seg = at % seg_bytes
            size, magic = rec.BLANK.unpack_from(data, pos) if n - pos >= 8 else (0, 0)
            if magic == blank_magic:
                if size != seg_bytes - in_seg:
                    raise CorruptRecordError(
                        _WHERE, at, f"blank marker declares {size} bytes, {seg_bytes - in_seg} left"
                    )
                pos += rec.BLANK_SIZE
                spans.append((at - in_seg, span_at, span_from, pos, True))
                at = at - in_seg + seg_bytes
                span_from, span_at = pos, at
                continue
            units.append(_check_record(data, mv, pos, at, size, magic, in_seg, seg_bytes))
            pos += size
            at += size
    if span_from < n:
        spans.append((span_at - span_at % seg_bytes, span_at, span_from, n, False))
    return spans, units, at


def _check_record(
    data: bytes, mv: memoryview, pos: int, at: int, size: int, magic: int, in_seg: int, seg_bytes: int
) -> _Unit:
    """The unit of the record at `pos` of `data` (to land at `at`), once it is known whole, intact,
    meant for `at` and fitting its segment."""
    hsize = rec.HEADER_SIZE
    if magic != rec.MAGIC or size < hsize or pos + size > len(data):
        raise CorruptRecordError(_WHERE, at, rec.check_at(data, pos)[2] or "truncated record")
    (_, _, crc, _, tlen, qid, _, qoff, phys, _, _, plen, blen) = rec.HEADER.unpack_from(data, pos)
    if hsize + tlen + plen + blen != size or crc32c(mv[pos + 12 : pos + size]) != crc:
        raise CorruptRecordError(_WHERE, at, rec.check_at(data, pos)[2] or "damaged record")
    if phys != at:
        raise OffsetMismatchError(f"record at {at} says it belongs at {phys}")
    if in_seg + size + rec.BLANK_SIZE > seg_bytes:
        raise CorruptRecordError(_WHERE, at, "record does not fit in its segment")
    return (pos + hsize, tlen, qid, qoff, phys, size, plen)


def _runs(data: bytes, units: list[_Unit]) -> list[_Run]:
    """The units grouped in runs of records that continue one (topic, queue) at consecutive
    offsets (the usual shape: a producer's batch). The C loop `split_raw` returns the same runs."""
    runs: list[_Run] = []
    i, n = 0, len(units)
    while i < n:
        t, tlen, qid, qoff = units[i][:4]
        tbytes = data[t : t + tlen]
        j = _run_end(data, units, i, tbytes, qid, qoff)
        run = units[i:j]
        tags = [_tag(data, u) for u in run]
        runs.append((tbytes, qid, qoff, [u[4] for u in run], [u[5] for u in run], tags))
        i = j
    return runs


def _topics(runs: list[_Run], known: Container[tuple[str, int]] = frozenset()) -> list[str]:
    """The topic of each run, or CorruptRecordError: a record whose CRC holds but whose topic or
    queue id no consume queue can take (not UTF-8, not a topic name) comes from a faulty master,
    and must not get past the check into the log, where it could not be indexed. A queue already
    `known` was checked when it was made."""
    names: dict[bytes, str] = {}
    out = []
    for tbytes, qid, _, phys, _, _ in runs:
        topic = names.get(tbytes)
        try:
            if topic is None:
                topic = names[tbytes] = tbytes.decode()
            if (topic, qid) not in known:
                check_topic_queue(topic, qid)
        except (UnicodeDecodeError, InvalidArgumentError) as exc:
            raise CorruptRecordError(_WHERE, phys[0], f"no queue can index this record: {exc}") from None
        out.append(topic)
    return out


def _index(core: LogCore, runs: list[_Run], topics: list[str]) -> None:
    """Put the replicated records' units in their consume queues (the flusher writes them). A run
    that continues its queue exactly goes in with one `extend`; anything else unit by unit through
    `put`, which checks each."""
    where = core.segments.directory
    queues = core.queues
    known, dirty = queues.by_key, queues.dirty
    for topic, (_, qid, first, phys, sizes, tags) in zip(topics, runs, strict=True):
        cq = known.get((topic, qid)) or queues.open(topic, qid)
        dirty.add(cq)
        if first == cq.next_offset:
            cq.extend(phys, sizes, tags)
        else:
            for k, (p, size, tag) in enumerate(zip(phys, sizes, tags, strict=True)):
                cq.put(first + k, p, size, tag, where)


def _run_end(data: bytes, units: list[_Unit], i: int, tbytes: bytes, qid: int, qoff: int) -> int:
    """The end of the run of units from `i` that continue (topic, queue) at consecutive offsets."""
    j = i + 1
    n = len(units)
    tlen = len(tbytes)
    while j < n:
        u = units[j]
        if u[2] != qid or u[3] != qoff + (j - i) or u[1] != tlen or not data.startswith(tbytes, u[0]):
            break
        j += 1
    return j


def _tag(data: bytes, unit: _Unit) -> int:
    """The tags hash of a unit's record; CorruptRecordError for properties that break the layout
    (the C loop declines those records, so this names them for both)."""
    at, plen = unit[0] + unit[1], unit[6]
    if not plen:
        return 0
    try:
        return rec.tags_hash(rec.tags_of(data[at : at + plen]))
    except ValueError as exc:
        raise CorruptRecordError(_WHERE, unit[4], f"malformed properties: {exc}") from None
