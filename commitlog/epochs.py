"""The epoch file: which master term wrote which range of the commit log.

Entries are (epoch, start offset), strictly increasing in epoch and non-decreasing in start; an
entry ends where the next begins, the last one is open (its end is the log's max offset). The
file is rewritten whole and atomically (temp file, fsync, rename, fsync directory) with a CRC, so
a crash leaves either the old or the new map, never a mix.

`last_consistent_point` is the pure rule of fork repair (docs/reference/rocketmq-controller-ha.md §5,
`findConsistentPoint`): walk the local epochs from newest to oldest; the first epoch that the
other side has with the same start offset is where the two histories agree, up to the smaller of
the two ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidelog.commitlog.crc import crc32c
from tidelog.errors import CorruptRecordError, EpochRejectedError
from tidelog.private import open_private

OPEN_END = 2**63 - 1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start: int
    end: int = OPEN_END


def with_ends(entries: Sequence[tuple[int, int]], last_end: int | None) -> list[EpochEntry]:
    """(epoch, start) pairs → entries whose end is the next start; the last ends at `last_end`."""
    out: list[EpochEntry] = []
    for i, (epoch, start) in enumerate(entries):
        last = OPEN_END if last_end is None else last_end
        end = entries[i + 1][1] if i + 1 < len(entries) else last
        out.append(EpochEntry(epoch, start, end))
    return out


def last_consistent_point(
    local: Sequence[tuple[int, int]],
    local_end: int | None,
    remote: Sequence[tuple[int, int]],
    remote_end: int | None,
) -> int:
    """The offset up to which two logs agree, or -1 when no epoch matches.

    `local`/`remote` are ascending (epoch, start offset) pairs; `*_end` is each log's max
    offset (None = open). Pure: the same inputs always give the same answer.
    """
    theirs = {e.epoch: e for e in with_ends(remote, remote_end)}
    for mine in reversed(with_ends(local, local_end)):
        other = theirs.get(mine.epoch)
        if other is not None and other.start == mine.start:
            return min(mine.end, other.end)
    return -1


def check_append(entries: Sequence[tuple[int, int]], epoch: int, start: int) -> None:
    """Raise EpochRejectedError unless (epoch, start) may follow `entries`."""
    if epoch < 0 or start < 0:
        raise EpochRejectedError(f"epoch {epoch} and start offset {start} must not be negative")
    if entries:
        last_epoch, last_start = entries[-1]
        if epoch <= last_epoch:
            raise EpochRejectedError(f"epoch {epoch} is not larger than the last epoch {last_epoch}")
        if start < last_start:
            raise EpochRejectedError(
                f"epoch {epoch} would start at {start}, before epoch {last_epoch}'s start {last_start}"
            )


class EpochFile:
    """The persisted epoch → start offset map of one commit log."""

    FILE_NAME = "epochs.json"

    def __init__(self, directory: str, log_end: Callable[[], int]) -> None:
        self._dir = directory
        self._path = os.path.join(directory, self.FILE_NAME)
        self._log_end = log_end
        self._entries: list[tuple[int, int]] = self._load()

    # --- reads ---

    @property
    def entries(self) -> list[EpochEntry]:
        """Entries with ends; the last one ends at the log's max offset."""
        return with_ends(self._entries, self._log_end())

    def pairs(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def last_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else 0

    def find(self, offset: int) -> EpochEntry | None:
        """The entry whose range holds `offset`."""
        for entry in with_ends(self._entries, None):
            if entry.start <= offset < entry.end:
                return entry
        return None

    def last_consistent_point(self, remote: Sequence[tuple[int, int]], remote_end: int) -> int:
        return last_consistent_point(self._entries, self._log_end(), remote, remote_end)

    # --- writes ---

    def append(self, epoch: int, start_offset: int) -> None:
        check_append(self._entries, epoch, start_offset)
        self._store([*self._entries, (epoch, start_offset)])

    def truncate_suffix(self, offset: int) -> None:
        """Drop entries that start at or after `offset` (fork repair cuts the log there)."""
        kept = [(e, s) for e, s in self._entries if s < offset]
        if kept != self._entries:
            self._store(kept)

    def truncate_after(self, offset: int) -> None:
        """Drop entries that start beyond `offset` (recovery: an entry at the log's end is kept)."""
        kept = [(e, s) for e, s in self._entries if s <= offset]
        if kept != self._entries:
            self._store(kept)

    def truncate_prefix(self, offset: int) -> None:
        """Drop entries that end at or before `offset` (retention deleted their data)."""
        full = with_ends(self._entries, None)
        kept = [(e.epoch, e.start) for e in full if e.end > offset]
        if kept != self._entries:
            self._store(kept)

    # --- persistence ---

    def _load(self) -> list[tuple[int, int]]:
        try:
            with open(self._path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        try:
            doc = json.loads(raw)
            entries = [(_whole(e), _whole(s)) for e, s in doc["entries"]]
            ok = doc["crc"] == crc32c(_canonical(entries))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            # RecursionError: a document nested deeper than json's parser goes
            raise CorruptRecordError(self._path, 0, f"unreadable epoch file: {exc}") from exc
        if not ok:
            raise CorruptRecordError(self._path, 0, "epoch file CRC mismatch")
        # The map is only ever written in this order (check_append); one out of it did not come
        # from here, and fork repair and reads by epoch would go wrong on it.
        for i, (epoch, start) in enumerate(entries):
            try:
                check_append(entries[:i], epoch, start)
            except EpochRejectedError as exc:
                raise CorruptRecordError(self._path, 0, f"epoch file out of order: {exc.message}") from None
        return entries

    def _store(self, entries: list[tuple[int, int]]) -> None:
        doc = {"version": 1, "entries": entries, "crc": crc32c(_canonical(entries))}
        atomic_write(self._path, json.dumps(doc).encode())
        self._entries = entries


def _whole(value: object) -> int:
    """An epoch or offset as the file stores it: a JSON integer (not a float, bool or string)."""
    if type(value) is not int:
        raise ValueError(f"{value!r} is not an integer")
    return value


def _canonical(entries: Sequence[tuple[int, int]]) -> bytes:
    return ";".join(f"{e}-{s}" for e, s in entries).encode()


def atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new content."""
    tmp = path + ".tmp"
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
