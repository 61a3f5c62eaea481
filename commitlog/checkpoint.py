"""The checkpoint file: what recovery may trust.

It holds the flushed offset (every byte below it was fdatasync'ed, so damage below it is
corruption, not a torn tail), the confirm offset, the offset below which consume queues are
durable, and whether the last shutdown was clean.

Two fixed 64-byte slots are written alternately (pwrite + fdatasync), each with a sequence
number and a CRC32C: a write torn by a crash damages only the slot being written, and the other
slot still holds the previous state. Rewriting in place keeps each checkpoint one small write.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from tidelog.commitlog.crc import crc32c
from tidelog.commitlog.fileio import pwrite_all
from tidelog.private import open_private

_SLOT = struct.Struct(">IHHQqqqq")  # magic, version, clean, seq, flushed, confirm, cq, spare
_CRC = struct.Struct(">I")
_MAGIC = 0x7DE1_C4EC
_SLOT_BYTES = 512  # sector-aligned slots: a torn write never spans both


@dataclass(frozen=True, slots=True)
class Checkpoint:
    flushed_offset: int = 0
    confirm_offset: int = 0
    cq_offset: int = 0
    clean: bool = False
    seq: int = 0


class CheckpointFile:
    FILE_NAME = "checkpoint"

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, self.FILE_NAME)
        existed = os.path.exists(self.path)
        self._fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        self.loaded: Checkpoint | None = self._read() if existed else None
        self._seq = self.loaded.seq if self.loaded else 0

    def _read(self) -> Checkpoint | None:
        best: Checkpoint | None = None
        for slot in (0, 1):
            raw = os.pread(self._fd, _SLOT.size + 4, slot * _SLOT_BYTES)
            if len(raw) < _SLOT.size + 4:
                continue
            (crc,) = _CRC.unpack_from(raw, _SLOT.size)
            if crc != crc32c(raw[: _SLOT.size]):
                continue
            magic, _version, clean, seq, flushed, confirm, cq, _ = _SLOT.unpack_from(raw)
            if magic != _MAGIC:
                continue
            cp = Checkpoint(flushed, confirm, cq, bool(clean), seq)
            if best is None or cp.seq > best.seq:
                best = cp
        return best

    def write(self, flushed: int, confirm: int, cq: int, clean: bool = False) -> None:
        self._seq += 1
        body = _SLOT.pack(_MAGIC, 1, int(clean), self._seq, flushed, confirm, cq, 0)
        pwrite_all(self._fd, body + _CRC.pack(crc32c(body)), (self._seq % 2) * _SLOT_BYTES)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
