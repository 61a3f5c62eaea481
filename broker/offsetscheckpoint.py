"""The group-offsets fold's checkpoint: its file format, and when a restart may trust it (pure).

A restart used to fold every commit the log holds (broker/offsets.py): with 10,000 groups
committing every second that is ~80,000 records a second of history to read again. The broker
now writes the folded state now and then (`offsets_checkpoint_interval_ms`, and at a clean
stop), with the point of the log it covers, and a restart folds only the commits after it.

The file: `MAGIC`, then the CRC32C and the length of the payload, then the payload, JSON:
`{"v": 1, "applied": next queue offset of %OFFSETS% to fold, "covers": log offset where the last
folded record ends, "last": [its physical offset, its epoch, CRC32C of its body] or null,
"epoch": [epoch, start] of the epoch-file entry holding it or null, "offsets": [[group, topic,
queue, offset, physical offset of the commit], ...]}`. Anything else — a torn write, a flipped
bit, another format — decodes to None: the caller warns and folds the whole log.

A decoded checkpoint is trusted (`trust`) only when the log still holds the same history up to
`covers`:

- the log reaches `covers`;
- the epoch-file entry holding the last folded byte is the one recorded (epoch and start
  offset): logs that agree on an epoch's start agree on every byte before its end, the fork
  repair rule (docs/ARCHITECTURE.md §3.2), so a truncation below `covers` followed by new
  writes is seen;
- the last folded record, when retention has not removed it, is still there: same physical
  offset, queue offset, epoch and body CRC.

It is taken (`ready`) once the confirm offset reaches `covers` too: the fold shows confirmed
commits only, and a restarted replica's confirm offset starts where its log's last checkpoint
left it (a crash: up to a second old) or lower (a slave until its master's next transfer).
Until then the caller folds the log as before, up to the confirm offset, which stays short of
the checkpoint's last record; the checkpoint then replaces that prefix's fold.

`restore` then drops the commits whose record retention has since removed: they are exactly the
ones compaction did not carry forward (superseded, or of a deleted topic; broker/compaction.py),
which a fold of the whole log would not find either.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.commitlog.crc import crc32c

__all__ = [
    "MAGIC",
    "FoldCheckpoint",
    "LastRecord",
    "LogFacts",
    "decode",
    "encode",
    "ready",
    "restore",
    "trust",
]

MAGIC = b"TIDEOFS1"
_HEAD = struct.Struct(">IQ")  # CRC32C of the payload, payload length
VERSION = 1

#: (group, topic, queue) -> (offset, physical offset of the commit record)
Offsets = Mapping[tuple[str, str, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class LastRecord:
    """The last record the checkpoint folded in: where it is, its epoch and its body's CRC32C."""

    phys_offset: int
    epoch: int
    body_crc: int


@dataclass(frozen=True, slots=True)
class FoldCheckpoint:
    applied: int  # the next queue offset of %OFFSETS% queue 0 to fold in
    covers: int  # the log offset where the last folded record ends (0: none folded)
    last: LastRecord | None
    epoch: tuple[int, int] | None  # (epoch, start) of the epoch-file entry holding covers - 1
    offsets: dict[tuple[str, str, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class LogFacts:
    """What `trust` needs to know of the log as it is now."""

    max_offset: int
    confirm_offset: int
    min_offset: int
    epoch_at_covers: tuple[int, int] | None  # the epoch-file entry holding the checkpoint's covers - 1
    # the record now at the checkpoint's last physical offset (None: none there, or removed)
    record_at_last: tuple[int, int, int] | None  # (queue offset, epoch, body CRC32C)


def encode(cp: FoldCheckpoint) -> bytes:
    doc = {
        "v": VERSION,
        "applied": cp.applied,
        "covers": cp.covers,
        "last": None if cp.last is None else [cp.last.phys_offset, cp.last.epoch, cp.last.body_crc],
        "epoch": None if cp.epoch is None else list(cp.epoch),
        "offsets": [[g, t, q, o, p] for (g, t, q), (o, p) in cp.offsets.items()],
    }
    payload = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return MAGIC + _HEAD.pack(crc32c(payload), len(payload)) + payload


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return value


def decode(data: bytes) -> FoldCheckpoint | None:
    """The checkpoint `data` holds, or None for anything that is not an intact one."""
    head = len(MAGIC) + _HEAD.size
    if len(data) < head or not data.startswith(MAGIC):
        return None
    crc, length = _HEAD.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length or crc32c(payload) != crc:
        return None
    try:
        doc = json.loads(payload)
        if doc["v"] != VERSION:
            return None
        last = doc["last"]
        epoch = doc["epoch"]
        offsets: dict[tuple[str, str, int], tuple[int, int]] = {}
        for g, t, q, o, p in doc["offsets"]:
            if not isinstance(g, str) or not isinstance(t, str):
                return None
            offsets[(g, t, _int(q))] = (_int(o), _int(p))
        cp = FoldCheckpoint(
            applied=_int(doc["applied"]),
            covers=_int(doc["covers"]),
            last=None if last is None else LastRecord(_int(last[0]), _int(last[1]), _int(last[2])),
            epoch=None if epoch is None else (_int(epoch[0]), _int(epoch[1])),
            offsets=offsets,
        )
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    if cp.applied < 0 or cp.covers < 0 or (cp.last is None) != (cp.applied == 0):
        return None
    return cp


def trust(cp: FoldCheckpoint, now: LogFacts) -> str | None:
    """None when the log still holds the history `cp` folded; else why not (for the log line)."""
    if now.max_offset < cp.covers:
        return f"the log ends at {now.max_offset}, before the checkpoint's {cp.covers}"
    if cp.covers > 0 and now.epoch_at_covers != cp.epoch:
        return f"the epoch holding offset {cp.covers - 1} is now {now.epoch_at_covers}, not {cp.epoch}"
    if cp.last is not None and cp.last.phys_offset >= now.min_offset:
        expected = (cp.applied - 1, cp.last.epoch, cp.last.body_crc)
        if now.record_at_last != expected:
            return f"the record at {cp.last.phys_offset} is not the one the checkpoint folded"
    return None


def ready(cp: FoldCheckpoint, confirm_offset: int) -> bool:
    """Whether every commit `cp` holds is confirmed again here (a trusted checkpoint waits for it)."""
    return confirm_offset >= cp.covers


def restore(cp: FoldCheckpoint, min_offset: int) -> dict[tuple[str, str, int], tuple[int, int]]:
    """The folded state to start from: the checkpoint's, less the commits retention removed."""
    return {k: v for k, v in cp.offsets.items() if v[1] >= min_offset}
