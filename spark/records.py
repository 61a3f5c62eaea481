"""The records of a pull reply as the Spark source holds them: the reply's bytes, checked, with
the header fields a row needs read out in the same pass (`scan`), and `Chunk`, the part of a reply
that belongs to one planned range.

A pull answers with the stored bytes of whole records (commitlog/FORMAT.md "Record" and "Record
batches"). `scan` checks them with `commitlog.batch.walk` (every record's length, magic and CRC)
and reads each record's queue offset, store time and property and body bounds once, as columns,
which the range reader's contiguity check and the Arrow columns (spark/rows.py) both use. Pure
functions over bytes, no pyarrow.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import add, sub
from typing import NamedTuple

from tidelog.commitlog import record as rec
from tidelog.commitlog.batch import RecordView, walk

#: total_size, then (skipping magic, crc, flags, topic_len, queue_id, epoch) queue_offset, then
#: (skipping phys_offset, born_ts) store_ts, props_len, body_len.
_ROW = struct.Struct(">I20xQ16xQII")
_QUEUE_ID = struct.Struct(">16xI")


class Fields(NamedTuple):
    """The records of a buffer, one sequence per field, in record order."""

    starts: Sequence[int]
    offsets: Sequence[int]  # queue offsets
    store_ts: Sequence[int]  # milliseconds
    body_starts: Sequence[int]
    body_ends: Sequence[int]  # also where each record ends
    props_lens: Sequence[int]  # the properties lie just before the body

    def head(self, n: int) -> Fields:
        """The fields of the first `n` records."""
        return Fields(*(column[:n] for column in self))


NO_FIELDS = Fields((), (), (), (), (), ())


def scan(data: bytes | memoryview, where: str, verify_crc: bool = True) -> Fields:
    """Every record of `data` (whole records back to back, as a pull answers), checked for length,
    magic and CRC by `walk` (damage raises CorruptRecordError naming `where` and the byte in
    `data`), with its row's header fields. Reading the fields is C-level iteration: `map` unpacks
    each header, `zip` turns the rows of fields into columns (measured: a Python loop that both
    walks and unpacks is slower than `walk` followed by this)."""
    starts = walk(data, where, 0, verify_crc)
    if not starts:
        return NO_FIELDS
    sizes, offsets, stamps, plens, blens = zip(*map(_ROW.unpack_from, repeat(data), starts), strict=True)
    ends = list(map(add, starts, sizes))
    return Fields(starts, offsets, stamps, list(map(sub, ends, blens)), ends, plens)


def properties(data: bytes | memoryview, fields: Fields) -> list[dict[str, str] | None]:
    """Each record's properties (KEYS and TAGS included), None for a record without any."""
    out: list[dict[str, str] | None] = [None] * len(fields.props_lens)
    for i in compress(range(len(out)), fields.props_lens):
        end = fields.body_starts[i]
        out[i] = rec.decode_properties(bytes(data[end - fields.props_lens[i] : end]))
    return out


class Chunk:
    """Records of one pull that belong to the range being read, in queue-offset order: the reply's
    bytes (`data`) and the fields of its first records (`fields`; those past the range's end are
    left out).

    Iterating gives each record as a lazily decoded `RecordView` (tests, tools and the tuples
    path); the Arrow path reads `data` and `fields` (spark/rows.py)."""

    __slots__ = ("data", "fields", "broker_set")

    def __init__(self, data: bytes | memoryview, fields: Fields, broker_set: str) -> None:
        self.data = data  # a view of a data-port reply (no copy), or bytes
        self.fields = fields
        self.broker_set = broker_set

    @classmethod
    def of(cls, data: bytes | memoryview, broker_set: str, where: str = "records") -> Chunk:
        """Every record of `data`, checked."""
        return cls(data, scan(data, where), broker_set)

    @property
    def starts(self) -> Sequence[int]:
        return self.fields.starts

    def __len__(self) -> int:
        return len(self.fields.starts)

    def __iter__(self) -> Iterator[RecordView]:
        data, bs = bytes(self.data), self.broker_set  # a message's fields are bytes and str
        return (RecordView(data, pos, bs) for pos in self.fields.starts)

    def queue(self) -> int:
        """The queue id the records carry (0 for an empty chunk)."""
        return int(_QUEUE_ID.unpack_from(self.data, self.fields.starts[0])[0]) if len(self) else 0
