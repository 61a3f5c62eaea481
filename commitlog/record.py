"""The on-disk record codec of the commit log (see FORMAT.md): encode batches, validate, decode.

Pure functions over bytes; no files. Every integer is big-endian. A record is

    total_size u32 | magic u32 | crc u32 | flags u16 | topic_len u16 | queue_id u32 | epoch u32 |
    queue_offset u64 | phys_offset u64 | born_ts u64 | store_ts u64 | props_len u32 | body_len u32 |
    topic | properties | body

and `crc` is the CRC32C of every byte after the crc field. The tail of a segment that cannot hold
the next record starts with a blank marker: total_size = bytes left in the segment, magic = BLANK.

Validation (`check_at`) distinguishes four outcomes, because recovery treats them differently:
a valid record, a blank marker (roll to the next segment), the end of written data (zeros), and
damage (with the reason, so errors can name it).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.commitlog.crc import crc32c

MAGIC = 0x7DE1_0601
BLANK_MAGIC = 0xB1A4_4B00
HEADER = struct.Struct(">IIIHHIIQQQQII")
HEADER_SIZE = HEADER.size  # 64
HEAD = struct.Struct(">III")  # size, magic, crc: the part before what the CRC covers
HEADER_TAIL = struct.Struct(">HHIIQQQQII")  # the rest of the header, covered by the CRC
BLANK = struct.Struct(">II")
BLANK_SIZE = BLANK.size  # 8
_SIZE_MAGIC = struct.Struct(">II")
_KEY = struct.Struct(">H")
_VAL = struct.Struct(">I")

#: Reserved property names (RocketMQ's names, so wire compatibility stays possible).
PROP_KEYS = "KEYS"
PROP_TAGS = "TAGS"
RESERVED_PROPERTIES = frozenset({PROP_KEYS, PROP_TAGS})

#: What validation and decoding read: record bytes in memory, or a segment mapped at recovery.
Readable = bytes | bytearray | memoryview | mmap.mmap

MAX_TOPIC_BYTES = 255
MAX_PROPERTIES_BYTES = 32 * 1024


@dataclass(slots=True)
class Message:
    """A message to append. `flags` is the owner's record kind (the commit log does not interpret it)."""

    topic: str
    queue_id: int
    body: bytes
    key: str | None = None
    tags: str | None = None
    properties: Mapping[str, str] | None = None
    flags: int = 0
    born_ts: int | None = None
    #: The whole properties block already laid out as `encode_properties` lays it out, given in
    #: place of key, tags and properties by an owner that builds the same few fields for every
    #: record (the ledger's adds) and vouches for the layout: it is stored as it is.
    encoded_properties: bytes | None = None


@dataclass(slots=True)
class StoredMessage:
    """A record read back from the log."""

    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    size: int
    body: bytes
    key: str | None
    tags: str | None
    properties: dict[str, str] = field(default_factory=dict)
    flags: int = 0
    epoch: int = 0
    born_ts: int = 0
    store_ts: int = 0


@dataclass(slots=True, frozen=True)
class Header:
    """The fixed part of a record, enough to dispatch it without decoding the body."""

    size: int
    flags: int
    topic: str
    queue_id: int
    epoch: int
    queue_offset: int
    phys_offset: int
    born_ts: int
    store_ts: int
    props: bytes
    body_len: int


# --- properties ---------------------------------------------------------------------------


def encode_properties(key: str | None, tags: str | None, properties: Mapping[str, str] | None) -> bytes:
    """Encode properties as (u16 name length, name, u32 value length, value)*, keys/tags first."""
    parts: list[bytes] = []
    if key is not None:
        _prop(parts, PROP_KEYS, key)
    if tags is not None:
        _prop(parts, PROP_TAGS, tags)
    if properties:
        for name, value in properties.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError("property names and values must be strings")
            if name in RESERVED_PROPERTIES:
                raise ValueError(f"property name {name!r} is reserved; use key= or tags=")
            if not name:
                raise ValueError("property names must not be empty")
            _prop(parts, name, value)
    return b"".join(parts)


def property_name_field(name: str) -> bytes:
    """A property's name as the properties block lays it out (u16 length, then the name), for an
    owner that builds a block of fixed names in one step (ledger/store.py `add_properties`)."""
    n = name.encode()
    return _KEY.pack(len(n)) + n


#: A property value's length as the properties block lays it out (u32).
pack_value_length = _VAL.pack


def _prop(parts: list[bytes], name: str, value: str) -> None:
    n = name.encode()
    v = value.encode()
    if len(n) > 0xFFFF:
        raise ValueError(f"property name of {len(n)} bytes is longer than 65535")
    parts.append(_KEY.pack(len(n)) + n + _VAL.pack(len(v)) + v)


def decode_properties(data: bytes) -> dict[str, str]:
    """The properties block as a dict; ValueError (UnicodeDecodeError included) for a block that
    breaks the layout, and nothing else: callers turn it into their own typed error."""
    out: dict[str, str] = {}
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < _KEY.size:
            raise ValueError("a property name length is cut short")
        (nlen,) = _KEY.unpack_from(data, pos)
        pos += _KEY.size
        if end - pos < nlen + _VAL.size:
            raise ValueError("a property name runs past the properties block")
        name = data[pos : pos + nlen].decode()
        pos += nlen
        (vlen,) = _VAL.unpack_from(data, pos)
        pos += _VAL.size
        if pos + vlen > end:
            raise ValueError("property value runs past the properties block")
        out[name] = data[pos : pos + vlen].decode()
        pos += vlen
    return out


def tags_hash(tags: str | None) -> int:
    """A stable 32-bit tag code for consume-queue units (0 = no tags)."""
    if not tags:
        return 0
    return crc32c(tags.encode()) or 1


def tags_of(props: bytes) -> str | None:
    """TAGS from an encoded properties block, cheaply (keys and tags come first)."""
    if not props:
        return None
    return decode_properties(props).get(PROP_TAGS)


# --- encoding -----------------------------------------------------------------------------

#: One record's header fields in header order (without magic and crc), then its three byte
#: strings: (total_size, flags, topic_len, queue_id, epoch, queue_offset, phys_offset, born_ts,
#: store_ts, props_len, body_len, topic, props, body). The sizes are the caller's: the append path
#: has them already, and `record_fields` computes them for everyone else.
RecordFields = tuple[int, int, int, int, int, int, int, int, int, int, int, bytes, bytes, bytes]


def record_size(topic_bytes: bytes, props: bytes, body: bytes | bytearray | memoryview) -> int:
    return HEADER_SIZE + len(topic_bytes) + len(props) + len(body)


def record_fields(
    *,
    topic: bytes,
    props: bytes,
    body: bytes | bytearray | memoryview,
    flags: int,
    queue_id: int,
    epoch: int,
    queue_offset: int,
    phys_offset: int,
    born_ts: int,
    store_ts: int,
) -> RecordFields:
    """The fields `encode_records` takes, sizes computed."""
    return (
        record_size(topic, props, body),
        flags,
        len(topic),
        queue_id,
        epoch,
        queue_offset,
        phys_offset,
        born_ts,
        store_ts,
        len(props),
        len(body),
        topic,
        props,
        bytes(body),
    )


def encode_records(records: Iterable[RecordFields], parts: list[bytes]) -> None:
    """Append the encoding of each record to `parts`, as three pieces (size, magic and CRC; the
    rest of the header with the topic and properties; the body): `b"".join(parts)` is the records
    back to back. A field out of its type's range raises struct.error.

    The one encoder: the append path encodes each batch with it and joins the pieces into one
    buffer, so it is written for speed. Packing into a preallocated buffer measured slower
    (memoryview slicing and a CRC over a buffer slice cost more than the copy `join` makes);
    here the CRC runs over the header piece and then the caller's body bytes, and the sizes come
    with the fields (the append path computed them to place the records).
    """
    head_pack = HEAD.pack
    tail_pack = HEADER_TAIL.pack
    magic = MAGIC
    for (
        size,
        flags,
        tlen,
        queue_id,
        epoch,
        qoff,
        phys,
        born,
        store,
        plen,
        blen,
        topic,
        props,
        body,
    ) in records:
        pre = tail_pack(flags, tlen, queue_id, epoch, qoff, phys, born, store, plen, blen) + topic + props
        parts += (head_pack(size, magic, crc32c(body, crc32c(pre))), pre, body)


def encode_into(
    buf: bytearray,
    pos: int,
    *,
    topic: bytes,
    props: bytes,
    body: bytes | bytearray | memoryview,
    flags: int,
    queue_id: int,
    epoch: int,
    queue_offset: int,
    phys_offset: int,
    born_ts: int,
    store_ts: int,
) -> int:
    """Write one record at `pos` of `buf` (which must be large enough); returns its size."""
    parts: list[bytes] = []
    fields = record_fields(
        topic=topic,
        props=props,
        body=body,
        flags=flags,
        queue_id=queue_id,
        epoch=epoch,
        queue_offset=queue_offset,
        phys_offset=phys_offset,
        born_ts=born_ts,
        store_ts=store_ts,
    )
    encode_records([fields], parts)
    data = b"".join(parts)
    buf[pos : pos + len(data)] = data
    return len(data)


def encode(**fields: Any) -> bytes:
    """One record as bytes (tests and tools; the log encodes whole batches with `encode_records`)."""
    topic = fields["topic"]
    props = fields.get("props", b"")
    body = fields["body"]
    buf = bytearray(record_size(topic, props, body))
    encode_into(buf, 0, **fields)
    return bytes(buf)


def blank_marker(remaining: int) -> bytes:
    return BLANK.pack(remaining, BLANK_MAGIC)


# --- validation and decoding --------------------------------------------------------------

VALID, IS_BLANK, END, DAMAGED = "valid", "blank", "end", "damaged"


def check_at(data: Readable, pos: int, *, verify_crc: bool = True) -> tuple[str, int, str]:
    """Classify the bytes at `pos`: (VALID, size, "") | (IS_BLANK, declared size, "") |
    (END, 0, "") for no more written data | (DAMAGED, 0, reason)."""
    remaining = len(data) - pos
    if remaining <= 0:
        return END, 0, ""
    if remaining < 8:
        if not any(data[pos:]):
            return END, 0, ""
        return DAMAGED, 0, f"only {remaining} bytes, shorter than a record header"
    size, magic = _SIZE_MAGIC.unpack_from(data, pos)
    if magic == BLANK_MAGIC:
        return IS_BLANK, size, ""
    if magic != MAGIC:
        if size == 0 and magic == 0:
            return END, 0, ""
        return DAMAGED, 0, f"bad magic 0x{magic:08x}"
    reason = _record_damage(data, pos, size, remaining, verify_crc)
    if reason:
        return DAMAGED, 0, reason
    return VALID, size, ""


def _record_damage(data: Readable, pos: int, size: int, remaining: int, verify_crc: bool) -> str:
    """Why the record at `pos` (magic already checked) is damaged, or "" when it is intact."""
    if size < HEADER_SIZE:
        return f"length {size} is shorter than the header"
    if size > remaining:
        return f"length {size} runs past the written data ({remaining} bytes left)"
    (_, _, crc, _, tlen, _, _, _, _, _, _, plen, blen) = HEADER.unpack_from(data, pos)
    if HEADER_SIZE + tlen + plen + blen != size:
        return f"length {size} does not match its fields"
    if verify_crc:
        with memoryview(data) as mv:
            actual = crc32c(mv[pos + 12 : pos + size])
        if actual != crc:
            return f"CRC32C mismatch (stored 0x{crc:08x}, computed 0x{actual:08x})"
        return _fields_damage(data, pos + HEADER_SIZE, tlen, plen)
    return ""


def _fields_damage(data: Readable, at: int, tlen: int, plen: int) -> str:
    """Why a record's topic (at `at`) or properties cannot be decoded, or "". Its CRC holds, so
    only a faulty writer made it: a VALID record must decode (recovery indexes it, reads return
    it), so such a record is damage with the place named, never an exception from the decoder."""
    try:
        bytes(data[at : at + tlen]).decode()
        if plen:
            decode_properties(bytes(data[at + tlen : at + tlen + plen]))
    except ValueError as exc:
        return f"undecodable topic or properties: {exc}"
    return ""


def decode_header(data: Readable, pos: int) -> Header:
    (size, _, _, flags, tlen, queue_id, epoch, qoff, phys, born, store, plen, blen) = HEADER.unpack_from(
        data, pos
    )
    p = pos + HEADER_SIZE
    topic = bytes(data[p : p + tlen]).decode()
    props = bytes(data[p + tlen : p + tlen + plen])
    return Header(size, flags, topic, queue_id, epoch, qoff, phys, born, store, props, blen)


def decode(data: bytes | bytearray | memoryview, pos: int = 0) -> StoredMessage:
    """Decode a record already known to be VALID."""
    (size, _, _, flags, tlen, queue_id, epoch, qoff, phys, born, store, plen, blen) = HEADER.unpack_from(
        data, pos
    )
    p = pos + HEADER_SIZE
    topic = bytes(data[p : p + tlen]).decode()
    p += tlen
    props = decode_properties(bytes(data[p : p + plen])) if plen else {}
    p += plen
    body = bytes(data[p : p + blen])
    key = props.pop(PROP_KEYS, None)
    tags = props.pop(PROP_TAGS, None)
    return StoredMessage(topic, queue_id, qoff, phys, size, body, key, tags, props, flags, epoch, born, store)
