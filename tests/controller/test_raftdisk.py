"""PySyncObj's journal, its term-and-vote file and its snapshot are synced before Raft relies on
them (controller/raftdisk.py): each change of the journal is on disk when the call returns, the
term and vote are replaced atomically and durably, a snapshot replaces the old one only once it
is on disk. A process crash never needed this (the page cache outlives it); a power loss does,
which no test here can cause: these check that the syncs happen, in order, on the real files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import journal as pjournal
from pysyncobj import syncobj as psyncobj

from tests.controller.test_raft_commit_wake import _lone_node
from tidelog.controller import raftdisk
from tidelog.controller.commands import MetaCreate
from tidelog.localcluster import wait_until


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every msync of a journal file, by file name, in order."""
    done: list[str] = []
    real = pjournal.ResizableFile.flush

    def flush(self: Any) -> None:
        real(self)
        done.append(self._ResizableFile__fileName)

    monkeypatch.setattr(pjournal.ResizableFile, "flush", flush)
    return done


def test_each_change_of_the_journal_is_synced_before_the_call_returns(
    tmp_path: Path, syncs: list[str]
) -> None:
    path = str(tmp_path / "raft.journal")
    journal = raftdisk.DurableJournal(path)
    base = len(syncs)
    for i in range(1, 4):
        journal.add(b"cmd%d" % i, i, 1)
        assert len(syncs) == base + i and syncs[-1] == path
    journal.deleteEntriesFrom(1)  # a follower cutting a conflicting suffix (list positions)
    assert len(syncs) == base + 4
    journal.add(b"cmd2b", 2, 2)
    journal.deleteEntriesTo(1)  # compaction: a rewrite of what is kept, synced once
    assert len(syncs) == base + 6
    journal._destroy()
    again = pjournal.FileJournal(path)
    assert [again[i] for i in range(len(again))] == [(b"cmd2b", 2, 2)]
    again._destroy()


def test_the_term_and_the_vote_are_written_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    real = raftdisk.write_private

    def recording(path: str, data: bytes, **kw: Any) -> None:
        written.append(os.fspath(path))
        real(path, data, **kw)

    monkeypatch.setattr(raftdisk, "write_private", recording)
    path = str(tmp_path / "raft.journal")
    journal = raftdisk.DurableJournal(path)
    journal.setCurrentTerm(5, "c2")  # before PySyncObj sends the vote
    assert written == [path + ".meta"]
    journal._destroy()
    again = pjournal.FileJournal(path)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (5, "c2")
    again._destroy()


def test_a_snapshot_replaces_the_old_one_only_once_it_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        synced.append(f"rename {os.path.basename(src)}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    (tmp_path / "raft.snapshot").write_bytes(b"old")
    (tmp_path / "raft.snapshot.tmp").write_bytes(b"new")
    raftdisk.durable_replace(str(tmp_path / "raft.snapshot.tmp"), str(tmp_path / "raft.snapshot"))
    assert synced == [str(tmp_path / "raft.snapshot.tmp"), "rename raft.snapshot.tmp", str(tmp_path)]
    assert (tmp_path / "raft.snapshot").read_bytes() == b"new"


def test_a_controller_node_writes_through_the_durable_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syncs: list[str]
) -> None:
    node = _lone_node(tmp_path, monkeypatch)
    try:
        assert psyncobj.createJournal is raftdisk._create_journal
        assert isinstance(node._obj._SyncObj__raftLog, raftdisk.DurableJournal)
        wait_until(node.is_leader, 10, 0.01, what="the lone node to lead")
        before = len(syncs)
        result = asyncio.run(node.propose(MetaCreate("k", b"v", now_ms=1), timeout=10.0))
        assert result.ok
        assert len(syncs) > before and syncs[-1].endswith("raft.journal")
    finally:
        node.close()
