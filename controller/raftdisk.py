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
Left as PySyncObj has it: the journal's records carry no checksum, so a record torn by a power
loss in the middle of a sync is read back as it lies.
"""

from __future__ import annotations

import os
from typing import Any

from pysyncobj import journal as pjournal
from pysyncobj import serializer as pserializer
from pysyncobj import syncobj as psyncobj

from tidelog.commitlog.epochs import fsync_dir
from tidelog.private import write_private


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


def install() -> None:
    """Have PySyncObj's `SyncObj` use the durable journal and snapshot rename (idempotent)."""
    psyncobj.createJournal = _create_journal
    pserializer.atomicReplace = durable_replace
