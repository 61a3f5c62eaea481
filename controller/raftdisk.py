"""What PySyncObj leaves in the page cache, made durable before Raft relies on it.

PySyncObj (0.3.17) writes its journal through a memory map it never syncs, its term-and-vote file
by a rename of data it never syncs, and its snapshot the same way. A process that crashes loses
none of it (the page cache outlives the process); a machine that loses power can come back
without log entries it acknowledged to the leader, or without the vote it granted in a term,
and Raft's guarantees rest on both: an entry a majority acknowledged is committed, and one node
votes once per term. For the controller that is the SyncStateSet and the master epochs, on which
"an acknowledged message is never lost" depends.

`install()` (once per process, before a `SyncObj` is made) has PySyncObj create `DurableJournal`
instead of its file journal, which syncs every change of the log before it returns, so before
PySyncObj answers an append, counts an entry as its own or applies it; stores the term and the vote
with `tidelog.private.write_private` (the data and the directory synced); and replaces a snapshot
(its own or one a leader sent) only once the new file is synced, syncing the directory after.
PySyncObj writes a log compaction's snapshot, then, a tick later, cuts the journal below the
snapshot's last entry. At a start it keeps the journal only if it begins with the snapshot's last
two entries, and otherwise clears it to them: a node stopped between the two steps lost every
entry after the snapshot, committed ones too. `install()` has the start first cut such a journal
to the snapshot (`align_journal`), as the compaction would have, so those entries stay.

Left as PySyncObj has it: the journal's records carry no checksum, so a record torn by a power
loss in the middle of a sync is read back as it lies.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pysyncobj import journal as pjournal
from pysyncobj import serializer as pserializer
from pysyncobj import syncobj as psyncobj

from tidelog.commitlog.epochs import fsync_dir
from tidelog.private import write_private

log = logging.getLogger(__name__)


class _DurableMeta(pjournal.MetaStorer):  # type: ignore[misc]
    """The term, the vote and the commit index: replaced atomically and durably."""

    def storeMeta(self, meta: dict[str, Any]) -> None:  # noqa: N802 (PySyncObj's name)
        write_private(self.getPath(), pjournal.dumps(meta))


class DurableJournal(pjournal.FileJournal):  # type: ignore[misc]
    """PySyncObj's file journal, each change synced (`msync`) before the call returns."""

    def __init__(self, journal_file: str) -> None:
        super().__init__(journal_file)
        self._FileJournal__metaStorer = _DurableMeta(journal_file + ".meta")
        self._in_rewrite = 0
        self.flush()
        fsync_dir(os.path.dirname(journal_file) or ".")  # a journal file just created

    def _synced(self) -> None:
        if not self._in_rewrite:
            self.flush()

    def add(self, command: Any, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self._synced()

    def clear(self) -> None:
        super().clear()
        self._synced()

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 (PySyncObj's names)
        super().deleteEntriesFrom(entryFrom)
        self._synced()

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803
        # a clear and an add per entry kept: one sync at the end
        self._in_rewrite += 1
        try:
            super().deleteEntriesTo(entryTo)
        finally:
            self._in_rewrite -= 1
        self._synced()


def _create_journal(journalFile: str | None = None) -> Any:  # noqa: N803 (PySyncObj's name)
    return pjournal.MemoryJournal() if journalFile is None else DurableJournal(journalFile)


def durable_replace(tmp: str, path: str) -> None:
    """Rename `tmp` over `path` once `tmp`'s data is on disk, then sync the directory."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


Entry = tuple[Any, int, int]  # PySyncObj's journal entry: (command, index, term)


def align_journal(journal: Any, before: Entry, last: Entry) -> int:
    """Cut `journal`'s entries below `before` when it holds the snapshot's last two entries
    (`before`, `last`) further on than its start: what the compaction that wrote the snapshot
    would have done. Returns how many entries were cut (0: aligned already, or not this log)."""
    if len(journal) < 2:
        return 0
    k = before[1] - journal[0][1]  # the journal's indexes are consecutive
    if k <= 0 or k + 1 >= len(journal) or journal[k] != before or journal[k + 1] != last:
        return 0
    journal.deleteEntriesTo(k)
    return k


_load_dump = psyncobj.SyncObj._SyncObj__loadDumpFile  # noqa: SLF001 - wrapped by install()


def _load_dump_aligned(self: Any, clearJournal: bool) -> None:  # noqa: N803 (PySyncObj's name)
    """PySyncObj's load of the snapshot at a start, the journal aligned to it first."""
    if clearJournal:  # a leader's snapshot just received: PySyncObj clears the journal for it
        return _load_dump(self, clearJournal)  # type: ignore[no-any-return]
    serializer = self._SyncObj__serializer
    try:
        data = serializer.deserialize()
    except Exception:  # noqa: BLE001 - PySyncObj's own load reports it, reading it again
        return _load_dump(self, clearJournal)  # type: ignore[no-any-return]
    journal = self._SyncObj__raftLog
    cut = align_journal(journal, data[2], data[1])
    if cut:
        log.warning(
            "the Raft journal began %d entries before the snapshot's end (a stop between a "
            "snapshot and the journal's cut): cut to the snapshot, its %d later entries kept",
            cut,
            len(journal) - 2,
        )
    serializer.deserialize = lambda: data  # read once: a million ledgers take seconds
    try:
        return _load_dump(self, clearJournal)  # type: ignore[no-any-return]
    finally:
        del serializer.deserialize


def install() -> None:
    """Have PySyncObj's `SyncObj` use the durable journal and snapshot rename, and align the
    journal to the snapshot at a start (idempotent)."""
    psyncobj.createJournal = _create_journal
    pserializer.atomicReplace = durable_replace
    psyncobj.SyncObj._SyncObj__loadDumpFile = _load_dump_aligned  # noqa: SLF001
