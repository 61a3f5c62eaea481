"""The placement audit's view of every ledger (RULES.md PL6, PL8), kept up to date a little at a time.

The leader audits placement every second. With a million ledgers in the metadata store, reading
them all again each time (sorting the keys, decoding each ledger's metadata, checking each
against its broker set) took more than the second it had, under the state's lock that Raft's
apply also takes: the controller stopped answering. This view instead
- looks again only at the metadata keys that changed since its last refresh (the state's
  `MetaChanges`), or at every key, without sorting, when more changed than that log keeps;
- decodes at most `budget` changed ledgers per refresh (a new leader's first audits cover a
  million ledgers over some seconds rather than stopping for them); `complete` decodes the rest,
  for the admin calls that must see every ledger (decommission's replacement, repair);
- groups the ledgers by what the audit reads of them (broker set, ensemble, replicas), so that
  an audit checks one ledger per group and the others only when that one has a violation.
A new state object (a snapshot loaded) starts the view over.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from tidelog.controller.model import LEDGER_KEY_PREFIX, MetaEntry
from tidelog.controller.placement import LedgerPlacement, ledger_placements
from tidelog.controller.state import ControllerState

#: what the audit reads of a ledger besides its name: ledgers alike in it are audited alike
Shape = tuple[str, tuple[int, ...], tuple[int, ...], bool]

DECODE_BUDGET = 20_000  # ledgers decoded per audit, at most (about a tenth of a second)


def shape_of(lp: LedgerPlacement) -> Shape:
    return (lp.broker_set, lp.ensemble, lp.replicas, lp.deleted)


class LedgerView:
    """Every ledger's placement as last decoded, by metadata key and by shape."""

    def __init__(self) -> None:
        self._state: ControllerState | None = None
        self._reset()

    def _reset(self) -> None:
        self._serial = -1  # the state's last metadata change seen (-1: none: look at every key)
        self._entries: dict[str, MetaEntry] = {}  # key -> the entry decoded (or queued)
        self._pending: dict[str, MetaEntry] = {}  # key -> entry not decoded yet
        self._placed: dict[str, LedgerPlacement] = {}
        self._groups: dict[Shape, dict[str, LedgerPlacement]] = {}

    def refresh(self, state: ControllerState, budget: int = DECODE_BUDGET) -> None:
        """Catch up with `state`, decoding at most `budget` changed ledgers; the caller holds the
        state's read lock."""
        if state is not self._state:
            self._reset()  # a snapshot loaded: everything again
            self._state = state
        feed = state.meta_changes
        keys = feed.since(self._serial) if self._serial >= 0 else None
        if keys is None:
            self._scan(state)
        else:
            for key in keys:
                if key.startswith(LEDGER_KEY_PREFIX):
                    self._look_at(key, state.metadata.get(key))
        self._serial = feed.serial
        self._decode(state, budget)

    def complete(self, state: ControllerState) -> None:
        """`refresh` with every changed ledger decoded."""
        self.refresh(state, budget=len(self._pending) + len(state.metadata))

    @property
    def pending(self) -> int:
        """Changed ledgers not decoded yet (the audit does not see them yet)."""
        return len(self._pending)

    def placements(self) -> list[LedgerPlacement]:
        """The decoded ledgers, by metadata key."""
        return sorted(self._placed.values(), key=lambda lp: lp.key)

    def groups(self) -> list[Iterable[LedgerPlacement]]:
        """The decoded ledgers, alike (same `Shape`) together, each group non-empty."""
        return [g.values() for g in self._groups.values()]

    def _scan(self, state: ControllerState) -> None:
        live: set[str] = set()
        for key, entry in state.metadata.items():
            if key.startswith(LEDGER_KEY_PREFIX):
                live.add(key)
                self._look_at(key, entry)
        for key in [k for k in self._entries if k not in live]:
            self._look_at(key, None)

    def _look_at(self, key: str, entry: MetaEntry | None) -> None:
        """`key`'s entry is now `entry` (None: deleted)."""
        if entry is None:
            if self._entries.pop(key, None) is not None:
                self._pending.pop(key, None)
                self._forget(key)
        elif self._entries.get(key) is not entry:  # entries are replaced, never changed in place
            self._entries[key] = entry
            self._pending[key] = entry

    def _decode(self, state: ControllerState, budget: int) -> None:
        if not self._pending or budget <= 0:
            return
        keys = list(itertools.islice(self._pending, budget))  # not a list of every pending key
        for key in keys:
            del self._pending[key]
            self._forget(key)
        for lp in ledger_placements(state, keys=keys):
            self._placed[lp.key] = lp
            self._groups.setdefault(shape_of(lp), {})[lp.key] = lp

    def _forget(self, key: str) -> None:
        lp = self._placed.pop(key, None)
        if lp is not None:
            shape = shape_of(lp)
            group = self._groups.get(shape)
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self._groups[shape]
