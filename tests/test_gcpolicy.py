"""tidelog/gcpolicy.py: what exists when a process has started is out of the collector's reach."""

from __future__ import annotations

import gc
import weakref

from tidelog import gcpolicy


def test_after_start_freezes_what_exists_and_collections_no_longer_walk_it() -> None:
    kept = [{"n": i} for i in range(10_000)]  # long-lived objects, as start-up makes
    cycle: list[object] = []
    cycle.append(cycle)  # start-up's recent garbage with a cycle: freed, not frozen for good
    probe = weakref.ref(Holder(cycle))
    del cycle
    try:
        gcpolicy.after_start("test")
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        # a full collection no longer sees them: none of them is in a generation it walks
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in kept)
        assert probe() is None
    finally:
        gc.unfreeze()


def test_settle_is_due_once_per_change_and_at_most_every_interval() -> None:
    rule = gcpolicy.Settle(1.0)
    assert rule.due(1, 0.0)  # a change, the first time
    assert not rule.due(1, 5.0)  # nothing changed since
    assert rule.due(2, 5.5)  # a change, long after the last settle
    assert not rule.due(3, 6.0)  # a change within the interval waits
    assert rule.due(3, 6.5)  # and is settled once the interval passed


def test_settle_moves_what_was_made_since_start_out_of_reach_and_frees_young_cycles() -> None:
    try:
        gcpolicy.after_start("test")
        grown = [{"n": i} for i in range(10_000)]  # state made after start (topics, ledgers)
        cycle: list[object] = []
        cycle.append(cycle)  # young garbage with a cycle: collected, not frozen for good
        probe = weakref.ref(Holder(cycle))
        del cycle
        gcpolicy.settle()
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in grown)
        assert probe() is None
    finally:
        gc.unfreeze()


class Holder:
    """A weakly referenceable object kept alive only by the cycle it is part of."""

    def __init__(self, cycle: list[object]) -> None:
        self.cycle = cycle
        cycle.append(self)
