"""Placement: which datacenters must hold each broker set's data, the audit of it, and the safety
rule for taking a broker out. Pure functions and one small state machine, time passed in.

This module owns the placement rules (controller RULES.md PL1-PL8) and nothing else; the leader
loop (``node.py``) feeds it the replicated state and its heartbeat table, and the admin service
answers ``tide placement audit|status`` and ``tide broker decommission|replace`` from it.

Why it exists: a disaster-recovery test shuts one datacenter down; everything keeps working
from the other one; the datacenter comes back and all seems well, but until its replicas have
caught up and rejoined the SyncStateSet, every acknowledged byte since the outage lives in one
datacenter only, and a second test on the other datacenter would lose it (BookKeeper's BP-54).
The audit names that state instead of leaving it to be discovered.

Theory of operation
-------------------
- PL1 **Required datacenters.** A broker set declares the datacenters that must hold a replica
  (the controller's ``placement`` map, written by ``tide cluster up`` from the topology's
  ``broker_sets[].datacenters``). Undeclared, it is every datacenter its registered members
  are labelled with. Members without a label count for no datacenter.
- PL2 **Registered.** Every required datacenter has a registered member; else NO_REPLICA.
- PL3 **Up.** Every required datacenter has a live member (heard by the leader within the
  heartbeat timeout); else DATACENTER_DOWN.
- PL4 **In sync.** With two or more required datacenters, the SyncStateSet has a member in every
  one of them: only SyncStateSet members are sure to hold every acknowledged byte (sync
  replication acknowledges once they do). Else NOT_IN_SYNC, naming how far behind the live
  replicas of the missing datacenters are. A returning replica clears it only once the master
  has taken it back into the SyncStateSet, which it does when the replica has caught up.
- PL5 **Master.** A set with registered members and no master is NO_MASTER.
- PL6 **Ledgers.** A ledger's entries live on the replicas of its current ensemble (ledger
  metadata). It violates placement when its ensemble names a broker that is no longer a member
  of the set (REPLICA_GONE: a replaced broker), when the ensemble's members do not cover the
  set's required datacenters (ENSEMBLE_ONE_DATACENTER), or when its broker set violates PL3/PL4
  (its new entries are then held in fewer datacenters: BROKER_SET_DEGRADED). Deleted ledgers
  are not audited.
- PL8 **Re-replication of ledgers** (``ledger_repair``): a broker a ledger names that left the set
  is replaced by a live SyncStateSet member (it holds the whole log), preferring a datacenter the
  ledger's current ensemble lacks.

Decommission (``decommission_problem``, PL7): taking broker B out of a set is refused when B is
the master (elect another first), when B is the last SyncStateSet member, when the set has no
master, when no other SyncStateSet member is alive, or when, with two or more required
datacenters, B is the SyncStateSet's only member in a required datacenter (the set would then
hold acknowledged data in fewer datacenters). The shell also refuses a broker that still runs.
``--force`` lifts every refusal but the first two.

``PlacementMonitor.step(violations, now_ms)`` keeps when each violation was first seen and
returns the ones that opened and cleared since the last step, for the log and ``status``.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tidelog.controller.state import LEDGER_KEY_PREFIX, BrokerSet, ControllerState, LiveInfo
from tidelog.errors import TidelogError
from tidelog.ledger.metadata import LedgerMetadata

__all__ = [
    "BROKER_SET",
    "LEDGER",
    "LedgerPlacement",
    "PlacementMonitor",
    "Violation",
    "audit",
    "audit_broker_set",
    "audit_ledger",
    "decommission_problem",
    "ledger_placements",
    "ledger_repair",
    "replacement_problem",
    "required_datacenters",
]

BROKER_SET = "broker_set"
LEDGER = "ledger"


@dataclass(frozen=True, order=True)
class Violation:
    """One broken placement rule. ``name`` is the broker set's name or the ledger's id."""

    kind: str  # BROKER_SET or LEDGER
    name: str
    code: str  # NO_REPLICA, DATACENTER_DOWN, NOT_IN_SYNC, NO_MASTER, REPLICA_GONE, ...
    broker_set: str
    reason: str
    datacenter: str = ""  # the datacenter it is about, where there is one

    @property
    def key(self) -> tuple[str, str, str, str]:
        """One violation, for telling what opened and cleared: two datacenters down are two."""
        return (self.kind, self.name, self.code, self.datacenter)


@dataclass(frozen=True)
class LedgerPlacement:
    """What the audit needs of one ledger's metadata."""

    ledger_id: int
    broker_set: str
    ensemble: tuple[int, ...]  # the current (last) ensemble's broker ids
    deleted: bool = False
    key: str = ""  # its metadata key
    replicas: tuple[int, ...] = ()  # every broker id any of its ensembles names


def ledger_placements(state: ControllerState, keys: Iterable[str] | None = None) -> Iterator[LedgerPlacement]:
    """Every ledger in the metadata store (or those under ``keys``), as the audit sees it
    (unreadable values are skipped: the state admits only valid ledger metadata under the prefix)."""
    entries = (
        state.list_prefix(LEDGER_KEY_PREFIX)
        if keys is None
        else [e for k in keys if (e := state.get_meta(k)) is not None]
    )
    for entry in entries:
        try:
            meta = LedgerMetadata.decode(entry.value, version=entry.version)
        except (TidelogError, ValueError):
            continue
        ensemble = meta.ensembles[-1][1] if meta.ensembles else ()
        every = tuple(sorted({i for _, members in meta.ensembles for i in members}))
        yield LedgerPlacement(meta.ledger_id, meta.broker_set, tuple(ensemble), key=entry.key, replicas=every)


def ledger_repair(
    ledger: LedgerPlacement, bs: BrokerSet, required: Sequence[str], alive: Iterable[int]
) -> tuple[tuple[int, int], ...]:
    """PL8: the (old, new) replacements that re-replicate ``ledger`` after brokers left its set.
    Each broker named by an ensemble that is no longer a member is replaced by a live SyncStateSet
    member not already named (it holds every acknowledged byte, so these entries), preferring a
    datacenter the current ensemble lacks, then the lowest id. Empty: nothing to do, or no
    candidate yet (a replacement must first catch up)."""
    gone = [i for i in ledger.replicas if i not in bs.members]
    live = set(alive)
    taken = set(ledger.replicas)
    have = {bs.members[i].datacenter for i in ledger.ensemble if i in bs.members}
    pairs = []
    for old in gone:
        candidates = [
            i for i in sorted(bs.sync_state_set) if i in live and i not in taken and i in bs.members
        ]
        if not candidates:
            break
        rank = {dc: n for n, dc in enumerate(d for d in required if d not in have)}
        new = min(candidates, key=lambda i: (rank.get(bs.members[i].datacenter, len(rank)), i))
        pairs.append((old, new))
        taken.add(new)
        have.add(bs.members[new].datacenter)
    return tuple(pairs)


def required_datacenters(declared: Sequence[str] | None, bs: BrokerSet) -> tuple[str, ...]:
    """PL1: the declared datacenters, else every label of a registered member (sorted)."""
    if declared:
        return tuple(sorted(set(declared)))
    return tuple(sorted({m.datacenter for m in bs.members.values() if m.datacenter}))


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def audit_broker_set(
    bs: BrokerSet, required: Sequence[str], alive: Mapping[int, LiveInfo]
) -> list[Violation]:
    """PL2-PL5 for one broker set, given the leader's live brokers of that set."""
    out: list[Violation] = []

    def add(code: str, reason: str, dc: str = "") -> None:
        out.append(Violation(BROKER_SET, bs.name, code, bs.name, reason, dc))

    if bs.members and bs.master_id is None:
        add("NO_MASTER", f"{bs.name} has no master: it takes no writes")
    master_live = alive.get(bs.master_id) if bs.master_id is not None else None
    by_dc: dict[str, list[int]] = {}
    for i, m in bs.members.items():
        by_dc.setdefault(m.datacenter, []).append(i)
    sss_dcs = {bs.members[i].datacenter for i in bs.sync_state_set if i in bs.members}
    for dc in required:
        members = sorted(by_dc.get(dc, []))
        if not members:
            add("NO_REPLICA", f"no replica of {bs.name} is registered in {dc}", dc)
            continue
        live = [i for i in members if i in alive]
        if not live:
            add(
                "DATACENTER_DOWN", f"no live replica of {bs.name} in {dc} (broker {_ids(members)} silent)", dc
            )
            continue
        if len(required) >= 2 and dc not in sss_dcs:
            held = sorted(d or "no datacenter" for d in sss_dcs) or ["nowhere"]
            lag = []
            for i in live:
                if master_live is not None:
                    behind = max(0, master_live.max_offset - alive[i].max_offset)
                    lag.append(f"broker {i} {behind} bytes behind")
                else:
                    lag.append(f"broker {i} catching up")
            add(
                "NOT_IN_SYNC",
                f"acknowledged data of {bs.name} is held in {', '.join(held)} only: "
                f"{dc}'s replica is not in the SyncStateSet ({'; '.join(lag)})",
                dc,
            )
    return out


def audit_ledger(
    ledger: LedgerPlacement,
    bs: BrokerSet | None,
    required: Sequence[str],
    set_violations: Sequence[Violation],
) -> list[Violation]:
    """PL6 for one ledger, given its broker set's own violations."""
    if ledger.deleted:
        return []
    name = str(ledger.ledger_id)

    def v(code: str, reason: str) -> Violation:
        return Violation(LEDGER, name, code, ledger.broker_set, reason)

    if bs is None:
        return [v("REPLICA_GONE", f"ledger {name}'s broker set {ledger.broker_set} no longer exists")]
    out = []
    gone = [i for i in (ledger.replicas or ledger.ensemble) if i not in bs.members]
    if gone:
        out.append(
            v(
                "REPLICA_GONE",
                f"ledger {name}'s ensemble names broker {_ids(gone)}, no longer a member of {bs.name}",
            )
        )
    dcs = {bs.members[i].datacenter for i in ledger.ensemble if i in bs.members}
    missing = [dc for dc in required if dc not in dcs]
    if len(required) >= 2 and missing:
        out.append(
            v("ENSEMBLE_ONE_DATACENTER", f"ledger {name}'s ensemble has no replica in {', '.join(missing)}")
        )
    degraded = [x for x in set_violations if x.code in ("DATACENTER_DOWN", "NOT_IN_SYNC")]
    if degraded:
        out.append(
            v(
                "BROKER_SET_DEGRADED",
                f"ledger {name}'s new entries are not held in every datacenter: "
                + "; ".join(x.reason for x in degraded),
            )
        )
    return out


def audit(
    state: ControllerState,
    declared: Mapping[str, Sequence[str]],
    alive: Mapping[str, Mapping[int, LiveInfo]],
    ledgers: Iterable[LedgerPlacement] = (),
    ledger_groups: Iterable[Iterable[LedgerPlacement]] = (),
) -> list[Violation]:
    """Every violation of every broker set and ledger, sorted (an empty list: all is well).
    A broker set named in ``declared`` that has never registered is NO_REPLICA everywhere.
    ``ledger_groups``: more ledgers, each group alike in broker set, ensemble and replicas
    (controller/ledgerview.py), so audited alike: one of a group is checked, and the others
    only when it has a violation."""
    out: list[Violation] = []
    per_set: dict[str, list[Violation]] = {}
    required: dict[str, tuple[str, ...]] = {}
    names = sorted(set(state.broker_sets) | set(declared))
    for name in names:
        bs = state.broker_sets.get(name) or BrokerSet(name=name, members={})
        required[name] = required_datacenters(declared.get(name), bs)
        per_set[name] = audit_broker_set(bs, required[name], alive.get(name, {}))
        out.extend(per_set[name])
    for group in itertools.chain(([ledger] for ledger in ledgers), ledger_groups):
        rest = iter(group)
        first = next(rest, None)
        if first is None:
            continue
        bs = state.broker_sets.get(first.broker_set)
        req = required.get(first.broker_set, ())
        set_violations = per_set.get(first.broker_set, [])
        found = audit_ledger(first, bs, req, set_violations)
        if not found:
            continue  # what is read of them is the same: none of them has a violation
        out.extend(found)
        for ledger in rest:
            out.extend(audit_ledger(ledger, bs, req, set_violations))
    return sorted(out)


def decommission_problem(
    bs: BrokerSet,
    broker_id: int,
    required: Sequence[str],
    *,
    force: bool = False,
    alive: Iterable[int] | None = None,
) -> str | None:
    """Why taking ``broker_id`` out of ``bs`` is refused, or None when it is safe (see the module).
    ``alive``: the live members, when known (None: liveness is not considered)."""
    if broker_id not in bs.members:
        return f"broker {broker_id} is not a member of {bs.name}"
    if broker_id == bs.master_id:
        return (
            f"broker {broker_id} is the master of {bs.name}: elect another master first "
            f"(tide admin elect {bs.name} --broker ID)"
        )
    rest = bs.sync_state_set - {broker_id}
    if broker_id in bs.sync_state_set and not rest:
        return f"broker {broker_id} is the last in-sync replica of {bs.name}"
    if force:
        return None
    if bs.master_id is None:
        return (
            f"{bs.name} has no master: the remaining replicas may not hold what broker {broker_id} "
            f"holds; bring the set back first, or pass --force"
        )
    if alive is not None and broker_id in bs.sync_state_set and not rest & set(alive):
        return (
            f"no other in-sync replica of {bs.name} is alive: broker {broker_id} may hold the only "
            f"reachable copy of acknowledged data"
        )
    if len(required) < 2:
        return None

    def covered(members: frozenset[int]) -> set[str]:
        return {bs.members[i].datacenter for i in members if i in bs.members} & set(required)

    lost = sorted(covered(bs.sync_state_set) - covered(rest))
    if lost:
        held = ", ".join(sorted(covered(rest))) or "no required datacenter"
        return (
            f"broker {broker_id} is the only in-sync replica of {bs.name} in {', '.join(lost)}: "
            f"without it, acknowledged data would be held in {held} "
            f"only; bring another replica there in sync first, or pass --force"
        )
    return None


def replacement_problem(
    bs: BrokerSet, broker_id: int, replacement: int, alive: Iterable[int], *, force: bool = False
) -> str | None:
    """Why ``replacement`` cannot take over from ``broker_id`` yet, or None. It must be another
    live member that the master has taken into the SyncStateSet (so it holds every acknowledged
    byte, ledger entries included), and in the same datacenter unless ``force``."""
    if replacement == broker_id:
        return "a broker cannot replace itself"
    if replacement not in bs.members:
        return f"broker {replacement} is not a member of {bs.name}: start it with the set's config first"
    if replacement not in set(alive):
        return f"broker {replacement} of {bs.name} is not alive"
    if replacement not in bs.sync_state_set:
        return (
            f"broker {replacement} is not in the SyncStateSet of {bs.name} yet: it is still copying "
            f"the log; try again once `tide placement status` shows it in sync"
        )
    old, new = bs.members.get(broker_id), bs.members[replacement]
    if not force and old is not None and old.datacenter != new.datacenter:
        return (
            f"broker {replacement} is in {new.datacenter or 'no datacenter'}, broker {broker_id} in "
            f"{old.datacenter or 'no datacenter'}: pass --force to move the replica"
        )
    return None


class PlacementMonitor:
    """Since when each violation stands, and what opened and cleared at each step."""

    def __init__(self) -> None:
        self.since_ms: dict[tuple[str, str, str, str], int] = {}
        self.current: list[Violation] = []
        self.audited_ms: int | None = None
        # (now ms, opened?, violation): the latest changes, oldest first, for `tide placement status`
        self.events: collections.deque[tuple[int, bool, Violation]] = collections.deque(maxlen=100)

    def step(self, violations: Sequence[Violation], now_ms: int) -> tuple[list[Violation], list[Violation]]:
        """Record this audit; returns (opened, cleared)."""
        before = {v.key: v for v in self.current}
        after = {v.key: v for v in violations}
        opened = [v for k, v in sorted(after.items()) if k not in before]
        cleared = [v for k, v in sorted(before.items()) if k not in after]
        for v in opened:
            self.since_ms[v.key] = now_ms
            self.events.append((now_ms, True, v))
        for v in cleared:
            self.since_ms.pop(v.key, None)
            self.events.append((now_ms, False, v))
        self.current = sorted(violations)
        self.audited_ms = now_ms
        return opened, cleared
