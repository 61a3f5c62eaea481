"""tidelog/gcpolicy.py: what exists when a process has started is out of the collector's reach."""

from __future__ import annotations

import gc

from tidelog import gcpolicy


def test_after_start_freezes_what_exists_and_collections_no_longer_walk_it() -> None:
    kept = [{"n": i} for i in range(10_000)]  # long-lived objects, as start-up makes
    try:
        gcpolicy.after_start("test")
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        # a full collection no longer sees them: none of them is in a generation it walks
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in kept)
    finally:
        gc.unfreeze()
