"""Record batches: messages travelling in the commit log's own record format (FORMAT.md "Record
batches").

A producer encodes a batch once, every record already laid out as the log stores it, with the
fields only the broker can set left at zero (epoch, queue offset, physical offset, store time, and
the CRC that covers them). The broker checks each record (`check_batch`) and stamps those fields in
place (commitlog/append.py); the bytes then go to disk, to the slaves and back to readers as they
are. A pull answers with the stored bytes of a range, and `RecordView` decodes a record's fields
only when they are read.

Pure functions over bytes; no files.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from tidelog.commitlog import record as rec
from tidelog.commitlog import speedups
from tidelog.commitlog.crc import crc32c
from tidelog.errors import CorruptRecordError, InvalidArgumentError, MessageTooLargeError

#: A producer's record: magic, crc 0, flags 0 (a user message), the topic's length, queue id,
#: epoch 0, queue offset 0, physical offset 0, born time, store time 0, properties and body lengths.
_PRODUCER_HEAD = struct.Struct(">IIIHHIIQQQQII")
#: The fields the broker stamps, from byte 16 of a record: queue id, epoch, queue offset,
#: physical offset, born time, store time.
STAMP = struct.Struct(">IIQQQQ")
STAMP_AT = 16
_CHECK = struct.Struct(">IIIHHIIQQQQII")
_SIZE = struct.Struct(">I")  # a record's first field: its whole size


class Outgoing(Protocol):
    """What a producer knows of one message (the client's OutMessage)."""

    @property
    def body(self) -> bytes: ...
    @property
    def key(self) -> str | None: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def properties(self) -> Mapping[str, str] | None: ...


def encode_batch(topic: bytes, queue_id: int, messages: Sequence[Outgoing], born_ts: int) -> bytes:
    """The records of one batch, back to back, in the stored format with the broker's fields zero.
    Bad properties raise InvalidArgumentError (before anything is sent)."""
    accel = speedups.native
    if accel is not None and 0 <= queue_id <= 0xFFFF_FFFF and 0 <= born_ts <= speedups.I64:
        out: bytes | None = accel.encode_batch(topic, queue_id, messages, born_ts, rec.encode_properties)
        if out is not None:
            return out
    return _encode_batch_py(topic, queue_id, messages, born_ts)


def _encode_batch_py(topic: bytes, queue_id: int, messages: Sequence[Outgoing], born_ts: int) -> bytes:
    """`encode_batch` in Python: the reference, and what answers where the C loop declines."""
    pack = _PRODUCER_HEAD.pack
    magic = rec.MAGIC
    tlen = len(topic)
    fixed = rec.HEADER_SIZE + tlen
    parts: list[bytes] = []
    append = parts.append
    try:
        for m in messages:
            body = m.body
            if m.key is None and m.tags is None and not m.properties:
                blen = len(body)
                append(pack(fixed + blen, magic, 0, 0, tlen, queue_id, 0, 0, 0, born_ts, 0, 0, blen))
                append(topic)
            else:
                props = rec.encode_properties(m.key, m.tags, m.properties)
                plen, blen = len(props), len(body)
                append(
                    pack(fixed + plen + blen, magic, 0, 0, tlen, queue_id, 0, 0, 0, born_ts, 0, plen, blen)
                )
                append(topic)
                append(props)
            append(body)
    except struct.error as exc:
        raise InvalidArgumentError(f"message field out of range: {exc}") from exc
    except (ValueError, UnicodeEncodeError, AttributeError) as exc:
        raise InvalidArgumentError(f"bad message properties: {exc}") from exc
    return b"".join(parts)


def cut_batch(data: bytes, count: int, max_bytes: int, max_records: int) -> list[tuple[int, int, int]]:
    """Where to cut an encoded batch of `count` records so that each part has at most `max_bytes`
    bytes and `max_records` records: (start, end, records) of each part, in order, whole records
    only — the whole batch as one part when it fits. A record larger than `max_bytes` alone
    raises MessageTooLargeError, before any part is named (none of them is to be sent)."""
    if len(data) <= max_bytes and count <= max_records:
        return [(0, len(data), count)]
    parts: list[tuple[int, int, int]] = []
    start = pos = n = 0
    size_of = _SIZE.unpack_from
    for index in range(count):
        size = size_of(data, pos)[0]
        if size > max_bytes:
            raise MessageTooLargeError(
                f"record {index} of the batch is {size} bytes, over max_message_bytes "
                f"(never more than {max_bytes}: what one request carries)"
            )
        if pos + size - start > max_bytes or n == max_records:
            parts.append((start, pos, n))
            start, n = pos, 0
        pos += size
        n += 1
    parts.append((start, pos, n))
    return parts


class Checked(NamedTuple):
    """One record of a producer's batch, checked: where it is in the batch, its size, tags hash
    and born time (0: the broker's store time stands in)."""

    pos: int
    size: int
    tag: int
    born: int


def check_batch(
    data: bytes | bytearray | memoryview, topic: bytes, queue_id: int, count: int, max_record: int
) -> list[Checked]:
    """Check a producer's batch record by record: sizes that add up, the magic, a user message
    (flags 0) of this topic and queue, well-formed properties, no record over `max_record`, exactly
    `count` records. Raises InvalidArgumentError / MessageTooLargeError naming the record.
    Each record comes out as (pos, size, tag, born): a `Checked`, or a plain tuple from the C loop."""
    accel = speedups.native
    if accel is not None and 0 <= queue_id <= 0xFFFF_FFFF and 0 <= count <= speedups.I64 and max_record >= 0:
        checked: list[Checked] | None = accel.check_batch(
            data, topic, queue_id, count, min(max_record, speedups.U64)
        )
        if checked is not None:
            return checked
    return _check_batch_py(data, topic, queue_id, count, max_record)


def _check_batch_py(
    data: bytes | bytearray | memoryview, topic: bytes, queue_id: int, count: int, max_record: int
) -> list[Checked]:
    """`check_batch` in Python: one unpack and one slice per record, a plain tuple out."""
    out: list[Checked] = []
    append = out.append
    n = len(data)
    pos = 0
    unpack = _CHECK.unpack_from
    hsize, magic, tlen_want = rec.HEADER_SIZE, rec.MAGIC, len(topic)
    # the (magic, flags, topic length, queue id) every record of this batch must carry
    want = (magic, 0, tlen_want, queue_id)
    make = tuple.__new__
    while pos < n:
        if n - pos < hsize:
            raise InvalidArgumentError(f"record {len(out)} of the batch is cut short at byte {pos}")
        size, m, _, flags, tlen, qid, _, _, _, born, _, plen, blen = unpack(data, pos)
        if (m, flags, tlen, qid) != want:
            raise InvalidArgumentError(
                f"record {len(out)} of the batch is not a message of this topic and queue "
                "(magic, flags, topic or queue id differ)"
            )
        end = pos + size
        if hsize + tlen + plen + blen != size or end > n or size > max_record:
            _size_problem(len(out), size, end > n, max_record)
        p = pos + hsize
        if data[p : p + tlen] != topic:
            raise InvalidArgumentError(f"record {len(out)} of the batch names another topic")
        append(make(Checked, (pos, size, _tag_of(data, p + tlen, plen, len(out)) if plen else 0, born)))
        pos = end
    if len(out) != count:
        raise InvalidArgumentError(f"the batch holds {len(out)} records, not the {count} it declares")
    return out


def _size_problem(index: int, size: int, overrun: bool, max_record: int) -> None:
    if size <= max_record or overrun:
        raise InvalidArgumentError(f"record {index} of the batch: its length does not match its fields")
    raise MessageTooLargeError(
        f"record {index} of the batch is {size} bytes, over max_message_bytes={max_record}"
    )


def _tag_of(data: bytes | bytearray | memoryview, at: int, plen: int, index: int) -> int:
    if plen > rec.MAX_PROPERTIES_BYTES:
        raise MessageTooLargeError(
            f"record {index} of the batch has {plen} bytes of key, tags and properties, over the "
            f"format's limit of {rec.MAX_PROPERTIES_BYTES}"
        )
    try:
        props = rec.decode_properties(bytes(data[at : at + plen]))
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise InvalidArgumentError(f"record {index} of the batch has malformed properties: {exc}") from exc
    return int(rec.tags_hash(props.get(rec.PROP_TAGS)))


# --- reading stored ranges ---------------------------------------------------------------


def walk(data: bytes | bytearray | memoryview, where: str, at: int, verify_crc: bool = True) -> list[int]:
    """The start of every record in `data` (whole records back to back, as a pull answers), each
    checked for length, magic and (with `verify_crc`) CRC; damage raises CorruptRecordError naming
    `where` and the physical offset (`at` is the first record's)."""
    accel = speedups.native
    if accel is not None:
        found: list[int] | None = accel.walk(data, verify_crc)
        if found is not None:
            return found
    starts: list[int] = []
    n = len(data)
    pos = 0
    unpack = rec.HEAD.unpack_from
    magic = rec.MAGIC
    with memoryview(data) as mv:
        while pos < n:
            if n - pos < rec.HEADER_SIZE:
                raise CorruptRecordError(where, at + pos, "a record is cut short")
            size, m, crc = unpack(data, pos)
            if m != magic or size < rec.HEADER_SIZE or pos + size > n:
                raise CorruptRecordError(where, at + pos, rec.check_at(data, pos)[2] or "bad record length")
            if verify_crc and crc32c(mv[pos + 12 : pos + size]) != crc:
                raise CorruptRecordError(where, at + pos, "CRC32C mismatch")
            starts.append(pos)
            pos += size
    return starts


class RecordView:
    """One stored record inside a pulled buffer; fields are decoded when read.

    Holds the buffer and the record's position; the fixed header is unpacked on first use, the
    properties only when key, tags or properties are asked for."""

    __slots__ = ("_buf", "_pos", "_head", "_props", "broker_set")

    def __init__(self, buf: bytes, pos: int, broker_set: str) -> None:
        self._buf = buf
        self._pos = pos
        self._head: tuple[int, ...] | None = None
        self._props: dict[str, str] | None = None
        self.broker_set = broker_set

    def _h(self) -> tuple[int, ...]:
        h = self._head
        if h is None:
            h = self._head = rec.HEADER.unpack_from(self._buf, self._pos)
        return h

    @property
    def topic(self) -> str:
        p = self._pos + rec.HEADER_SIZE
        return self._buf[p : p + self._h()[4]].decode()

    @property
    def queue(self) -> int:
        return self._h()[5]

    @property
    def offset(self) -> int:
        return self._h()[7]

    @property
    def phys_offset(self) -> int:
        return self._h()[8]

    @property
    def born_ts(self) -> int:
        return self._h()[9]

    @property
    def store_ts(self) -> int:
        return self._h()[10]

    @property
    def body(self) -> bytes:
        h = self._h()
        end = self._pos + h[0]
        return self._buf[end - h[12] : end]

    def _all_props(self) -> dict[str, str]:
        props = self._props
        if props is None:
            h = self._h()
            p = self._pos + rec.HEADER_SIZE + h[4]
            props = self._props = rec.decode_properties(self._buf[p : p + h[11]]) if h[11] else {}
        return props

    @property
    def key(self) -> str | None:
        return self._all_props().get(rec.PROP_KEYS)

    @property
    def tags(self) -> str | None:
        return self._all_props().get(rec.PROP_TAGS)

    @property
    def properties(self) -> Mapping[str, str]:
        return {k: v for k, v in self._all_props().items() if k not in rec.RESERVED_PROPERTIES}

    def __repr__(self) -> str:
        return (
            f"RecordView(topic={self.topic!r}, broker_set={self.broker_set!r}, queue={self.queue}, "
            f"offset={self.offset}, body={len(self.body)} bytes)"
        )

    def __eq__(self, other: object) -> bool:
        fields = ("topic", "broker_set", "queue", "offset", "key", "tags", "body", "properties")
        try:
            return all(getattr(self, f) == getattr(other, f) for f in fields)
        except AttributeError:
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]
