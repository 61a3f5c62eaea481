"""The placement audit's view of every ledger (RULES.md PL6, PL8), kept up to date a little at a time.

The leader audits placement every second. With a million ledgers in the metadata store, reading
them all again each time (sorting the keys, decoding each ledger's metadata, checking each
against its broker set) took more than the second it had, under the state's lock that Raft's
apply also takes: the controller stopped answering. This view instead
- looks again only at the metadata keys that changed since its last refresh (the state's
  `MetaChanges`), or at every key, without sorting, when more changed than that log keeps (or
  it starts over): that scan too goes a slice at a time, `SCAN_KEYS_PER_DECODE` keys per unit
  of budget, and a key changed meanwhile is looked at again once it ends;
- decodes at most `budget` changed ledgers per refresh. A new leader's view of a million ledgers
  fills over some seconds in small refreshes, between which the event loop and Raft's apply go
  on (the leader loop's `catch_up_ledgers`, a bounded time per tick): one refresh of it all took 1.5 s, and 20,000 decodes at each
  audit 0.1 to 0.4 s, in which a ledger's recovery open waited. `complete` does the rest at once,
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

DECODE_BUDGET = 1_000  # ledgers decoded per refresh, at most (about 5 ms)
SCAN_KEYS_PER_DECODE = 3  # keys a scan looks at per unit of budget (about 2 us each)


class _Scan:
    """A look at every key of a state, a slice at a time: the keys as they were when it started,
    then the view's keys that were not among them (gone before it started)."""

    def __init__(self, keys: list[str], serial: int) -> None:
        self.keys = keys
        self.serial = serial  # the state's last change when the keys were taken
        self.at = 0
        self.seen: set[str] = set()
        self.known: list[str] | None = None  # the view's keys, once `keys` are all looked at


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
        self._scan: _Scan | None = None

    def refresh(self, state: ControllerState, budget: int = DECODE_BUDGET) -> None:
        """Catch up with `state` by at most `budget` units of work (a ledger decoded, or
        `SCAN_KEYS_PER_DECODE` keys of a scan looked at); the caller holds the state's read lock."""
        if state is not self._state:
            self._reset()  # a snapshot loaded: everything again
            self._state = state
        feed = state.meta_changes
        if self._scan is None:
            keys = feed.since(self._serial) if self._serial >= 0 else None
            if keys is None:
                self._scan = _Scan(list(state.metadata), feed.serial)
            else:
                for key in keys:
                    if key.startswith(LEDGER_KEY_PREFIX):
                        self._look_at(key, state.metadata.get(key))
                self._serial = feed.serial
        if self._scan is not None and self._step_scan(self._scan, state, budget * SCAN_KEYS_PER_DECODE):
            # what changed while it went is looked at by the next refresh (`since` that serial)
            self._serial, self._scan = self._scan.serial, None
        self._decode(state, budget)

    @property
    def busy(self) -> bool:
        """Whether a scan is under way or changed ledgers wait to be decoded."""
        return self._scan is not None or bool(self._pending)

    def complete(self, state: ControllerState) -> None:
        """`refresh` until every changed ledger is decoded."""
        self.refresh(state, budget=len(self._pending) + len(state.metadata))
        # a scan that ended in a refresh leaves what changed meanwhile to the next one
        while self.busy or self._serial != state.meta_changes.serial:
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

    def _step_scan(self, scan: _Scan, state: ControllerState, keys: int) -> bool:
        """Look at up to `keys` more keys of `scan`; whether it has ended."""
        if scan.known is None:
            end = min(len(scan.keys), scan.at + keys)
            for key in scan.keys[scan.at : end]:  # a slice: islice would walk from the start
                if key.startswith(LEDGER_KEY_PREFIX):
                    scan.seen.add(key)
                    self._look_at(key, state.metadata.get(key))
            keys -= end - scan.at
            scan.at = end
            if scan.at < len(scan.keys):
                return False
            scan.known, scan.at = list(self._entries), 0
        end = min(len(scan.known), scan.at + max(keys, 1))
        for key in scan.known[scan.at : end]:
            if key not in scan.seen:
                self._look_at(key, None)  # gone before the scan started
        scan.at = end
        return scan.at >= len(scan.known)

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
