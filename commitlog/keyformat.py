"""The key index's on-disk codec and the text form of message ids (pure: bytes in, values out).

A key index file (commitlog/FORMAT.md "Key index") is a 64-byte header, a table of `slots`
hash slots (u32 each: the number of the newest entry whose key hashes there, 0 = none) and up to
`capacity` entries of 24 bytes; entries are numbered from 1 and each names the previous entry of
its slot, so a slot is the head of a chain running from the newest entry to the oldest. Every
integer is big-endian, as in the records. The index maps the hash of (topic, key) to physical
offsets; it never decides that a record matches: readers compare the record's own topic and key.

`index_entries` walks the bytes of whole records (a raw chunk of the log) and says which records
go into the index: user messages (flags 0, a topic not starting with `%`) that carry a key.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog.crc import crc32c

MAGIC = 0x7DE1_1DC1
VERSION = 1
HEADER = struct.Struct(">IHHIIIIQQQQ")  # magic, version, flags, slots, capacity, count, spare,
# begin phys, end phys, first store time, last store time
HEADER_BYTES = 64  # the fields, their CRC32C, and 4 spare bytes
_CRC = struct.Struct(">I")
SLOT = struct.Struct(">I")
SLOT_BYTES = SLOT.size
ENTRY = struct.Struct(">IIQQ")  # key hash, previous entry of the slot, phys offset, store time
ENTRY_BYTES = ENTRY.size  # 24

#: Header flags. CLEAN: the file was synced with nothing written after (a clean close or a roll);
#: without it, slots naming entries past `used` are not to be trusted (`unsure_slot`).
CLEAN = 1
MAX_SLOTS = 1 << 26
MAX_CAPACITY = (1 << 32) - 2  # entry numbers are u32 and 0 means "none"

_KEYS_PREFIX = struct.pack(">H", len(rec.PROP_KEYS)) + rec.PROP_KEYS.encode()
_KEY_LEN = struct.Struct(">I")


class Header(NamedTuple):
    """A key index file's header: its geometry, how many entries it holds, and what it covers."""

    slots: int
    capacity: int
    used: int  # entries 1..used are written (and, once synced, durable)
    begin_phys: int  # the first record this file may index (the file's name)
    end_phys: int  # every record below this was looked at (its key indexed here or earlier)
    first_ts: int  # store times of the entries: lowest (0 while empty)
    last_ts: int  # highest
    flags: int = 0


class Entry(NamedTuple):
    key_hash: int
    prev: int
    phys: int
    store_ts: int


class HeaderDamaged(ValueError):
    """The header is not a valid key index header; the file is rebuilt from the log."""


def encode_header(h: Header) -> bytes:
    body = HEADER.pack(
        MAGIC,
        VERSION,
        h.flags,
        h.slots,
        h.capacity,
        h.used,
        0,
        h.begin_phys,
        h.end_phys,
        h.first_ts,
        h.last_ts,
    )
    return body + _CRC.pack(crc32c(body)) + bytes(HEADER_BYTES - HEADER.size - _CRC.size)


def decode_header(data: bytes) -> Header:
    """The header in `data`, or HeaderDamaged saying why it cannot be one."""
    if len(data) < HEADER_BYTES:
        raise HeaderDamaged(f"header of {len(data)} bytes, {HEADER_BYTES} expected")
    (crc,) = _CRC.unpack_from(data, HEADER.size)
    if crc != crc32c(data[: HEADER.size]):
        raise HeaderDamaged("header CRC32C mismatch")
    magic, version, flags, slots, capacity, used, _, begin, end, first, last = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise HeaderDamaged(f"magic 0x{magic:08x} version {version}, not a key index of version {VERSION}")
    if not (0 < slots <= MAX_SLOTS and 0 < capacity <= MAX_CAPACITY and used <= capacity):
        raise HeaderDamaged(f"geometry out of range: {slots} slots, {used}/{capacity} entries")
    if end < begin:
        raise HeaderDamaged(f"end offset {end} below begin offset {begin}")
    return Header(slots, capacity, used, begin, end, first, last, flags)


def encode_entry(e: Entry) -> bytes:
    return ENTRY.pack(e.key_hash, e.prev, e.phys, e.store_ts)


def decode_entry(data: bytes, pos: int = 0) -> Entry:
    return Entry(*ENTRY.unpack_from(data, pos))


def slot_position(slot: int) -> int:
    """Where slot `slot` lies in the file."""
    return HEADER_BYTES + slot * SLOT_BYTES


def entry_position(slots: int, number: int) -> int:
    """Where entry `number` (1-based) lies in a file of `slots` slots."""
    return HEADER_BYTES + slots * SLOT_BYTES + (number - 1) * ENTRY_BYTES


def key_hash(topic: bytes, key: bytes) -> int:
    """The 32-bit hash the index files (topic, key) under; collisions are expected and filtered."""
    value: int = crc32c(key, crc32c(topic + b"\x00"))
    return value


def slot_of(h: int, slots: int) -> int:
    return h % slots


def key_in_properties(props: bytes | memoryview) -> bytes | None:
    """The KEYS value of an encoded properties block (it comes first when present), or None."""
    if bytes(props[:6]) != _KEYS_PREFIX or len(props) < 10:
        return None
    (n,) = _KEY_LEN.unpack_from(props, 6)
    if 10 + n > len(props) or n == 0:
        return None
    return bytes(props[10 : 10 + n])


def index_entries(data: bytes, at: int) -> list[tuple[int, int, int]]:
    """(key hash, phys offset, store time) of each keyed user message among the whole records in
    `data`, which starts at physical offset `at` (a raw chunk: records back to back, maybe
    closed by a blank marker). Stops at anything that is not a record header."""
    out: list[tuple[int, int, int]] = []
    unpack = rec.HEADER.unpack_from
    hsize, magic = rec.HEADER_SIZE, rec.MAGIC
    pos, n = 0, len(data)
    with memoryview(data) as mv:
        while n - pos >= hsize:
            size, m, _, flags, tlen, _, _, _, _, _, store, plen, _ = unpack(data, pos)
            if m != magic or size < hsize or pos + size > n:
                break  # a blank marker closes the chunk; the caller goes on at the next segment
            if plen and not flags:
                t = pos + hsize
                topic = bytes(mv[t : t + tlen])
                if not topic.startswith(b"%"):
                    key = key_in_properties(mv[t + tlen : t + tlen + plen])
                    if key is not None:
                        out.append((key_hash(topic, key), at + pos, store))
            pos += size
    return out


# --- message ids ------------------------------------------------------------------------------

_ID_RE = re.compile(r"^(?P<set>[^:\s]{1,255}):(?P<phys>[0-9a-f]{1,16})$")


def format_message_id(broker_set: str, phys_offset: int) -> str:
    """ "<broker set>:<physical offset, lower-case hex>": where the message is stored, unique in
    the cluster (replicas hold a record at the same physical offset)."""
    return f"{broker_set}:{phys_offset:x}"


def parse_message_id(message_id: str) -> tuple[str, int] | None:
    """(broker set, physical offset) of a well-formed id, or None."""
    m = _ID_RE.match(message_id) if isinstance(message_id, str) else None
    if m is None:
        return None
    phys = int(m.group("phys"), 16)
    return (m.group("set"), phys) if phys < 1 << 63 else None
