"""A one-node controller commits a write without sleeping out PySyncObj's tick period.

PySyncObj appends a proposal in one tick and commits it in the next; between them its thread
polls its sockets for `autoTickPeriod`. A lone node has no follower whose answer ends that poll,
so each write used to wait a whole period (50 ms by default: most of a ledger recovery open's
150 ms). Here the period is stretched to 10 s: a write commits within the test's bounds only if
the node wakes its own tick thread (`controller/raft.py::_CommitWake`).
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path
from typing import Any

import pytest

from tests.procs import free_address
from tidelog.controller import raft
from tidelog.controller.commands import MetaCreate
from tidelog.controller.config import parse
from tidelog.controller.raft import RaftNode, _CommitWake
from tidelog.localcluster import wait_until
from tidelog.tasks import within

LONG_TICK_S = 10.0


def _lone_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RaftNode:
    # PySyncObj's tick sleeps up to autoTickPeriod between ticks; RaftNode leaves it at its default
    monkeypatch.setattr(raft, "SyncObjConf", functools.partial(raft.SyncObjConf, autoTickPeriod=LONG_TICK_S))
    cfg = parse(
        {
            "data_dir": str(tmp_path / "data"),
            "secret": "s" * 32,
            "nodes": [{"id": "c1", "raft": free_address(), "grpc": free_address()}],
            # the first tick (0.1 s after start) already finds the election timeout passed
            "raft": {
                "election_min_timeout_ms": 40,
                "election_max_timeout_ms": 60,
                "append_entries_period_ms": 10,
                "leader_fallback_timeout_ms": 3000,
            },
        }
    )
    return RaftNode(cfg)


def test_a_lone_node_commits_writes_without_waiting_for_its_tick_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _lone_node(tmp_path, monkeypatch)
    try:
        wait_until(node.is_leader, 10, 0.01, what="the lone node to lead")

        async def writes() -> list[Any]:
            # each bound is a small part of the tick period: only a woken tick commits in time
            return [
                await within(node.propose(MetaCreate(f"k{i}", b"v", now_ms=1), timeout=LONG_TICK_S), 2.0)
                for i in range(5)
            ]

        results = asyncio.run(writes())
        assert all(r.ok for r in results)
        with node.read() as state:
            assert {f"k{i}" for i in range(5)} <= set(state.metadata)
    finally:
        node.close()


class _FakeObj:
    """What `_CommitWake` reads of a SyncObj: its peers, its leadership and its poller."""

    def __init__(self, *, others: set[str], leader: bool) -> None:
        self.otherNodes = others
        self.leader = leader
        self.subscribed: list[int] = []
        self._poller = self

    def _isLeader(self) -> bool:
        return self.leader

    def _getLeader(self) -> None:
        return None

    def subscribe(self, descr: int, callback: Any, mask: int) -> None:
        self.subscribed.append(descr)


def _woken(wake: _CommitWake) -> bool:
    """Whether a byte waits on the wake pipe (and drain it, as the poller would)."""
    if wake._pipe is None:
        return False
    try:
        return bool(os.read(wake._pipe[0], 4096))
    except BlockingIOError:
        return False


@pytest.mark.parametrize(
    ("others", "leader", "in_flight", "wakes"),
    [
        (set(), True, 1, True),  # alone, leading, a proposal unanswered: wake
        (set(), True, 0, False),  # idle: the tick sleeps its period
        ({"c2"}, True, 1, False),  # followers' answers wake the poll themselves
        (set(), False, 1, False),  # not leading: nothing to commit here
    ],
)
def test_the_tick_is_woken_only_for_a_lone_leaders_unanswered_proposals(
    others: set[str], leader: bool, in_flight: int, wakes: bool
) -> None:
    wake = _CommitWake(_FakeObj(others=others, leader=leader))  # type: ignore[arg-type]
    try:
        for _ in range(in_flight):
            wake.proposed()
        wake.on_tick()
        assert _woken(wake) is wakes
        for _ in range(in_flight):
            wake.answered()
        wake.on_tick()
        assert not _woken(wake)
    finally:
        wake.close()
