"""A replica's fence is durable before it is answered, and its fdatasync runs off the event loop
(broker/ledgers.py::LedgerReplica._fence_here): while the sync of one fence is held up, the loop goes
on, the fence already holds in memory, and a second fence of the same ledger waits for the first
one's sync instead of answering "already fenced" before anything is on disk."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from tests.broker.conftest import replica_over_log
from tidelog.broker.ledgers import LedgerReplica
from tidelog.ledger.metadata import new_ledger_metadata
from tidelog.ledger.store import FENCES_JOURNAL, create_message


def test_a_fence_is_synced_off_the_loop_and_answered_only_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica, log = replica_over_log(tmp_path)
    try:
        log.append([create_message(new_ledger_metadata(7, "broker-a", [1], 1, password=b"pw"))])
        ledgers = LedgerReplica(replica)
        journal = os.path.join(log.directory, FENCES_JOURNAL)
        entered, release = threading.Event(), threading.Event()
        real = os.fdatasync

        def held(fd: int) -> None:
            if os.readlink(f"/proc/self/fd/{fd}") == journal:
                entered.set()
                assert release.wait(10), "the test never released the fence's sync"
            real(fd)

        monkeypatch.setattr(os, "fdatasync", held)

        async def scenario() -> None:
            first = asyncio.ensure_future(ledgers.fence(7, b"pw"))
            assert await asyncio.to_thread(entered.wait, 10), "the fence never synced"
            # the loop runs while the sync is held, and the fence already holds in memory
            assert ledgers.index.is_fenced(7) and not first.done()
            second = asyncio.ensure_future(ledgers.fence(7, b"pw"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not second.done(), "a second fence answered before the first was on disk"
            release.set()
            assert await first == await second
            with open(journal, "rb") as f:
                assert f.read().startswith(b"7 ")

        asyncio.run(scenario())
    finally:
        log.close()
