"""Ledger recovery in the simulator: the real `ledger/recovery.py` closes the ledger of a lost writer,
keeps every confirmed entry, and fences a writer that comes back; its checker reports a broken rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tidelog.ledger.metadata import LedgerState
from tidelog.sim.checker import Violation
from tidelog.sim.faults import Fault
from tidelog.sim.ledger import LedgerModel
from tidelog.sim.world import World, run_seed


def run_world(seed: int, faults: list[Fault]) -> LedgerModel:
    world = World(seed, faults, 20, False)
    world.run()
    return world.ledger


def test_a_crashed_writers_ledger_closes_with_every_confirmed_entry() -> None:
    ledger = run_world(0, [])  # seed 0: E=WQ=3, AQ=2; the writer crashes at 8.7 s
    meta = ledger.metastore.meta
    assert meta.state is LedgerState.CLOSED
    confirmed = ledger.checker.confirmed
    assert len(confirmed) > 10
    assert max(confirmed) <= meta.last_entry_id
    for e in range(meta.last_entry_id + 1):  # each entry up to the end, on AQ replicas at least
        assert sum(1 for s in ledger.stores.values() if e in s.entries) >= meta.ack_quorum


def test_a_paused_writer_comes_back_fenced_and_its_adds_fail() -> None:
    ledger = run_world(6, [])  # seed 6: the writer pauses at 31.8 s, recoveries start meanwhile
    assert ledger.writer.wl.fenced
    assert ledger.writer.refused > 0  # every add it began after the fence was refused
    meta = ledger.metastore.meta
    assert meta.state is LedgerState.CLOSED
    assert max(ledger.checker.confirmed) <= meta.last_entry_id


def test_recovery_under_a_crashed_replica_and_loss() -> None:
    """The writer crashes at 8.7 s while b3 is down and a tenth of the messages are lost: the
    recovery fences and reads with the two others and closes after every confirmed entry."""
    faults = [Fault(6_000, "crash", "b3", 6_000), Fault(7_000, "loss", "", 4_000, 0.1)]
    out = run_seed(0, faults=faults)
    assert out.ok, out.violation


def test_a_closed_ledgers_end_never_changes() -> None:
    ledger = run_world(0, [])
    closed = ledger.metastore.meta
    moved = replace(closed, last_entry_id=closed.last_entry_id - 1)
    with pytest.raises(Violation, match="closed at"):
        ledger.metastore.cas(moved, closed.version)


def test_an_entry_confirmed_past_the_end_is_reported() -> None:
    ledger = run_world(0, [])
    end = ledger.metastore.meta.last_entry_id
    with pytest.raises(Violation, match="confirmed"):
        ledger.checker.on_confirmed([end + 1])
