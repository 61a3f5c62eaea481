"""Role transitions: the table of docs/ARCHITECTURE.md §4.6 (`ha.roles.TRANSITIONS`) row by row, plus a
property over random sequences of controller assignments."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.ha.roles import (
    MASTER,
    NONE,
    SLAVE,
    TRANSITIONS,
    Assigned,
    Follow,
    Following,
    Kind,
    Promote,
    RefusePromotion,
    Role,
    RoleCore,
    StopMaster,
    StopSlave,
    UpdateSyncStateSet,
    classify,
)

ME = 1  # the broker whose roles are decided
B, C = 2, 3  # other brokers of the set
ANY = "any"  # the wildcard of TRANSITIONS' keys

ADDR = {ME: "me:9876", B: "b:9876", C: "c:9876"}
HA = {ME: "me:10912", B: "b:10912", C: "c:10912"}


def role(
    master: int | None,
    epoch: int,
    *,
    ha: str | None = None,
    sss: frozenset[int] = frozenset({ME, B}),
    sss_epoch: int = 1,
    unclean: int = 0,
) -> Role:
    if master is None:
        return Role(False, -1, "", "", epoch, frozenset(), sss_epoch, unclean)
    return Role(
        True,
        master,
        ADDR[master],
        HA[master] if ha is None else ha,
        epoch,
        frozenset(sss),
        sss_epoch,
        unclean,
    )


# --- states a replica may be in ----------------------------------------------------------


def fresh() -> RoleCore:
    """Just (re)started: no role, no epoch acted on."""
    return RoleCore()


def none_at(epoch: int) -> RoleCore:
    return RoleCore(role=NONE, master_epoch=epoch)


def master_of(epoch: int) -> RoleCore:
    return RoleCore(
        role=MASTER,
        master_epoch=epoch,
        master_id=ME,
        master_address=ADDR[ME],
        last_sss_epoch=1,
        leading=epoch,
    )


def slave_of(master: int, epoch: int, *, ha: str | None = None) -> RoleCore:
    return RoleCore(
        role=SLAVE,
        master_epoch=epoch,
        master_id=master,
        master_address=ADDR[master],
        last_sss_epoch=1,
        following=Following(master, epoch, HA[master] if ha is None else ha),
    )


# --- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: tuple[str, Kind]  # the TRANSITIONS entry the row exercises
    state: RoleCore
    assigned: Role
    last_epoch: int  # the last epoch of the replica's epoch file
    actions: tuple[type, ...]  # the action types, in order
    next_role: str
    epoch: int  # the master epoch recorded afterwards
    master_id: int  # the master recorded afterwards
    extra: dict = field(default_factory=dict)  # further attributes of the core afterwards
    vouched: bool = True  # the answering leader could vouch for its state (Assigned.vouched)


ROWS: dict[str, Row] = {
    # row 1: any | master epoch older than one already seen | ignore | unchanged
    "4_6_stale_assignment_to_a_master_is_ignored": Row(
        (ANY, Kind.STALE), master_of(5), role(B, 4), 5, (), MASTER, 5, ME, {"leading": 5}
    ),
    "4_6_stale_assignment_to_a_slave_is_ignored": Row(
        (ANY, Kind.STALE),
        slave_of(B, 5),
        role(C, 4),
        5,
        (),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, HA[B])},
    ),
    "4_6_stale_promotion_is_ignored_not_refused": Row(
        (ANY, Kind.STALE),
        slave_of(B, 5),
        role(ME, 4),
        4,
        (),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, HA[B])},
    ),
    "4_6_stale_no_master_is_ignored": Row(
        (ANY, Kind.STALE), slave_of(B, 5), role(None, 4), 5, (), SLAVE, 5, B
    ),
    # row 2: master | no master, newer epoch | stop the HA master | none
    "4_6_master_told_no_master_in_a_newer_epoch_stops_taking_writes": Row(
        (MASTER, Kind.NO_MASTER_NEWER),
        master_of(5),
        role(None, 6),
        5,
        (StopMaster,),
        NONE,
        6,
        -1,
        {"leading": None, "following": None, "master_address": ""},
    ),
    # row 3: any other | no master | record the epoch, forget the master (a slave keeps its stream)
    "4_6_slave_told_no_master_in_a_newer_epoch_keeps_its_stream": Row(
        (SLAVE, Kind.NO_MASTER_NEWER),
        slave_of(B, 5),
        role(None, 6),
        5,
        (),
        SLAVE,
        6,
        -1,
        {"following": Following(B, 5, HA[B]), "master_address": ""},
    ),
    "4_6_none_told_no_master_in_a_newer_epoch_records_it": Row(
        (NONE, Kind.NO_MASTER_NEWER), none_at(5), role(None, 6), 5, (), NONE, 6, -1
    ),
    "4_6_master_told_no_master_in_the_same_epoch_changes_role_nothing": Row(
        (ANY, Kind.NO_MASTER_SAME), master_of(5), role(None, 5), 5, (), MASTER, 5, -1, {"leading": 5}
    ),
    "4_6_slave_told_no_master_in_the_same_epoch_keeps_its_stream": Row(
        (ANY, Kind.NO_MASTER_SAME),
        slave_of(B, 5),
        role(None, 5),
        5,
        (),
        SLAVE,
        5,
        -1,
        {"following": Following(B, 5, HA[B])},
    ),
    # row 4: master of this epoch | this broker, same epoch | take the new SyncStateSet | master
    "4_6_master_of_this_epoch_takes_the_new_sync_state_set": Row(
        (MASTER, Kind.SELF_SAME_TERM),
        master_of(5),
        role(ME, 5, sss=frozenset({ME, B, C}), sss_epoch=3),
        5,
        (UpdateSyncStateSet,),
        MASTER,
        5,
        ME,
        {"leading": 5, "last_sss_epoch": 3},
    ),
    # row 5: slave / none / master of an older epoch | this broker, newer than the epoch file | promote
    "4_6_slave_promoted_to_a_new_epoch": Row(
        (ANY, Kind.SELF_NEW_TERM),
        slave_of(B, 5),
        role(ME, 6),
        5,
        (StopSlave, StopMaster, Promote),
        MASTER,
        6,
        ME,
        {"leading": 6, "following": None, "new_epoch": True},
    ),
    "4_6_none_promoted_to_a_new_epoch": Row(
        (ANY, Kind.SELF_NEW_TERM),
        none_at(5),
        role(ME, 6),
        5,
        (StopSlave, StopMaster, Promote),
        MASTER,
        6,
        ME,
        {"leading": 6, "new_epoch": True},
    ),
    "4_6_master_of_an_older_epoch_promoted_again": Row(
        (ANY, Kind.SELF_NEW_TERM),
        master_of(5),
        role(ME, 6),
        5,
        (StopSlave, StopMaster, Promote),
        MASTER,
        6,
        ME,
        {"leading": 6, "new_epoch": True},
    ),
    # row 5b: not master of it yet | this broker, from a leader that cannot vouch | nothing (seed 6343)
    "4_6_slave_not_promoted_on_the_word_of_a_leader_that_cannot_vouch": Row(
        (ANY, Kind.SELF_UNVOUCHED),
        slave_of(B, 5),
        role(ME, 6),
        5,
        (),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, HA[B]), "leading": None},
        vouched=False,
    ),
    "4_6_restarted_master_not_resumed_on_the_word_of_a_leader_that_cannot_vouch": Row(
        (ANY, Kind.SELF_UNVOUCHED),
        none_at(5),
        role(ME, 5),
        5,
        (),
        NONE,
        5,
        -1,
        {"leading": None},
        vouched=False,
    ),
    # row 6: slave / none | this broker, the epoch file's last (restarted while master) | no new entry
    "4_6_restart_as_master_of_the_same_epoch_adds_no_epoch_entry": Row(
        (ANY, Kind.SELF_NEW_TERM),
        fresh(),
        role(ME, 5),
        5,
        (StopSlave, StopMaster, Promote),
        MASTER,
        5,
        ME,
        {"leading": 5, "new_epoch": False},
    ),
    # row 7: any | this broker, epoch below the epoch file's last | refuse the promotion | unchanged
    "4_6_promotion_below_the_epoch_file_is_refused_after_a_restart": Row(
        (ANY, Kind.SELF_BEHIND_FILE),
        fresh(),
        role(ME, 6),
        7,
        (RefusePromotion,),
        NONE,
        6,
        ME,
        {"leading": None},
    ),
    "4_6_promotion_below_the_epoch_file_is_refused_by_a_slave": Row(
        (ANY, Kind.SELF_BEHIND_FILE),
        slave_of(B, 5),
        role(ME, 6),
        7,
        (RefusePromotion,),
        SLAVE,
        6,
        ME,
        {"leading": None, "following": Following(B, 5, HA[B])},
    ),
    # row 8: slave following this master, epoch and HA address | the same master | nothing | slave
    "4_6_following_the_same_master_again_does_nothing": Row(
        (SLAVE, Kind.SAME_MASTER),
        slave_of(B, 5),
        role(B, 5, sss_epoch=2),
        5,
        (),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, HA[B]), "last_sss_epoch": 2},
    ),
    # row 9: master / none / slave of another master or epoch | another broker | follow it | slave
    "4_6_none_follows_the_named_master": Row(
        (ANY, Kind.OTHER_MASTER),
        none_at(5),
        role(B, 6),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        6,
        B,
        {"following": Following(B, 6, HA[B])},
    ),
    "4_6_fresh_replica_follows_the_named_master": Row(
        (ANY, Kind.OTHER_MASTER),
        fresh(),
        role(B, 5),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, HA[B])},
    ),
    "4_6_deposed_master_follows_the_new_one": Row(
        (ANY, Kind.OTHER_MASTER),
        master_of(5),
        role(B, 6),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        6,
        B,
        {"leading": None, "following": Following(B, 6, HA[B])},
    ),
    "4_6_slave_follows_another_master": Row(
        (ANY, Kind.OTHER_MASTER),
        slave_of(B, 5),
        role(C, 6),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        6,
        C,
        {"following": Following(C, 6, HA[C])},
    ),
    "4_6_slave_refollows_its_master_in_a_new_epoch": Row(
        (ANY, Kind.OTHER_MASTER),
        slave_of(B, 5),
        role(B, 6),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        6,
        B,
        {"following": Following(B, 6, HA[B])},
    ),
    "4_6_slave_refollows_its_master_at_a_changed_ha_address": Row(
        (ANY, Kind.OTHER_MASTER),
        slave_of(B, 5),
        role(B, 5, ha="b2:10912"),
        5,
        (StopMaster, StopSlave, Follow),
        SLAVE,
        5,
        B,
        {"following": Following(B, 5, "b2:10912")},
    ),
}


def test_4_6_every_transition_of_the_table_has_a_row():
    assert {row.key for row in ROWS.values()} == set(TRANSITIONS)


@pytest.mark.parametrize("name", list(ROWS))
def test_4_6_role_transition(name: str):
    row = ROWS[name]
    core = copy.deepcopy(row.state)
    before = (core.role, core.master_epoch)
    event = Assigned(row.assigned, row.last_epoch, ME, row.vouched)

    # the row exercises the entry it names: classified as its kind, looked up under its role
    kind = classify(
        role=core.role,
        known_epoch=core.master_epoch,
        leading=core.leading,
        following=core.following,
        event=event,
    )
    assert kind is row.key[1]
    assert row.key[0] in (ANY, core.role)
    assert ((core.role, kind) in TRANSITIONS) == (row.key[0] != ANY)

    actions = core.step(event, now_ms=1000)

    assert tuple(type(a) for a in actions) == row.actions
    assert core.role == row.next_role
    assert core.master_epoch == row.epoch
    assert core.master_id == row.master_id
    for attr, value in row.extra.items():
        if attr == "new_epoch":
            continue
        assert getattr(core, attr) == value, attr
    for action in actions:
        match action:
            case Promote(assigned, new_epoch):
                assert assigned == row.assigned
                assert new_epoch is row.extra["new_epoch"]
            case Follow(assigned):
                assert assigned == row.assigned
            case RefusePromotion(epoch, last_epoch):
                assert (epoch, last_epoch) == (row.assigned.master_epoch, row.last_epoch)
            case UpdateSyncStateSet(sss, sss_epoch):
                assert (sss, sss_epoch) == (row.assigned.sync_state_set, row.assigned.sss_epoch)
    if row.key[1] in (Kind.STALE, Kind.SELF_UNVOUCHED):
        assert (core.role, core.master_epoch) == before


def test_4_6_stale_assignment_leaves_the_whole_state_as_it_was():
    core = slave_of(B, 5)
    before = copy.deepcopy(core)
    assert core.step(Assigned(role(C, 4, sss_epoch=9), 5, ME), now_ms=0) == []
    assert core == before


def test_4_6_the_same_master_after_a_promotion_refusal_is_followed_again():
    # a refusal records the epoch, but the stream still comes from the old epoch's master
    core = slave_of(B, 5)
    assert [type(a) for a in core.step(Assigned(role(ME, 6), 7, ME), now_ms=0)] == [RefusePromotion]
    assert [type(a) for a in core.step(Assigned(role(B, 7), 7, ME), now_ms=0)] == [
        StopMaster,
        StopSlave,
        Follow,
    ]
    assert core.following == Following(B, 7, HA[B])


def test_4_6_closed_replica_follows_its_master_again():
    core = slave_of(B, 5)
    core.closed()
    assert (core.role, core.leading, core.following) == (NONE, None, None)
    assert [type(a) for a in core.step(Assigned(role(B, 5), 5, ME), now_ms=0)] == [
        StopMaster,
        StopSlave,
        Follow,
    ]
    assert core.role == SLAVE


# --- property: random sequences of assignments --------------------------------------------


@st.composite
def assignments(draw: st.DrawFn) -> tuple[str, int, int | None, int, str, int, bool]:
    """(what, epoch delta, master or None, last-epoch delta, HA address, sss epoch, vouched)."""
    what = draw(st.sampled_from(["assign"] * 9 + ["close"]))
    return (
        what,
        draw(st.integers(-2, 2)),
        draw(st.sampled_from([ME, ME, B, C, None])),
        draw(st.integers(-2, 2)),
        draw(st.sampled_from(["", "moved:1"])),
        draw(st.integers(0, 5)),
        draw(st.sampled_from([True, True, False])),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(assignments(), min_size=1, max_size=40))
def test_4_6_random_assignments_keep_the_role_state_consistent(steps):
    core = RoleCore()
    for what, d_epoch, master, d_last, ha, sss_epoch, vouched in steps:
        if what == "close":
            core.closed()
            continue
        epoch = max(0, core.master_epoch + d_epoch)
        last_epoch = max(0, core.master_epoch + d_last)
        assigned = role(master, epoch, ha=ha or None, sss_epoch=sss_epoch)
        known_before = core.master_epoch
        actions = core.step(Assigned(assigned, last_epoch, ME, vouched), now_ms=0)

        assert (core.leading is not None) == (core.role == MASTER)
        assert (core.following is not None) == (core.role == SLAVE)
        assert core.master_epoch >= known_before
        if epoch < known_before:
            assert actions == []
        if not vouched:  # a leader that cannot vouch makes nobody master
            assert not any(isinstance(a, Promote) for a in actions)
        for action in actions:
            match action:
                case Promote(promoted, new_epoch):
                    assert promoted.master_id == ME and promoted.has_master
                    assert promoted.master_epoch >= last_epoch
                    assert new_epoch == (promoted.master_epoch > last_epoch)
                    assert core.leading == promoted.master_epoch
                case Follow(followed):
                    assert followed.master_id != ME and followed.has_master
                    assert core.following == Following(
                        followed.master_id, followed.master_epoch, followed.master_ha_address
                    )
                case RefusePromotion(refused, last):
                    assert refused < last == last_epoch
