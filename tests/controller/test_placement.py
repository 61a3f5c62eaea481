"""Placement rules of the controller (controller/placement.py; controller/RULES.md PL1-PL7): which
datacenters must hold a broker set (PL1), the audit of registration, liveness, sync and mastership
(PL2-PL5), the ledger audit (PL6), the decommission and replacement safety checks (PL7), and the
monitor that tracks when each violation opened and cleared.

Everything here is pure: broker sets, live tables and ledger metadata are built by hand, so each
documented disaster-recovery scenario (a datacenter down, back but behind, back in sync) is one
table row, and hypothesis checks the rules over random sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.controller.ledgerview import LedgerView
from tidelog.controller.model import MetaChanges
from tidelog.controller.placement import (
    BROKER_SET,
    LEDGER,
    LedgerPlacement,
    PlacementMonitor,
    Violation,
    audit,
    audit_broker_set,
    audit_ledger,
    decommission_problem,
    ledger_placements,
    ledger_repair,
    replacement_problem,
    required_datacenters,
)
from tidelog.controller.state import (
    BrokerSet,
    ControllerState,
    LiveInfo,
    Member,
    MetaCompareAndSet,
    MetaCreate,
    MetaDelete,
    MetaEntry,
    ReplaceLedgerReplicas,
    Result,
)
from tidelog.ledger.client import ledger_key
from tidelog.ledger.metadata import LedgerMetadata, hash_password, new_ledger_metadata

SET = "broker-a"
TWO_DCS = ("dc-a", "dc-b")


# --- builders -----------------------------------------------------------------------------


def member(broker_id: int, dc: str) -> Member:
    return Member(
        broker_id, f"127.0.0.1:{10900 + broker_id}", f"127.0.0.1:{10800 + broker_id}", datacenter=dc
    )


def broker_set(dcs: Mapping[int, str], master: int | None, sss: Iterable[int], name: str = SET) -> BrokerSet:
    """A set whose member ``i`` is labelled ``dcs[i]``; ``master`` and ``sss`` as given."""
    return BrokerSet(
        name=name,
        members={i: member(i, dc) for i, dc in dcs.items()},
        master_id=master,
        master_epoch=1 if master is not None else 0,
        sync_state_set=frozenset(sss),
    )


def live(offsets: Mapping[int, int]) -> dict[int, LiveInfo]:
    """The leader's heartbeat table for one set: broker id -> its max offset."""
    return {i: LiveInfo(epoch=1, max_offset=off) for i, off in offsets.items()}


def state_of(*sets: BrokerSet) -> ControllerState:
    state = ControllerState()
    for bs in sets:
        state.broker_sets[bs.name] = bs
    return state


def codes(violations: Sequence[Violation]) -> list[str]:
    return [v.code for v in violations]


# --- PL1: required datacenters -------------------------------------------------------------


def test_p1_declared_datacenters_win_over_labels_sorted_and_deduplicated() -> None:
    bs = broker_set({1: "dc-a", 2: "dc-b", 3: "dc-c"}, 1, {1, 2, 3})
    assert required_datacenters(["dc-b", "dc-a", "dc-b"], bs) == ("dc-a", "dc-b")


def test_p1_undeclared_uses_member_labels_and_unlabelled_members_count_for_no_datacenter() -> None:
    bs = broker_set({1: "dc-b", 2: "", 3: "dc-a", 4: "dc-b"}, 1, {1})
    assert required_datacenters(None, bs) == ("dc-a", "dc-b")
    assert required_datacenters([], bs) == ("dc-a", "dc-b")
    assert required_datacenters(None, broker_set({1: "", 2: ""}, 1, {1})) == ()


# --- PL2-PL5: the broker set audit, one documented scenario per row --------------------------

# (members' datacenters, master, SyncStateSet, live brokers -> max offset, declared placement,
#  expected codes in audit order, a phrase each expected reason must contain)
SET_SCENARIOS = [
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1, 2},
        {1: 1000, 2: 1000},
        {SET: TWO_DCS},
        [],
        [],
        id="p3-p4-all-well-two-dcs-in-sync-and-alive",
    ),
    # The outage: dc-b's broker is silent and the master shrank the SyncStateSet to itself. It
    # is reported as down, not also as out of sync (one cause, one violation).
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1},
        {1: 1000},
        {SET: TWO_DCS},
        ["DATACENTER_DOWN"],
        ["no live replica of broker-a in dc-b (broker 2 silent)"],
        id="p3-dc-b-down",
    ),
    # dc-b is back but still copying: acknowledged bytes live in dc-a only (BP-54's trap).
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1},
        {1: 1000, 2: 400},
        {SET: TWO_DCS},
        ["NOT_IN_SYNC"],
        ["held in dc-a only: dc-b's replica", "broker 2 600 bytes behind"],
        id="p4-dc-b-back-alive-not-yet-in-sync",
    ),
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1, 2},
        {1: 1400, 2: 1400},
        {SET: TWO_DCS},
        [],
        [],
        id="p4-dc-b-back-in-sync-is-clean",
    ),
    # A replica ahead of the master's report (heartbeats race) is 0 bytes behind, never negative.
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1},
        {1: 1000, 2: 1200},
        {SET: TWO_DCS},
        ["NOT_IN_SYNC"],
        ["broker 2 0 bytes behind"],
        id="p4-lag-never-negative",
    ),
    # Without a live master nobody knows the lag: the replica is only "catching up".
    pytest.param(
        {1: "dc-a", 2: "dc-b", 3: "dc-a"},
        1,
        {1, 3},
        {2: 10, 3: 50},
        {SET: TWO_DCS},
        ["NOT_IN_SYNC"],
        ["broker 2 catching up"],
        id="p4-lag-unknown-without-live-master",
    ),
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1, 2},
        {1: 0, 2: 0},
        {SET: ("dc-a", "dc-b", "dc-c")},
        ["NO_REPLICA"],
        ["no replica of broker-a is registered in dc-c"],
        id="p2-no-member-in-declared-dc",
    ),
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        None,
        {1, 2},
        {1: 0, 2: 0},
        {SET: TWO_DCS},
        ["NO_MASTER"],
        ["broker-a has no master"],
        id="p5-no-master",
    ),
    # PL1 undeclared: the labels dc-a and dc-b make two required datacenters.
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1},
        {1: 500, 2: 200},
        {},
        ["NOT_IN_SYNC"],
        ["broker 2 300 bytes behind"],
        id="p1-undeclared-uses-labels-not-in-sync",
    ),
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1, 2},
        {1: 500},
        {},
        ["DATACENTER_DOWN"],
        ["in dc-b (broker 2 silent)"],
        id="p1-undeclared-uses-labels-down",
    ),
    # One required datacenter: sync is the broker's business, not a placement violation.
    pytest.param(
        {1: "dc-a", 2: "dc-a"}, 1, {1}, {1: 500, 2: 0}, {}, [], [], id="p1-p4-single-dc-never-not-in-sync"
    ),
    pytest.param(
        {1: "dc-a", 2: "dc-b"},
        1,
        {1},
        {1: 500, 2: 0},
        {SET: ("dc-a",)},
        [],
        [],
        id="p1-p4-declared-single-dc-overrides-labels",
    ),
    pytest.param({1: "", 2: ""}, 1, {1}, {1: 500}, {}, [], [], id="p1-unlabelled-members-require-nothing"),
]


@pytest.mark.parametrize(
    ("dcs", "master", "sss", "offsets", "declared", "expected", "phrases"), SET_SCENARIOS
)
def test_p2_p5_broker_set_audit(
    dcs: dict[int, str],
    master: int | None,
    sss: set[int],
    offsets: dict[int, int],
    declared: dict[str, tuple[str, ...]],
    expected: list[str],
    phrases: list[str],
) -> None:
    bs = broker_set(dcs, master, sss)
    got = audit(state_of(bs), declared, {SET: live(offsets)})
    assert codes(got) == expected, got
    for v in got:
        assert (v.kind, v.name, v.broker_set) == (BROKER_SET, SET, SET)
        for phrase in phrases:
            assert phrase in v.reason, (phrase, v.reason)
    # audit() is audit_broker_set over the required datacenters, sorted
    direct = audit_broker_set(bs, required_datacenters(declared.get(SET), bs), live(offsets))
    assert sorted(direct) == got


def test_p4_names_every_missing_datacenter_and_every_lagging_replica() -> None:
    # Three datacenters; only dc-a is in the SyncStateSet: both others are named with their lag.
    bs = broker_set({1: "dc-a", 2: "dc-b", 3: "dc-c", 4: "dc-c"}, 1, {1})
    got = audit(state_of(bs), {}, {SET: live({1: 900, 2: 100, 3: 800, 4: 850})})
    assert codes(got) == ["NOT_IN_SYNC", "NOT_IN_SYNC"]
    reasons = sorted(v.reason for v in got)
    assert "dc-b's replica" in reasons[0] and "broker 2 800 bytes behind" in reasons[0]
    assert "dc-c's replica" in reasons[1]
    assert "broker 3 100 bytes behind; broker 4 50 bytes behind" in reasons[1]


def test_p2_declared_broker_set_that_never_registered_is_no_replica_in_each_dc() -> None:
    got = audit(ControllerState(), {"broker-b": TWO_DCS}, {})
    assert [(v.kind, v.name, v.code, v.broker_set) for v in got] == [
        (BROKER_SET, "broker-b", "NO_REPLICA", "broker-b"),
        (BROKER_SET, "broker-b", "NO_REPLICA", "broker-b"),
    ]
    assert ["in dc-a" in got[0].reason, "in dc-b" in got[1].reason] == [True, True]


def test_audit_covers_every_set_and_is_sorted() -> None:
    a = broker_set({1: "dc-a", 2: "dc-b"}, None, {1, 2}, name="broker-a")
    b = broker_set({1: "dc-a", 2: "dc-b"}, 1, {1}, name="broker-b")
    got = audit(
        state_of(b, a), {"broker-c": ("dc-a",)}, {"broker-a": live({1: 0, 2: 0}), "broker-b": live({1: 0})}
    )
    assert [(v.name, v.code) for v in got] == [
        ("broker-a", "NO_MASTER"),
        ("broker-b", "DATACENTER_DOWN"),
        ("broker-c", "NO_REPLICA"),
    ]
    assert got == sorted(got)


# --- PL6: ledgers --------------------------------------------------------------------------

# Set: 1 dc-a (master), 2 dc-b, 3 dc-a; broker 9 was replaced and is no longer a member.
LEDGER_SET = {1: "dc-a", 2: "dc-b", 3: "dc-a"}


@pytest.mark.parametrize(
    ("ledger", "sss", "offsets", "expected", "phrase"),
    [
        pytest.param(LedgerPlacement(7, SET, (1, 2)), {1, 2, 3}, {1: 0, 2: 0, 3: 0}, [], "", id="clean"),
        pytest.param(
            LedgerPlacement(7, SET, (1, 2, 9)),
            {1, 2, 3},
            {1: 0, 2: 0, 3: 0},
            ["REPLICA_GONE"],
            "ensemble names broker 9, no longer a member of broker-a",
            id="ensemble-names-removed-broker",
        ),
        pytest.param(
            LedgerPlacement(7, SET, (1, 3)),
            {1, 2, 3},
            {1: 0, 2: 0, 3: 0},
            ["ENSEMBLE_ONE_DATACENTER"],
            "ledger 7's ensemble has no replica in dc-b",
            id="ensemble-in-one-dc-of-two",
        ),
        pytest.param(
            LedgerPlacement(7, SET, (1, 2)),
            {1, 3},
            {1: 0, 3: 0},
            ["BROKER_SET_DEGRADED"],
            "no live replica of broker-a in dc-b",
            id="set-degraded-by-dc-down",
        ),
        pytest.param(
            LedgerPlacement(7, SET, (1, 2)),
            {1, 3},
            {1: 50, 2: 20, 3: 50},
            ["BROKER_SET_DEGRADED"],
            "broker 2 30 bytes behind",
            id="set-degraded-by-not-in-sync",
        ),
        # A removed broker and a missing datacenter at once: both are reported.
        pytest.param(
            LedgerPlacement(7, SET, (1, 9)),
            {1, 2, 3},
            {1: 0, 2: 0, 3: 0},
            ["ENSEMBLE_ONE_DATACENTER", "REPLICA_GONE"],
            "ledger 7",
            id="gone-and-one-dc",
        ),
        pytest.param(
            LedgerPlacement(7, SET, (1, 9), deleted=True), {1, 3}, {1: 0}, [], "", id="deleted-not-audited"
        ),
        pytest.param(
            LedgerPlacement(7, "broker-z", (1, 2)),
            {1, 2, 3},
            {1: 0, 2: 0, 3: 0},
            ["REPLICA_GONE"],
            "broker set broker-z no longer exists",
            id="unknown-broker-set",
        ),
    ],
)
def test_p6_ledger_audit(
    ledger: LedgerPlacement, sss: set[int], offsets: dict[int, int], expected: list[str], phrase: str
) -> None:
    bs = broker_set(LEDGER_SET, 1, sss)
    got = [v for v in audit(state_of(bs), {SET: TWO_DCS}, {SET: live(offsets)}, [ledger]) if v.kind == LEDGER]
    assert codes(got) == expected, got
    for v in got:
        assert (v.name, v.broker_set) == ("7", ledger.broker_set)
        assert phrase in v.reason, v.reason


def test_p6_one_datacenter_ensemble_is_fine_when_one_datacenter_is_required() -> None:
    bs = broker_set(LEDGER_SET, 1, {1, 2, 3})
    assert audit_ledger(LedgerPlacement(3, SET, (1, 3)), bs, ("dc-a",), []) == []
    # the same ensemble is a violation once a second datacenter is required
    assert codes(audit_ledger(LedgerPlacement(3, SET, (1, 3)), bs, TWO_DCS, [])) == [
        "ENSEMBLE_ONE_DATACENTER"
    ]


def test_p6_only_down_and_not_in_sync_degrade_a_ledger() -> None:
    # NO_MASTER and NO_REPLICA of the set are the set's problem; they do not make the ledger's
    # entries live in fewer datacenters than its ensemble says.
    bs = broker_set(LEDGER_SET, 1, {1, 2, 3})
    others = [Violation(BROKER_SET, SET, code, SET, code) for code in ("NO_MASTER", "NO_REPLICA")]
    assert audit_ledger(LedgerPlacement(3, SET, (1, 2)), bs, TWO_DCS, others) == []


def _store(
    state: ControllerState, ledger_id: int, replicas: Sequence[int], broker_set_name: str = SET
) -> None:
    meta = new_ledger_metadata(ledger_id, broker_set_name, replicas, 1, password=b"pw")
    result = state.apply(MetaCreate(key=ledger_key(ledger_id), value=meta.encode(), now_ms=1))
    assert result.code == "OK", result


def test_p6_ledger_placements_reads_the_current_ensemble_of_every_stored_ledger() -> None:
    state = ControllerState()
    _store(state, 12, (1, 2))
    _store(state, 3, (2, 3), "broker-b")
    # An ensemble change: the ledger's new entries go to the last ensemble, so that is the one audited.
    changed = dataclasses.replace(
        new_ledger_metadata(40, SET, (1, 2), 1, password=b"pw"), ensembles=((0, (1, 2)), (10, (1, 4)))
    )
    state.metadata[ledger_key(40)] = MetaEntry(ledger_key(40), changed.encode(), version=2)
    # Not ledger metadata: skipped rather than failing the whole audit.
    state.metadata[ledger_key(41)] = MetaEntry(ledger_key(41), b"not json", version=1)
    assert state.apply(MetaCreate(key="config/other", value=b"{}", now_ms=1)).code == "OK"

    assert list(ledger_placements(state)) == [
        LedgerPlacement(3, "broker-b", (2, 3), key=ledger_key(3), replicas=(2, 3)),
        LedgerPlacement(12, SET, (1, 2), key=ledger_key(12), replicas=(1, 2)),
        # every broker any ensemble names: all of them hold some of its entries
        LedgerPlacement(40, SET, (1, 4), key=ledger_key(40), replicas=(1, 2, 4)),
    ]


def test_p6_stored_ledgers_flow_into_the_audit() -> None:
    state = state_of(broker_set(LEDGER_SET, 1, {1, 2, 3}))
    _store(state, 5, (1, 3))  # both in dc-a
    _store(state, 6, (1, 2))  # dc-a and dc-b: fine
    got = audit(state, {SET: TWO_DCS}, {SET: live({1: 0, 2: 0, 3: 0})}, ledger_placements(state))
    assert [(v.kind, v.name, v.code) for v in got] == [(LEDGER, "5", "ENSEMBLE_ONE_DATACENTER")]


# --- PL7: decommission and replacement ------------------------------------------------------

# 1 dc-a (master), 2 dc-b, 3 dc-b, 4 dc-a
DECOM_SET = {1: "dc-a", 2: "dc-b", 3: "dc-b", 4: "dc-a"}


@pytest.mark.parametrize(
    ("dcs", "master", "sss", "required", "broker", "force", "refusal"),
    [
        pytest.param(DECOM_SET, 1, {1, 2}, TWO_DCS, 1, False, "is the master of broker-a", id="master"),
        pytest.param(
            DECOM_SET, 1, {1, 2}, TWO_DCS, 1, True, "is the master of broker-a", id="master-even-forced"
        ),
        # The master died and was cleared: broker 2 alone holds every acknowledged byte.
        pytest.param(DECOM_SET, None, {2}, TWO_DCS, 2, False, "last in-sync replica", id="last-in-sync"),
        pytest.param(
            DECOM_SET, None, {2}, TWO_DCS, 2, True, "last in-sync replica", id="last-in-sync-even-forced"
        ),
        pytest.param(
            DECOM_SET,
            1,
            {1, 2},
            TWO_DCS,
            2,
            False,
            "only in-sync replica of broker-a in dc-b",
            id="only-remote-in-sync",
        ),
        # An unlabelled in-sync member holds no required datacenter: broker 2 is still dc-b's only one.
        pytest.param(
            {1: "dc-a", 2: "dc-b", 3: "", 4: "dc-b"},
            1,
            {1, 2, 3},
            TWO_DCS,
            2,
            False,
            "only in-sync replica of broker-a in dc-b",
            id="unlabelled-does-not-cover",
        ),
        pytest.param(
            {1: "dc-a", 2: "dc-b", 3: "dc-c", 4: "dc-b"},
            1,
            {1, 2, 3},
            TWO_DCS,
            2,
            False,
            "only in-sync replica of broker-a in dc-b",
            id="unrequired-dc-does-not-cover",
        ),
        pytest.param(DECOM_SET, 1, {1, 2}, TWO_DCS, 2, True, None, id="only-remote-in-sync-forced"),
        pytest.param(DECOM_SET, 1, {1, 2, 3}, TWO_DCS, 2, False, None, id="another-remote-stays-in-sync"),
        pytest.param(DECOM_SET, 1, {1, 2}, TWO_DCS, 3, False, None, id="out-of-sync-replica"),
        pytest.param(DECOM_SET, 1, {1, 2, 4}, TWO_DCS, 4, False, None, id="home-dc-replica"),
        # Nothing is in sync outside dc-a yet: removing a dc-a replica loses nothing that is there.
        pytest.param(DECOM_SET, 1, {1, 4}, TWO_DCS, 4, False, None, id="no-remote-to-lose"),
        pytest.param(DECOM_SET, 1, {1, 2}, ("dc-a",), 2, False, None, id="single-dc-placement"),
        pytest.param(
            DECOM_SET, 1, {1, 2}, TWO_DCS, 9, False, "broker 9 is not a member of broker-a", id="non-member"
        ),
        pytest.param(
            DECOM_SET,
            1,
            {1, 2},
            TWO_DCS,
            9,
            True,
            "broker 9 is not a member of broker-a",
            id="non-member-forced",
        ),
    ],
)
def test_p7_decommission_problem(
    dcs: dict[int, str],
    master: int | None,
    sss: set[int],
    required: tuple[str, ...],
    broker: int,
    force: bool,
    refusal: str | None,
) -> None:
    problem = decommission_problem(broker_set(dcs, master, sss), broker, required, force=force)
    if refusal is None:
        assert problem is None
    else:
        assert problem is not None and refusal in problem, problem


REPLACE_SET = broker_set({1: "dc-a", 2: "dc-b", 3: "dc-b", 4: "dc-a", 5: "dc-b", 6: "dc-b"}, 1, {1, 3, 4, 5})
REPLACE_ALIVE = (1, 3, 4, 6)  # 2 (the broker being replaced) and 5 are silent


@pytest.mark.parametrize(
    ("old", "new", "force", "refusal"),
    [
        pytest.param(2, 2, False, "cannot replace itself", id="self"),
        pytest.param(2, 9, False, "broker 9 is not a member of broker-a", id="not-a-member"),
        pytest.param(2, 5, False, "broker 5 of broker-a is not alive", id="not-alive"),
        pytest.param(2, 6, False, "broker 6 is not in the SyncStateSet of broker-a", id="not-in-sync"),
        pytest.param(2, 6, True, "not in the SyncStateSet", id="not-in-sync-even-forced"),
        pytest.param(2, 4, False, "broker 4 is in dc-a, broker 2 in dc-b: pass --force", id="other-dc"),
        pytest.param(2, 4, True, None, id="other-dc-forced"),
        pytest.param(2, 3, False, None, id="same-dc-in-sync-alive"),
    ],
)
def test_p7_replacement_problem(old: int, new: int, force: bool, refusal: str | None) -> None:
    # alive given as a generator: the function must accept any iterable, once
    problem = replacement_problem(REPLACE_SET, old, new, (i for i in REPLACE_ALIVE), force=force)
    if refusal is None:
        assert problem is None
    else:
        assert problem is not None and refusal in problem, problem


# --- the monitor ----------------------------------------------------------------------------


def test_monitor_reports_opened_and_cleared_and_keeps_since() -> None:
    down = Violation(BROKER_SET, SET, "DATACENTER_DOWN", SET, "no live replica in dc-b")
    behind = Violation(BROKER_SET, SET, "NOT_IN_SYNC", SET, "broker 2 600 bytes behind")
    ledger = Violation(LEDGER, "7", "BROKER_SET_DEGRADED", SET, "degraded")
    mon = PlacementMonitor()
    assert mon.audited_ms is None

    opened, cleared = mon.step([behind, down], 100)
    assert (opened, cleared) == ([down, behind], [])  # sorted by key
    assert mon.since_ms == {down.key: 100, behind.key: 100}
    assert (mon.current, mon.audited_ms) == ([down, behind], 100)

    # The lag changes (new reason, same key): still the same violation, open since 100.
    behind_later = dataclasses.replace(behind, reason="broker 2 20 bytes behind")
    opened, cleared = mon.step([ledger, behind_later], 200)
    assert (opened, cleared) == ([ledger], [down])
    assert mon.since_ms == {behind.key: 100, ledger.key: 200}
    assert mon.current == sorted([ledger, behind_later])

    opened, cleared = mon.step([], 300)
    # cleared names the violations as last seen (the latest reason), sorted by key
    assert (opened, cleared) == ([], [behind_later, ledger])
    assert (mon.since_ms, mon.current, mon.audited_ms) == ({}, [], 300)
    # the events (`tide placement status`) keep every change after the violations cleared, oldest first
    assert [(at, is_open, v.code) for at, is_open, v in mon.events] == [
        (100, True, "DATACENTER_DOWN"),
        (100, True, "NOT_IN_SYNC"),
        (200, True, "BROKER_SET_DEGRADED"),
        (200, False, "DATACENTER_DOWN"),
        (300, False, "NOT_IN_SYNC"),
        (300, False, "BROKER_SET_DEGRADED"),
    ]


def test_monitor_reopens_a_violation_that_cleared() -> None:
    down = Violation(BROKER_SET, SET, "DATACENTER_DOWN", SET, "r")
    mon = PlacementMonitor()
    mon.step([down], 10)
    mon.step([], 20)
    assert mon.step([down], 30) == ([down], [])
    assert mon.since_ms == {down.key: 30}


# --- properties over random broker sets -------------------------------------------------------

LABELS = ["dc-a", "dc-b", "dc-c", ""]


@dataclasses.dataclass
class Scenario:
    bs: BrokerSet
    alive: dict[int, LiveInfo]
    declared: tuple[str, ...] | None

    @property
    def required(self) -> tuple[str, ...]:
        return required_datacenters(self.declared, self.bs)

    def run_audit(self) -> list[Violation]:
        declared = {SET: self.declared} if self.declared else {}
        return audit(state_of(self.bs), declared, {SET: self.alive})


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(1, 4))
    ids = list(range(1, n + 1))
    dcs = {i: draw(st.sampled_from(LABELS)) for i in ids}
    master = draw(st.none() | st.sampled_from(ids))
    sss = set(draw(st.sets(st.sampled_from(ids))))
    if master is not None:
        sss.add(master)  # the master is always in its SyncStateSet
    alive_ids = draw(st.sets(st.sampled_from(ids)))
    alive = {i: LiveInfo(epoch=1, max_offset=draw(st.integers(0, 10**6))) for i in sorted(alive_ids)}
    declared = draw(
        st.none() | st.lists(st.sampled_from(LABELS[:3]), min_size=1, max_size=3, unique=True).map(tuple)
    )
    return Scenario(broker_set(dcs, master, sss), alive, declared)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_property_audit_is_deterministic_sorted_and_names_its_set(sc: Scenario) -> None:
    got = sc.run_audit()
    assert got == sorted(got)
    assert got == sc.run_audit()
    # Dict order of members and live brokers must not matter.
    shuffled = dataclasses.replace(sc.bs, members=dict(reversed(list(sc.bs.members.items()))))
    declared = {SET: sc.declared} if sc.declared else {}
    assert audit(state_of(shuffled), declared, {SET: dict(reversed(list(sc.alive.items())))}) == got
    for v in got:
        assert (v.kind, v.name, v.broker_set) == (BROKER_SET, SET, SET)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_property_p4_not_in_sync_exactly_when_a_live_required_dc_is_outside_the_sss(sc: Scenario) -> None:
    required = sc.required
    sss_dcs = {sc.bs.members[i].datacenter for i in sc.bs.sync_state_set}
    not_in_sync = [v for v in sc.run_audit() if v.code == "NOT_IN_SYNC"]
    if all(dc in sss_dcs for dc in required):
        assert not_in_sync == []
    # and conversely: a required dc with a live member but no in-sync one is reported, once
    lagging = [
        dc
        for dc in required
        if dc not in sss_dcs and any(m.datacenter == dc and i in sc.alive for i, m in sc.bs.members.items())
    ]
    assert len(not_in_sync) == (len(lagging) if len(required) >= 2 else 0)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.booleans())
def test_property_p7_master_and_sole_in_sync_replica_are_never_decommissioned(
    sc: Scenario, force: bool
) -> None:
    bs = sc.bs
    if bs.master_id is not None:
        assert decommission_problem(bs, bs.master_id, sc.required, force=force) is not None
    if len(bs.sync_state_set) == 1:
        (sole,) = bs.sync_state_set
        assert decommission_problem(bs, sole, sc.required, force=force) is not None


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.integers(1, 4))
def test_property_p7_an_allowed_decommission_keeps_every_required_dc_the_sss_holds(
    sc: Scenario, broker: int
) -> None:
    bs, required = sc.bs, sc.required
    if decommission_problem(bs, broker, required, force=False) is not None:
        return
    assert broker in bs.members and broker != bs.master_id
    if len(required) < 2:
        return

    def held(ids: Iterable[int]) -> set[str]:
        return {bs.members[i].datacenter for i in ids} & set(required)

    assert held(bs.sync_state_set - {broker}) == held(bs.sync_state_set)


# --- PL8: re-replication of ledgers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "sss", "alive", "expected"),
    [
        # broker 2 (dc-b) left; broker 5 (dc-b) is in sync: it takes 2's place
        pytest.param((1, 2), {1, 3, 5}, {1, 3, 5}, ((2, 5),), id="prefers-the-missing-datacenter"),
        # no live in-sync replica beyond those already named: wait for one to catch up
        pytest.param((1, 2), {1}, {1, 5}, (), id="no-candidate-yet"),
        pytest.param((1, 3), {1, 3, 5}, {1, 3, 5}, (), id="nothing-gone"),
        # a dc-a replacement only when no dc-b one is in sync
        pytest.param((1, 2), {1, 3}, {1, 3}, ((2, 3),), id="falls-back-to-another-datacenter"),
    ],
)
def test_p8_ledger_repair_picks_a_live_in_sync_replacement(
    replicas: tuple[int, ...], sss: set[int], alive: set[int], expected: tuple[tuple[int, int], ...]
) -> None:
    bs = broker_set({1: "dc-a", 3: "dc-a", 5: "dc-b"}, 1, sss)
    ledger = LedgerPlacement(7, SET, replicas, key=ledger_key(7), replicas=replicas)
    assert ledger_repair(ledger, bs, TWO_DCS, alive) == expected


def applied_state(dcs: Mapping[int, str], master: int, sss: Iterable[int]) -> ControllerState:
    """A state whose broker set also passes the state machine's invariants (ids, epochs)."""
    bs = dataclasses.replace(
        broker_set(dcs, master, sss), next_broker_id=max(dcs) + 1, master_epoch=1, sss_epoch=1
    )
    return state_of(bs)


def _replace(state: ControllerState, pairs: tuple[tuple[int, int], ...], ledger_id: int = 9) -> Result:
    return state.apply(ReplaceLedgerReplicas(SET, ((ledger_key(ledger_id), pairs),), now_ms=5))


def test_p8_replace_ledger_replicas_rewrites_every_ensemble_and_nothing_else() -> None:
    state = applied_state({1: "dc-a", 5: "dc-b"}, 1, {1, 5})
    meta = dataclasses.replace(
        new_ledger_metadata(9, SET, (1, 2), 1, password=b"pw"), ensembles=((0, (1, 2)), (10, (2, 1)))
    )
    state.metadata[ledger_key(9)] = MetaEntry(ledger_key(9), meta.encode(), version=3)
    result = _replace(state, ((2, 5),))
    assert result.ok and result.value == [ledger_key(9)]
    entry = state.metadata[ledger_key(9)]
    after = LedgerMetadata.decode(entry.value)
    assert entry.version == 4 and after.ensembles == ((0, (1, 5)), (10, (5, 1)))
    assert dataclasses.replace(after, ensembles=meta.ensembles) == meta  # state, end, password unchanged
    assert after.password_hash == meta.password_hash


@pytest.mark.parametrize(
    ("pairs", "code"),
    [
        pytest.param(((1, 5),), "PLACEMENT_REFUSED", id="old-still-a-member"),
        pytest.param(((2, 6),), "PLACEMENT_REFUSED", id="new-not-in-sync"),
        pytest.param(((2, -1),), "INVALID_ARGUMENT", id="bad-id"),
    ],
)
def test_p8_replace_ledger_replicas_refusals_change_nothing(
    pairs: tuple[tuple[int, int], ...], code: str
) -> None:
    state = applied_state({1: "dc-a", 5: "dc-b", 6: "dc-b"}, 1, {1, 5})
    _store(state, 9, (1, 2))
    before = state.metadata[ledger_key(9)]
    assert _replace(state, pairs).code == code
    assert state.metadata[ledger_key(9)] == before


def test_p8_a_ledger_deleted_since_the_plan_is_skipped_and_the_others_repaired() -> None:
    state = applied_state({1: "dc-a", 5: "dc-b"}, 1, {1, 5})
    _store(state, 9, (1, 2))
    result = state.apply(
        ReplaceLedgerReplicas(SET, ((ledger_key(77), ((2, 5),)), (ledger_key(9), ((2, 5),))), now_ms=5)
    )
    assert result.ok and result.value == [ledger_key(9)]
    twice = ReplaceLedgerReplicas(SET, ((ledger_key(9), ((5, 6),)), (ledger_key(9), ((5, 6),))), now_ms=6)
    assert state.apply(twice).code == "INVALID_ARGUMENT"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 6), min_size=2, max_size=2, unique=True), min_size=1, max_size=4),
    st.dictionaries(st.integers(0, 6), st.integers(0, 6), max_size=3),
)
def test_property_p8_replacement_keeps_keys_sizes_and_distinct_replicas(
    ensembles: list[list[int]], pairs: dict[int, int]
) -> None:
    meta = dataclasses.replace(
        new_ledger_metadata(1, SET, tuple(ensembles[0]), 1, password=b"pw"),
        ensembles=tuple((10 * n, tuple(e)) for n, e in enumerate(ensembles)),
    )
    after = meta.with_replicas_replaced(pairs)  # its own validation refuses duplicates or wrong sizes
    assert [k for k, _ in after.ensembles] == [k for k, _ in meta.ensembles]
    for (_, old), (_, new) in zip(meta.ensembles, after.ensembles, strict=True):
        assert all(b == a or pairs.get(a) == b for a, b in zip(old, new, strict=True))


def test_p7_no_master_or_no_other_live_in_sync_replica_is_refused_unless_forced() -> None:
    # After a failed election (E7) the set has no master: its replicas' logs may differ, and the
    # one to be removed may hold what the others lack.
    leaderless = broker_set({1: "dc-a", 2: "dc-b", 3: "dc-b"}, None, {1, 2})
    assert "has no master" in (decommission_problem(leaderless, 2, TWO_DCS) or "")
    assert decommission_problem(leaderless, 2, TWO_DCS, force=True) is None
    # The only other in-sync replica is down: broker 2 may be the only reachable copy.
    bs = broker_set({1: "dc-a", 2: "dc-b", 3: "dc-b"}, 1, {1, 2, 3})
    assert "no other in-sync replica" in (decommission_problem(bs, 2, TWO_DCS, alive={2}) or "")
    assert decommission_problem(bs, 2, TWO_DCS, alive={1, 2, 3}) is None  # broker 3 keeps dc-b in sync
    assert decommission_problem(bs, 2, TWO_DCS, alive={2}, force=True) is None


# --- the leader's incremental view of the ledgers (controller/ledgerview.py) ------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),
            st.sampled_from([SET, "broker-b", "broker-z"]),
            st.lists(st.sampled_from([1, 2, 3, 4, 9]), min_size=1, max_size=3, unique=True),
        ),
        max_size=25,
        unique_by=lambda t: t[0],
    ),
    st.sets(st.sampled_from([1, 2, 3, 4])),
    st.sets(st.sampled_from([1, 2, 3, 4]), min_size=1),
)
def test_grouped_ledgers_are_audited_as_each_ledger_alone(
    ledgers: list[tuple[int, str, list[int]]], alive: set[int], sss: set[int]
) -> None:
    """Ledgers alike in broker set, ensemble and replicas checked once per group give the very
    violations of checking each: same codes, same ledgers, same reasons."""
    state = state_of(
        broker_set({1: "dc-a", 2: "dc-b", 3: "dc-a", 4: "dc-b"}, 1, sss),
        broker_set({1: "dc-a", 2: "dc-a", 3: "dc-b"}, 2, {2}, name="broker-b"),
    )
    for ledger_id, name, replicas in ledgers:
        _store(state, ledger_id, replicas, name)
    declared = {SET: TWO_DCS}
    health = {SET: live(dict.fromkeys(alive, 0)), "broker-b": live({2: 0})}
    view = LedgerView()
    view.complete(state)
    flat = audit(state, declared, health, ledger_placements(state))
    assert audit(state, declared, health, ledger_groups=view.groups()) == flat
    assert view.placements() == list(ledger_placements(state))


def test_the_ledger_view_decodes_within_its_budget_and_follows_changes() -> None:
    state = ControllerState()
    for ledger_id in range(10):
        _store(state, ledger_id, (1, 2))
    view = LedgerView()
    view.refresh(state, budget=4)
    assert len(view.placements()) == 4 and view.pending == 6  # the rest at later audits
    view.refresh(state, budget=4)
    assert len(view.placements()) == 8
    view.complete(state)
    assert view.placements() == list(ledger_placements(state)) and view.pending == 0
    assert [len(list(g)) for g in view.groups()] == [10]  # all alike: one group

    # a new ensemble for one, one deleted, one created, through the state's commands
    changed = dataclasses.replace(
        new_ledger_metadata(4, SET, (1, 2), 1, password=b"pw"), ensembles=((0, (1, 2)), (10, (1, 4)))
    )
    pw = hash_password(b"pw")
    assert state.apply(MetaCompareAndSet(ledger_key(4), changed.encode(), 1, 2, ledger_password_hash=pw)).ok
    assert state.apply(MetaDelete(ledger_key(7), 1, 2, ledger_password_hash=pw)).ok
    _store(state, 30, (2, 3))
    view.complete(state)
    assert view.placements() == list(ledger_placements(state))
    assert sorted(len(list(g)) for g in view.groups()) == [1, 1, 8]

    # more changes than the state's log keeps: every key is looked at again
    state.meta_changes = MetaChanges(keep=2)
    for ledger_id in (40, 41, 42):
        _store(state, ledger_id, (1, 3))
    view.complete(state)
    assert view.placements() == list(ledger_placements(state))

    other = ControllerState()  # a snapshot loaded: a new state object
    _store(other, 1, (1, 2))
    view.refresh(other)
    assert view.placements() == list(ledger_placements(other))


@settings(max_examples=200, deadline=None)
@given(
    st.sets(st.integers(0, 60), max_size=45),
    st.lists(
        st.tuples(
            st.sampled_from(["create", "delete", "move", "refresh", "refresh"]),
            st.integers(0, 60),
            st.integers(1, 3),
        ),
        max_size=60,
    ),
)
def test_a_view_refreshed_a_slice_at_a_time_ends_as_one_refreshed_whole(
    initial: set[int], steps: list[tuple[str, int, int]]
) -> None:
    """Scans and decodes spread over many small refreshes (budgets of 1 to 3: 3 to 9 keys a
    slice), with ledgers created, deleted and moved to another ensemble between them and the
    change log overflowing (a scan again), end in the view that one whole refresh gives: a key
    changed behind a scan is looked at again, and a key gone before a scan is dropped."""
    state = ControllerState()
    # a change log of 3: more changes than that between two refreshes start a scan again
    state.meta_changes = MetaChanges(keep=3)
    for ledger_id in sorted(initial):
        _store(state, ledger_id, (1, 2))
    pw = hash_password(b"pw")
    view = LedgerView()
    for op, ledger_id, budget in steps:
        key = ledger_key(ledger_id)
        entry = state.metadata.get(key)
        if op == "create" and entry is None:
            _store(state, ledger_id, (2, 3))
        elif op == "delete" and entry is not None:
            assert state.apply(MetaDelete(key, entry.version, 2, ledger_password_hash=pw)).ok
        elif op == "move" and entry is not None:
            moved = dataclasses.replace(
                LedgerMetadata.decode(entry.value), ensembles=((0, (1, 2)), (5, (1, 4)))
            )
            cas = MetaCompareAndSet(key, moved.encode(), entry.version, 2, ledger_password_hash=pw)
            assert state.apply(cas).ok
        elif op == "refresh":  # changes pile up between refreshes, as between leader ticks
            view.refresh(state, budget=budget)
    view.complete(state)
    assert not view.busy
    assert view.placements() == list(ledger_placements(state))
    whole = LedgerView()
    whole.complete(state)
    assert sorted(sorted(lp.key for lp in g) for g in view.groups()) == sorted(
        sorted(lp.key for lp in g) for g in whole.groups()
    )


def test_a_scan_in_slices_drops_what_went_before_it_and_looks_again_behind_itself() -> None:
    state = ControllerState()
    state.meta_changes = MetaChanges(keep=3)
    for ledger_id in range(30):
        _store(state, ledger_id, (1, 2))
    pw = hash_password(b"pw")
    view = LedgerView()
    view.complete(state)
    # gone before the scan: deleted, then more changes than the log keeps (a scan again)
    gone = state.metadata[ledger_key(2)]
    assert state.apply(MetaDelete(ledger_key(2), gone.version, 2, ledger_password_hash=pw)).ok
    for ledger_id in range(40, 44):
        _store(state, ledger_id, (1, 2))
    view.refresh(state, budget=1)  # a slice of 3 keys of the 33 the scan took
    assert view.busy
    # behind the scan: a key it has looked at already, deleted, and one created
    behind = state.metadata[ledger_key(0)]
    assert state.apply(MetaDelete(ledger_key(0), behind.version, 2, ledger_password_hash=pw)).ok
    _store(state, 50, (2, 3))
    while view.busy:
        view.refresh(state, budget=1)
    view.refresh(state, budget=1)  # what changed during the scan
    assert view.placements() == list(ledger_placements(state))
    assert {0, 2} & {lp.ledger_id for lp in view.placements()} == set()


def test_the_metadata_change_log_names_the_keys_since_a_serial() -> None:
    log = MetaChanges(keep=3)
    assert log.since(0) == []
    for key in ("a", "b", "c", "b"):
        log.note(key)
    assert log.serial == 4
    assert log.since(4) == [] and log.since(3) == ["b"] and log.since(1) == ["b", "c", "b"]
    assert log.since(0) is None  # change 1 is no longer kept
    assert log.since(9) is None  # a serial from another state
