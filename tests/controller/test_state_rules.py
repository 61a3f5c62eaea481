"""ControllerState.apply, rule by rule (docs/reference/rocketmq-controller-ha.md §1.2; rule ids from controller/RULES.md).

Every refusal is also checked to leave the state exactly as it was.
"""

from __future__ import annotations

import copy
import json
import pickle
import pickletools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog import errors
from tidelog.controller.state import (
    HANDLERS,
    AlterSyncStateSet,
    BrokerSet,
    CleanBrokerData,
    ControllerState,
    CreateTopic,
    DeleteTopic,
    ElectMaster,
    InvariantViolation,
    LiveInfo,
    MetaCompareAndSet,
    MetaCreate,
    MetaDelete,
    MetaEntry,
    RegisterBroker,
    ReportOffsets,
    Result,
)

A = "broker-a"


def reg(
    broker_id: int | None = None, identity: str = "id-1", address: str = "10.0.0.1:10911", name: str = A, **kw
) -> RegisterBroker:
    return RegisterBroker(
        broker_set=name,
        address=address,
        ha_address=kw.pop("ha_address", "10.0.0.1:10912"),
        identity=identity,
        broker_id=broker_id,
        now_ms=kw.pop("now_ms", 1),
        **kw,
    )


def live(*ids: int, epoch: int = 1, offset: int = 100) -> dict[int, LiveInfo]:
    return {i: LiveInfo(epoch, offset) for i in ids}


def fresh(n: int = 3) -> ControllerState:
    """broker-a with brokers 1..n registered, no election yet."""
    s = ControllerState()
    for i in range(1, n + 1):
        assert s.apply(reg(identity=f"id-{i}", address=f"10.0.0.{i}:10911")).value == i
    return s


def mastered() -> ControllerState:
    """broker-a: brokers 1..3, master 1 at epoch 1, SyncStateSet {1, 2} at epoch 2."""
    s = fresh(3)
    assert s.apply(ElectMaster(A, 1, alive=live(1, 2, 3))).ok
    assert s.apply(AlterSyncStateSet(A, 1, 1, frozenset({1, 2}), 1, alive=frozenset({1, 2, 3}))).ok
    bs = s.broker_sets[A]
    assert (bs.master_id, bs.master_epoch, bs.sync_state_set, bs.sss_epoch) == (1, 1, {1, 2}, 2)
    return s


def refused(s: ControllerState, cmd: object, code: str) -> Result:
    """Apply a command that must be refused with `code` and change nothing."""
    before = copy.deepcopy(s)
    r = s.apply(cmd)
    assert r.code == code, r
    assert not r.ok and not r.changed
    assert s == before, "a refused command changed the state"
    return r


def bs_tuple(s: ControllerState) -> tuple:
    bs = s.broker_sets[A]
    return bs.master_id, bs.master_epoch, set(bs.sync_state_set), bs.sss_epoch


# --- codes exist ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, number",
    [
        ("CONTROLLER_FENCED_MASTER_EPOCH", 2000),
        ("CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH", 2001),
        ("CONTROLLER_INVALID_MASTER", 2002),
        ("CONTROLLER_INVALID_REPLICAS", 2003),
        ("CONTROLLER_MASTER_NOT_AVAILABLE", 2004),
        ("CONTROLLER_BROKER_NOT_ALIVE", 2006),
        ("CONTROLLER_NOT_LEADER", 2007),
        ("CONTROLLER_BROKER_METADATA_NOT_EXIST", 2008),
        ("CONTROLLER_INVALID_CLEAN_BROKER_METADATA", 2009),
        ("CONTROLLER_BROKER_NEED_TO_BE_REGISTERED", 2010),
        ("CONTROLLER_MASTER_STILL_EXIST", 2011),
        ("CONTROLLER_ELECT_MASTER_FAILED", 2012),
        ("CONTROLLER_ALTER_SYNC_STATE_SET_FAILED", 2013),
        ("CONTROLLER_BROKER_ID_INVALID", 2014),
        ("TOPIC_NOT_FOUND", 17),
        ("TOPIC_EXISTS", 18),
    ],
)
def test_1_2_result_codes_are_registered_errors_with_reference_numbers(code: str, number: int) -> None:
    cls = errors.by_code(code)
    assert cls is not errors.TidelogError
    assert cls.number == number
    assert cls.hint and cls.__doc__


@pytest.mark.parametrize(
    "code",
    [
        "METADATA_EXISTS",
        "METADATA_NOT_FOUND",
        "METADATA_VERSION_MISMATCH",
        "METADATA_TOO_LARGE",
        "INVALID_ARGUMENT",
    ],
)
def test_metadata_codes_are_registered(code: str) -> None:
    assert errors.by_code(code).code == code


def test_not_leader_error_carries_the_leader_address() -> None:
    e = errors.ControllerNotLeaderError(leader="10.0.0.9:9876")
    assert e.leader == "10.0.0.9:9876" and "10.0.0.9:9876" in str(e) and e.retryable


def test_result_error_maps_to_the_exception_class() -> None:
    assert Result().error() is None
    assert isinstance(
        Result("CONTROLLER_FENCED_MASTER_EPOCH", "x").error(), errors.ControllerFencedMasterEpochError
    )


# --- registration (R1-R6) -------------------------------------------------------------------


def test_1_2_register_new_broker_creates_set_with_empty_sync_state_info() -> None:
    s = ControllerState()
    r = s.apply(reg())
    assert r.ok and r.changed and r.value == 1
    bs = s.broker_sets[A]
    assert (bs.master_id, bs.master_epoch, bs.sync_state_set, bs.sss_epoch, bs.next_broker_id) == (
        None,
        0,
        frozenset(),
        0,
        2,
    )
    assert bs.members[1].identity == "id-1" and bs.members[1].address == "10.0.0.1:10911"


def test_r1_ids_are_assigned_in_order() -> None:
    s = fresh(3)
    assert sorted(s.broker_sets[A].members) == [1, 2, 3]
    assert s.broker_sets[A].next_broker_id == 4


def test_r1_retried_new_registration_returns_the_same_id() -> None:
    s = fresh(2)
    r = s.apply(reg(identity="id-2", address="10.0.0.2:10911"))
    assert r.ok and r.value == 2 and not r.changed
    assert s.broker_sets[A].next_broker_id == 3


def test_r2_known_id_in_unknown_set_needs_registration() -> None:
    refused(fresh(1), reg(broker_id=1, name="broker-b"), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")


@pytest.mark.parametrize("bad_id", [0, 4, 99])
def test_r3_never_assigned_id_is_invalid(bad_id: int) -> None:
    refused(fresh(3), reg(broker_id=bad_id), "CONTROLLER_BROKER_ID_INVALID")


def test_r3_cleaned_id_needs_registration() -> None:
    s = fresh(3)
    assert s.apply(CleanBrokerData(A, frozenset({3}))).ok
    refused(s, reg(broker_id=3, identity="id-3"), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")


def test_r4_same_id_other_identity_is_invalid() -> None:
    refused(fresh(2), reg(broker_id=2, identity="someone-else"), "CONTROLLER_BROKER_ID_INVALID")


def test_r5_same_id_same_identity_is_idempotent() -> None:
    s = fresh(2)
    before = copy.deepcopy(s)
    r = s.apply(reg(broker_id=2, identity="id-2", address="10.0.0.2:10911"))
    assert r.ok and r.value == 2 and not r.changed
    assert s == before


def test_r5_address_update_allowed() -> None:
    s = mastered()
    r = s.apply(
        reg(
            broker_id=1,
            identity="id-1",
            address="10.9.9.9:10911",
            ha_address="10.9.9.9:10912",
            datacenter="dc2",
        )
    )
    assert r.ok and r.changed and r.value == 1
    m = s.broker_sets[A].members[1]
    assert (m.address, m.ha_address, m.datacenter) == ("10.9.9.9:10911", "10.9.9.9:10912", "dc2")
    assert bs_tuple(s) == (1, 1, {1, 2}, 2), "an address update is not a master change"


def test_r6_ids_not_reused_after_member_clean() -> None:
    s = fresh(3)
    assert s.apply(CleanBrokerData(A, frozenset({3}))).ok
    assert s.apply(reg(identity="new")).value == 4


def test_r6_ids_not_reused_after_whole_set_is_dropped() -> None:
    s = fresh(3)
    assert s.apply(CleanBrokerData(A)).ok
    assert A not in s.broker_sets
    assert s.apply(reg(identity="new")).value == 4
    refused(s, reg(broker_id=1, identity="id-1"), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")


def test_r7_the_first_registration_fixes_the_cluster_id_for_good() -> None:
    s = ControllerState()
    assert s.apply(reg(new_cluster_id="c0ffee")).ok and s.cluster_id == "c0ffee"
    # later leaders draw other ids: they never replace the first one
    assert s.apply(reg(identity="id-2", new_cluster_id="beef")).value == 2
    assert s.cluster_id == "c0ffee"
    assert s.apply(reg(broker_id=1, cluster_id="c0ffee", new_cluster_id="beef")).ok
    assert ControllerState.from_dict(s.to_dict()).cluster_id == "c0ffee"


def test_r7_a_data_directory_of_another_cluster_is_refused_and_changes_nothing() -> None:
    s = ControllerState()
    assert s.apply(reg(new_cluster_id="c0ffee")).ok
    before = s.to_dict()
    r = refused(s, reg(identity="swapped", cluster_id="other", new_cluster_id="beef"), "CLUSTER_MISMATCH")
    assert "belongs to cluster other" in r.message
    assert s.to_dict() == before


def test_r7_a_state_restored_without_a_cluster_id_takes_the_one_a_member_proves() -> None:
    # A snapshot from before cluster ids: members exist, no id. A new broker cannot fix one (the
    # members' files name theirs); a member that proves its id and identity token does.
    s = ControllerState()
    assert s.apply(reg(new_cluster_id="c0ffee")).ok
    doc = {**s.to_dict(), "format": 1}
    del doc["cluster_id"]
    old = ControllerState.from_dict(doc)
    assert old.cluster_id == ""
    assert old.apply(reg(identity="id-2", new_cluster_id="beef")).ok and old.cluster_id == ""
    refused(old, reg(broker_id=1, identity="not-id-1", cluster_id="c0ffee"), "CONTROLLER_BROKER_ID_INVALID")
    assert old.cluster_id == ""
    assert old.apply(reg(broker_id=1, cluster_id="c0ffee", new_cluster_id="beef")).ok
    assert old.cluster_id == "c0ffee"


def test_r7_a_refused_first_registration_does_not_fix_the_cluster_id() -> None:
    s = ControllerState()
    refused(s, reg(broker_id=5, new_cluster_id="c0ffee"), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")
    assert s.cluster_id == ""
    # a data directory from before cluster ids (none in its file) is still welcome
    assert s.apply(reg(new_cluster_id="beef")).ok and s.cluster_id == "beef"


@pytest.mark.parametrize(
    "cmd",
    [
        reg(name="bad name"),
        reg(name=""),
        reg(name="x" * 128),
        reg(address=""),
        reg(address="host"),
        reg(address="host:0"),
        reg(address="host:65536"),
        reg(address=":80"),
        reg(ha_address=""),
        reg(identity=""),
        reg(broker_id=-1),
        reg(broker_id=True),
        reg(datacenter="d c"),
        reg(now_ms=-1),
        reg(cluster_id="Not Hex!"),
        reg(new_cluster_id="x" * 65),
    ],
    ids=lambda c: repr(c)[15:70],
)
def test_v0_register_rejects_malformed_input(cmd: RegisterBroker) -> None:
    refused(fresh(1), cmd, "INVALID_ARGUMENT")


def test_v0_names_allow_the_documented_alphabet() -> None:
    s = ControllerState()
    assert s.apply(reg(name="Broker_a.1%-x", address="[::1]:10911")).ok


def test_report_offsets_only_move_upward() -> None:
    s = fresh(1)
    assert s.apply(ReportOffsets(A, 1, 2, 500)).changed
    assert not s.apply(ReportOffsets(A, 1, 2, 400)).changed
    assert not s.apply(ReportOffsets(A, 1, 1, 9999)).changed
    m = s.broker_sets[A].members[1]
    assert (m.last_epoch, m.last_max_offset) == (2, 500)
    assert s.apply(ReportOffsets(A, 1, 3, 0)).changed
    assert (m.last_epoch, m.last_max_offset) == (3, 0)
    refused(s, ReportOffsets("nope", 1, 3, 0), "CONTROLLER_BROKER_METADATA_NOT_EXIST")
    refused(s, ReportOffsets(A, 7, 3, 0), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")


# --- electMaster (E1-E7) --------------------------------------------------------------------


def test_1_2_elect_step1_unknown_set() -> None:
    refused(fresh(), ElectMaster("broker-z", 1, alive=live(1)), "CONTROLLER_BROKER_METADATA_NOT_EXIST")


def test_1_2_elect_step1b_unregistered_requester() -> None:
    refused(fresh(), ElectMaster(A, 9, alive=live(9)), "CONTROLLER_BROKER_NEED_TO_BE_REGISTERED")


def test_1_2_elect_step3_first_election_takes_the_requester() -> None:
    s = fresh(3)
    # broker 3 has the highest epoch, but the first election takes whoever asked first
    r = s.apply(ElectMaster(A, 2, alive={1: LiveInfo(1, 1), 2: LiveInfo(0, 0), 3: LiveInfo(9, 9)}))
    assert r.ok and r.changed
    assert bs_tuple(s) == (2, 1, {2}, 1)
    assert isinstance(r.value, BrokerSet) and r.value.master_id == 2


def test_1_2_elect_step3_first_election_requires_the_candidate_alive() -> None:
    # QUIRK: RocketMQ elects the requester at masterEpoch 0 with no liveness check
    refused(fresh(3), ElectMaster(A, 2, alive=live(1, 3)), "CONTROLLER_ELECT_MASTER_FAILED")


def test_1_2_elect_step3_first_designated_election_requires_alive() -> None:
    s = fresh(3)
    refused(s, ElectMaster(A, 3, designated=True, alive=live(1)), "CONTROLLER_ELECT_MASTER_FAILED")
    assert s.apply(ElectMaster(A, 3, designated=True, alive=live(3))).ok
    assert bs_tuple(s) == (3, 1, {3}, 1)


def test_1_2_elect_first_controller_triggered_without_master_changes_nothing() -> None:
    refused(fresh(3), ElectMaster(A, None, alive=live(1, 2, 3)), "CONTROLLER_MASTER_NOT_AVAILABLE")


def test_1_2_elect_step5_master_still_exist() -> None:
    s = mastered()
    r = refused(s, ElectMaster(A, 2, alive=live(1, 2, 3)), "CONTROLLER_MASTER_STILL_EXIST")
    assert r.value.master_id == 1 and r.value.master_epoch == 1
    refused(s, ElectMaster(A, None, alive=live(1, 2)), "CONTROLLER_MASTER_STILL_EXIST")
    refused(s, ElectMaster(A, 1, designated=True, alive=live(1, 2)), "CONTROLLER_MASTER_STILL_EXIST")


def test_1_2_elect_step6_broker_triggered_after_master_death() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, 2, alive=live(2, 3)))
    assert r.ok and r.changed
    assert bs_tuple(s) == (2, 2, {2}, 3)


def test_1_2_elect_step6_requester_is_not_necessarily_the_winner() -> None:
    s = mastered()
    # broker 3 asks, but it is outside the SyncStateSet; broker 2 is the alive SSS member
    assert s.apply(ElectMaster(A, 3, alive=live(2, 3))).ok
    assert bs_tuple(s) == (2, 2, {2}, 3)


def test_1_2_elect_step6_controller_triggered() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, None, alive=live(2, 3)))
    assert r.ok and r.value.master_id == 2
    assert bs_tuple(s) == (2, 2, {2}, 3)


def test_1_2_elect_designated_moves_master_to_preferred_sss_member() -> None:
    s = mastered()
    assert s.apply(ElectMaster(A, 2, designated=True, alive=live(1, 2, 3))).ok
    assert bs_tuple(s) == (2, 2, {2}, 3)


def test_1_2_elect_designated_outside_sss_fails_with_unclean_off() -> None:
    s = mastered()
    refused(s, ElectMaster(A, 3, designated=True, alive=live(1, 2, 3)), "CONTROLLER_ELECT_MASTER_FAILED")


def test_1_2_elect_designated_outside_sss_succeeds_with_unclean_on() -> None:
    s = mastered()
    assert s.apply(ElectMaster(A, 3, designated=True, alive=live(1, 2, 3), enable_unclean=True)).ok
    assert bs_tuple(s) == (3, 2, {3}, 3)


def test_1_2_elect_step7_broker_triggered_nobody_fails_without_change() -> None:
    s = mastered()
    refused(s, ElectMaster(A, 3, alive=live(3)), "CONTROLLER_ELECT_MASTER_FAILED")


def test_1_2_elect_step7_unclean_on_elects_outside_sss() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, 3, alive=live(3), enable_unclean=True))
    assert r.ok and bs_tuple(s) == (3, 2, {3}, 3)


def test_1_2_elect_step7_controller_triggered_nobody_records_no_master() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, None, alive=live(3)))
    assert r.code == "CONTROLLER_MASTER_NOT_AVAILABLE" and r.changed and not r.ok
    # master cleared, master epoch bumped, SyncStateSet and its epoch kept
    assert bs_tuple(s) == (None, 2, {1, 2}, 2)


def test_2_3_quirk_failed_controller_elections_bump_epoch_at_most_once() -> None:
    s = mastered()
    for _ in range(3):  # RocketMQ's electMasterMaxRetryCount
        assert s.apply(ElectMaster(A, None, alive=live(3))).code == "CONTROLLER_MASTER_NOT_AVAILABLE"
    assert bs_tuple(s) == (None, 2, {1, 2}, 2)


def test_1_2_elect_after_no_master_the_old_master_can_return() -> None:
    s = mastered()
    s.apply(ElectMaster(A, None, alive=live(3)))
    r = s.apply(ElectMaster(A, 1, alive=live(1, 3)))
    assert r.ok and bs_tuple(s) == (1, 3, {1}, 3)


def test_1_2_elect_ignores_liveness_of_non_members() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, None, alive={3: LiveInfo(1, 1), 42: LiveInfo(99, 99)}, enable_unclean=True))
    assert r.ok and r.value.master_id == 3


def test_2_1_elect_uses_liveinfo_order() -> None:
    s = mastered()
    assert s.apply(AlterSyncStateSet(A, 1, 1, frozenset({1, 2, 3}), 2, alive=frozenset({1, 2, 3}))).ok
    r = s.apply(ElectMaster(A, None, alive={2: LiveInfo(1, 500), 3: LiveInfo(1, 900)}))
    assert r.ok and r.value.master_id == 3


@pytest.mark.parametrize(
    "cmd",
    [
        ElectMaster("bad name", 1),
        ElectMaster(A, -1),
        ElectMaster(A, None, designated=True),
        ElectMaster(A, 1, designated=1),
        ElectMaster(A, 1, alive={1: (1, 2)}),
        ElectMaster(A, 1, now_ms=-5),
    ],
    ids=repr,
)
def test_v0_elect_rejects_malformed_input(cmd: ElectMaster) -> None:
    refused(mastered(), cmd, "INVALID_ARGUMENT")


# --- alterSyncStateSet (A1-A8, in order) ---------------------------------------------------


def alter(
    new: set[int],
    master: int = 1,
    epoch: int = 1,
    sss_epoch: int = 2,
    alive=frozenset({1, 2, 3}),
    name: str = A,
    attempt: int = 0,
) -> AlterSyncStateSet:
    return AlterSyncStateSet(
        name, master, epoch, frozenset(new), sss_epoch, alive=frozenset(alive), attempt=attempt
    )


def test_1_2_alter_sss_check1_unknown_set() -> None:
    r = refused(mastered(), alter({1, 2, 3}, name="broker-z"), "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED")
    assert r.value is None


def test_1_2_alter_sss_check2_unchanged_set_before_master_check() -> None:
    # a stale master with a stale epoch proposing the same set gets 2013, not 2002/2000
    refused(
        mastered(), alter({1, 2}, master=3, epoch=0, sss_epoch=0), "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED"
    )


def test_1_2_alter_sss_check3_not_the_master() -> None:
    refused(mastered(), alter({2, 3}, master=2), "CONTROLLER_INVALID_MASTER")


def test_1_2_alter_sss_check3_no_master() -> None:
    s = mastered()
    s.apply(ElectMaster(A, None, alive=live(3)))
    refused(s, alter({1, 2, 3}, epoch=2), "CONTROLLER_INVALID_MASTER")


def test_1_2_alter_sss_check4_rejects_stale_master_epoch() -> None:
    r = refused(mastered(), alter({1, 2, 3}, epoch=0, sss_epoch=0), "CONTROLLER_FENCED_MASTER_EPOCH")
    assert r.value.master_epoch == 1, "the refusal carries the current state for resync"


def test_1_2_alter_sss_check4_rejects_future_master_epoch() -> None:
    refused(mastered(), alter({1, 2, 3}, epoch=2), "CONTROLLER_FENCED_MASTER_EPOCH")


def test_1_2_alter_sss_check5_rejects_stale_sss_epoch() -> None:
    refused(mastered(), alter({1, 2, 3}, sss_epoch=1), "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH")


def test_a4b_a_late_copy_of_an_attempt_older_than_an_answered_one_is_refused() -> None:
    """The simulator's seed 18180: attempt 7 went unanswered, attempt 8 of the same proposal was
    refused (broker 3 not alive) and the master dropped the proposal; then attempt 7 arrived late,
    when broker 3 lived again, and added it while it lacked records confirmed meanwhile. An answer
    to a numbered attempt fences every earlier attempt of that master epoch."""
    s = mastered()
    r = s.apply(alter({1, 2, 3}, alive={1, 2}, attempt=8))
    assert r.code == "CONTROLLER_BROKER_NOT_ALIVE" and not r.changed
    assert s.broker_sets[A].alter_attempt == (1, 8)  # the refusal is recorded
    r = refused(s, alter({1, 2, 3}, alive={1, 2, 3}, attempt=7), "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH")
    assert "attempt 7" in r.message
    refused(s, alter({1, 2, 3}, alive={1, 2, 3}, attempt=8), "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH")
    assert s.apply(alter({1, 2, 3}, alive={1, 2, 3}, attempt=9)).ok  # a newer attempt applies
    assert s.broker_sets[A].alter_attempt == (1, 9)


def test_a4b_unnumbered_attempts_and_other_masters_are_not_fenced() -> None:
    s = mastered()
    assert s.apply(alter({1, 2, 3}, alive={1, 2}, attempt=8)).code == "CONTROLLER_BROKER_NOT_ALIVE"
    assert s.apply(alter({1, 2, 3}, alive={1, 2, 3})).ok  # attempt 0: a broker that numbers none
    # another master's attempt records nothing for this one
    refused(
        s,
        AlterSyncStateSet(A, 2, 1, frozenset({1, 2}), 3, alive=frozenset({1, 2}), attempt=99),
        "CONTROLLER_INVALID_MASTER",
    )
    assert s.broker_sets[A].alter_attempt == (1, 8)
    # a new master epoch numbers afresh: (2, 1) is newer than (1, 8)
    assert s.apply(ElectMaster(A, 2, designated=True, alive=live(1, 2, 3))).ok
    bs = s.broker_sets[A]
    cmd = AlterSyncStateSet(
        A, 2, bs.master_epoch, frozenset({2, 3}), bs.sss_epoch, alive=frozenset({2, 3}), attempt=1
    )
    assert s.apply(cmd).ok


def test_1_2_alter_sss_check6_unregistered_replica() -> None:
    refused(mastered(), alter({1, 2, 7}, alive={1, 2, 7}), "CONTROLLER_INVALID_REPLICAS")


def test_1_2_alter_sss_check6_dead_replica() -> None:
    refused(mastered(), alter({1, 2, 3}, alive={1, 2}), "CONTROLLER_BROKER_NOT_ALIVE")


def test_1_2_alter_sss_check6_master_is_checked_too() -> None:
    refused(mastered(), alter({1}, alive={2, 3}), "CONTROLLER_BROKER_NOT_ALIVE")


def test_1_2_alter_sss_check6_ascending_order_decides_the_code() -> None:
    # 3 is dead and 7 unregistered: 3 comes first
    refused(mastered(), alter({1, 3, 7}, alive={1, 2}), "CONTROLLER_BROKER_NOT_ALIVE")
    refused(mastered(), alter({1, 0, 3}, alive={1, 2}), "CONTROLLER_INVALID_REPLICAS")


def test_1_2_alter_sss_check7_master_left_out() -> None:
    refused(mastered(), alter({2, 3}), "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED")
    refused(mastered(), alter(set()), "CONTROLLER_ALTER_SYNC_STATE_SET_FAILED")


def test_1_2_alter_sss_check8_success_expands_and_shrinks() -> None:
    s = mastered()
    r = s.apply(alter({1, 2, 3}))
    assert r.ok and r.changed and r.value.sss_epoch == 3
    assert bs_tuple(s) == (1, 1, {1, 2, 3}, 3)
    assert s.apply(alter({1}, sss_epoch=3)).ok  # no one-at-a-time rule
    assert bs_tuple(s) == (1, 1, {1}, 4)


@pytest.mark.parametrize(
    "cmd",
    [
        alter({1, 2, 3}, master=-1),
        alter({1, 2, 3}, epoch=-1),
        alter({1, -2}),
        AlterSyncStateSet(A, 1, 1, [1, 2, 3], 2, alive=frozenset({1, 2, 3})),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_v0_alter_rejects_malformed_input(cmd: AlterSyncStateSet) -> None:
    refused(mastered(), cmd, "INVALID_ARGUMENT")


# --- cleanBrokerData (C1-C4) ----------------------------------------------------------------


def test_1_2_clean_c1_refuses_alive_listed_broker() -> None:
    r = refused(
        mastered(),
        CleanBrokerData(A, frozenset({2, 3}), alive=frozenset({3})),
        "CONTROLLER_INVALID_CLEAN_BROKER_METADATA",
    )
    assert "still alive" in r.message


def test_1_2_clean_c1_refuses_whole_set_with_a_live_member() -> None:
    refused(mastered(), CleanBrokerData(A, alive=frozenset({2})), "CONTROLLER_INVALID_CLEAN_BROKER_METADATA")


def test_1_2_clean_c1_whole_set_with_dead_recorded_master_allowed() -> None:
    # Choice 6: RocketMQ refuses because a master is recorded, although nobody is alive
    s = mastered()
    assert s.apply(CleanBrokerData(A)).ok
    assert A not in s.broker_sets


def test_1_2_clean_c1_clean_living_overrides() -> None:
    s = mastered()
    assert s.apply(CleanBrokerData(A, frozenset({3}), clean_living=True, alive=frozenset({1, 2, 3}))).ok
    assert 3 not in s.broker_sets[A].members


def test_1_2_clean_c2_unknown_set() -> None:
    refused(mastered(), CleanBrokerData("broker-z"), "CONTROLLER_INVALID_CLEAN_BROKER_METADATA")


def test_c2a_a_decommission_checked_at_other_epochs_is_refused_and_changes_nothing() -> None:
    # Two decommissions checked against the same SyncStateSet: the first changes it, so the
    # second (checked against what no longer holds) must be checked again.
    s = mastered()
    bs = s.broker_sets[A]
    epochs = (bs.master_epoch, bs.sss_epoch)
    assert s.apply(CleanBrokerData(A, frozenset({2}), expect_epochs=epochs)).ok
    before = bs_tuple(s)
    refused(
        s, CleanBrokerData(A, frozenset({3}), expect_epochs=epochs), "CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH"
    )
    assert bs_tuple(s) == before and 3 in s.broker_sets[A].members
    refused(s, CleanBrokerData(A, frozenset({3}), expect_epochs=(1,)), "INVALID_ARGUMENT")


def test_1_2_clean_c3_listing_every_member_drops_the_set() -> None:
    s = mastered()
    assert s.apply(CleanBrokerData(A, frozenset({1, 2, 3}))).ok
    assert A not in s.broker_sets and s.next_id_floor[A] == 4


def test_1_2_clean_c4_removing_a_slave_from_sss_bumps_sss_epoch() -> None:
    s = mastered()
    r = s.apply(CleanBrokerData(A, frozenset({2})))
    assert r.ok and r.changed
    assert bs_tuple(s) == (1, 1, {1}, 3)


def test_1_2_clean_c4_removing_a_non_sss_member_keeps_epochs() -> None:
    s = mastered()
    assert s.apply(CleanBrokerData(A, frozenset({3}))).ok
    assert bs_tuple(s) == (1, 1, {1, 2}, 2)


def test_1_2_clean_quirk_removing_the_master_clears_it() -> None:
    s = mastered()
    assert s.apply(CleanBrokerData(A, frozenset({1}))).ok
    assert bs_tuple(s) == (None, 2, {2}, 3)
    assert s.broker_sets[A].master is None


def test_1_2_clean_unknown_ids_are_a_harmless_no_op() -> None:
    s = mastered()
    before = copy.deepcopy(s)
    r = s.apply(CleanBrokerData(A, frozenset({42})))
    assert r.ok and not r.changed and s == before


# --- topics and routes ----------------------------------------------------------------------


def test_t1_create_topic_and_route() -> None:
    s = mastered()
    s.apply(reg(identity="b1", name="broker-b", address="10.0.1.1:10911"))
    r = s.apply(CreateTopic("orders", {"broker-b": 2, A: 8}, "rw", now_ms=5))
    assert r.ok and r.value.queues == {A: 8, "broker-b": 2}
    route = s.route("orders")
    assert [b.broker_set for b in route.brokers] == [A, "broker-b"]
    a = route.brokers[0]
    assert (a.queues, a.master_id, a.master_address, a.master_epoch) == (8, 1, "10.0.0.1:10911", 1)
    assert [i for i, _ in a.replicas] == [1, 2, 3]
    b = route.brokers[1]
    assert (b.master_id, b.master_address) == (None, None)
    assert s.route("nope") is None


def test_t1_topic_errors() -> None:
    s = mastered()
    assert s.apply(CreateTopic("orders", {A: 4})).ok
    refused(s, CreateTopic("orders", {A: 4}), "TOPIC_EXISTS")
    refused(s, CreateTopic("other", {"broker-z": 4}), "CONTROLLER_BROKER_METADATA_NOT_EXIST")
    refused(s, DeleteTopic("nope"), "TOPIC_NOT_FOUND")
    assert s.apply(DeleteTopic("orders")).ok and "orders" not in s.topics


@pytest.mark.parametrize(
    "cmd",
    [
        CreateTopic("bad/name", {A: 1}),
        CreateTopic("t", {}),
        CreateTopic("t", {A: 0}),
        CreateTopic("t", {A: 1025}),
        CreateTopic("t", {A: 1}, perm="x"),
        CreateTopic("t", {"bad name": 1}),
        DeleteTopic(""),
        # names brokers refuse to serve (one rule: commitlog/consumequeue.py user_topic_problem)
        CreateTopic(".", {A: 1}),
        CreateTopic("..", {A: 1}),
        CreateTopic("%sys", {A: 1}),
    ],
    ids=repr,
)
def test_v0_topic_rejects_malformed_input(cmd: object) -> None:
    refused(mastered(), cmd, "INVALID_ARGUMENT")


def test_t1_queue_count_bounds_are_inclusive() -> None:
    s = mastered()
    assert s.apply(CreateTopic("one", {A: 1})).ok
    assert s.apply(CreateTopic("max", {A: 1024})).ok


# --- versioned metadata ---------------------------------------------------------------------


def test_m1_versions_start_at_1_and_grow() -> None:
    s = ControllerState()
    r = s.apply(MetaCreate("ledgers/1", b"a", now_ms=3))
    assert r.value == MetaEntry("ledgers/1", b"a", 1, 3)
    r = s.apply(MetaCompareAndSet("ledgers/1", b"b", 1, now_ms=4))
    assert r.ok and r.value.version == 2 and s.get_meta("ledgers/1").value == b"b"


def test_m2_m3_m4_metadata_errors() -> None:
    s = ControllerState()
    s.apply(MetaCreate("k", b"v"))
    refused(s, MetaCreate("k", b"w"), "METADATA_EXISTS")
    refused(s, MetaCompareAndSet("missing", b"w", 1), "METADATA_NOT_FOUND")
    r = refused(s, MetaCompareAndSet("k", b"w", 2), "METADATA_VERSION_MISMATCH")
    assert r.value.version == 1
    refused(s, MetaDelete("k", 5), "METADATA_VERSION_MISMATCH")
    refused(s, MetaDelete("missing"), "METADATA_NOT_FOUND")
    assert s.apply(MetaDelete("k", 1)).ok and s.get_meta("k") is None
    s.apply(MetaCreate("k", b"v"))
    assert s.apply(MetaDelete("k")).ok, "no expected version deletes unconditionally"


def test_m2_value_size_limit_is_inclusive_and_configurable() -> None:
    s = ControllerState(max_meta_value_bytes=8)
    assert s.apply(MetaCreate("a", b"x" * 8)).ok
    refused(s, MetaCreate("b", b"x" * 9), "METADATA_TOO_LARGE")
    refused(s, MetaCompareAndSet("a", b"x" * 9, 1), "METADATA_TOO_LARGE")
    big = ControllerState()
    assert big.apply(MetaCreate("a", b"x" * (1 << 20))).ok
    refused(big, MetaCreate("b", b"x" * ((1 << 20) + 1)), "METADATA_TOO_LARGE")


def test_m_list_prefix_is_sorted() -> None:
    s = ControllerState()
    for k in ["ledgers/2", "ledgers/10", "other/1", "ledgers/1"]:
        s.apply(MetaCreate(k, k.encode()))
    assert [e.key for e in s.list_prefix("ledgers/")] == ["ledgers/1", "ledgers/10", "ledgers/2"]


@given(
    st.sets(st.text(alphabet="ab/", min_size=1, max_size=5), max_size=30),
    st.sampled_from(["", "a", "a/", "b"]),
    st.integers(0, 7),
)
def test_m_pages_of_a_prefix_are_the_whole_listing_in_order(keys: set[str], prefix: str, limit: int) -> None:
    s = ControllerState()
    for k in keys:
        assert s.apply(MetaCreate(k, b"v")).ok
    got: list[str] = []
    start_after, pages = "", 0
    while True:
        entries, start_after = s.list_page(prefix, start_after, limit)
        got += [e.key for e in entries]
        pages += 1
        assert limit == 0 or len(entries) <= limit
        if not start_after:
            break
    assert got == [e.key for e in s.list_prefix(prefix)]
    assert pages <= 1 + (len(got) // limit if limit else 0)


@pytest.mark.parametrize(
    "cmd",
    [
        MetaCreate("", b"v"),
        MetaCreate("k\n", b"v"),
        MetaCreate("k" * 1025, b"v"),
        MetaCreate("k", "str"),
        MetaCompareAndSet("k", b"v", -1),
        MetaDelete("k", -1),
    ],
    ids=repr,
)
def test_v0_metadata_rejects_malformed_input(cmd: object) -> None:
    s = ControllerState()
    s.apply(MetaCreate("k", b"v"))
    refused(s, cmd, "INVALID_ARGUMENT")


# --- determinism, snapshots, invariants -----------------------------------------------------


def test_v1_unknown_command_is_refused_not_raised() -> None:
    refused(mastered(), object(), "INVALID_ARGUMENT")


def test_snapshot_is_json_and_round_trips() -> None:
    s = mastered()
    s.apply(CreateTopic("orders", {A: 4}))
    s.apply(MetaCreate("bin", bytes(range(256))))
    s.apply(CleanBrokerData(A, frozenset({3})))
    d = json.loads(json.dumps(s.to_dict()))
    back = ControllerState.from_dict(d)
    assert back == s and back.to_dict() == s.to_dict()
    assert back.get_meta("bin").value == bytes(range(256))
    # the restored copy keeps working identically
    cmd = reg(identity="late")
    assert back.apply(cmd) == s.apply(cmd)
    assert back == s


def test_snapshot_rejects_unknown_format_and_broken_invariants() -> None:
    d = mastered().to_dict()
    with pytest.raises(ValueError):
        ControllerState.from_dict({**d, "format": 99})
    d["broker_sets"][0]["master_id"] = 3  # not in the SyncStateSet
    with pytest.raises(InvariantViolation):
        ControllerState.from_dict(d)


def test_commands_pickle() -> None:
    for cmd in [
        reg(),
        ElectMaster(A, None, alive=live(1)),
        alter({1, 2, 3}),
        CleanBrokerData(A),
        CreateTopic("t", {A: 1}),
        MetaCompareAndSet("k", b"v", 1),
    ]:
        assert pickle.loads(pickle.dumps(cmd)) == cmd


def test_commands_pickle_under_the_class_path_the_raft_log_has_always_used() -> None:
    # The journal and the entries sent between nodes name each class by module: a node of an
    # older layout (everything in state.py) must read what a newer one writes, and back.
    for cmd in [
        reg(),
        ElectMaster(A, None, alive=live(1)),
        alter({1, 2, 3}),
        CleanBrokerData(A),
        CreateTopic("t", {A: 1}),
        DeleteTopic("t"),
        MetaCompareAndSet("k", b"v", 1),
    ]:
        names = {
            (op.name, arg)
            for op, arg, _ in pickletools.genops(pickle.dumps(cmd))
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE") and arg.startswith("tidelog.")
        }
        assert names and all(arg == "tidelog.controller.state" for _, arg in names), names


def test_read_helpers_return_copies() -> None:
    s = mastered()
    copy_ = s.broker_set(A)
    copy_.master_id = 3
    copy_.members.clear()
    assert s.broker_sets[A].master_id == 1 and len(s.broker_sets[A].members) == 3
    assert s.broker_set("nope") is None


def test_invariant_violation_stops_apply() -> None:
    s = mastered()
    s.broker_sets[A].sync_state_set = frozenset({2})  # corrupt: master 1 outside its SyncStateSet
    with pytest.raises(InvariantViolation):
        s.apply(reg(broker_id=2, identity="id-2", address="10.0.0.2:10911"))


def test_invariant_epochs_never_decrease_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mastered()

    # a handler that moves an epoch backwards must be caught
    def rogue(_state: object, cmd: object) -> tuple[Result, str | None]:
        s.broker_sets[A].sss_epoch -= 1
        return Result(changed=True), "alter"

    monkeypatch.setitem(HANDLERS, AlterSyncStateSet, rogue)
    with pytest.raises(InvariantViolation):
        s.apply(alter({1, 2, 3}))


def test_invariant_transition_table_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mastered()

    # an alter may not clear the master
    def rogue(_state: object, cmd: object) -> tuple[Result, str | None]:
        bs = s.broker_sets[A]
        bs.master_id = None
        return Result(changed=True), "alter"

    monkeypatch.setitem(HANDLERS, AlterSyncStateSet, rogue)
    with pytest.raises(InvariantViolation):
        s.apply(alter({1, 2, 3}))


def test_invariant_one_master_per_epoch_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mastered()

    # hand mastership to broker 2 without a new epoch
    def rogue(_state: object, cmd: object) -> tuple[Result, str | None]:
        bs = s.broker_sets[A]
        bs.master_id = 2
        return Result(changed=True), "alter"

    monkeypatch.setitem(HANDLERS, AlterSyncStateSet, rogue)
    with pytest.raises(InvariantViolation, match="within epoch"):
        s.apply(alter({1, 2, 3}))


def test_invariant_sss_change_needs_a_new_sss_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mastered()

    def rogue(_state: object, cmd: object) -> tuple[Result, str | None]:
        s.broker_sets[A].sync_state_set = frozenset({1, 2, 3})
        return Result(changed=True), "alter"

    monkeypatch.setitem(HANDLERS, AlterSyncStateSet, rogue)
    with pytest.raises(InvariantViolation, match="within its epoch"):
        s.apply(alter({1, 2, 3}))


def test_1_2_clean_c5_emptied_sss_needs_unclean_election() -> None:
    s = mastered()
    assert s.apply(CleanBrokerData(A, frozenset({1, 2}))).ok
    assert bs_tuple(s) == (None, 2, set(), 3)
    refused(s, ElectMaster(A, 3, alive=live(3)), "CONTROLLER_ELECT_MASTER_FAILED")
    refused(s, ElectMaster(A, 3, designated=True, alive=live(3)), "CONTROLLER_ELECT_MASTER_FAILED")
    assert s.apply(ElectMaster(A, 3, alive=live(3), enable_unclean=True)).ok
    assert bs_tuple(s) == (3, 3, {3}, 4)


# --- E8: a master back from a crash asks for a new epoch ----------------------------------------


def test_e8_a_restarted_master_is_elected_again_in_a_new_epoch() -> None:
    s = mastered()  # master 1 at epoch 1, SyncStateSet {1, 2}
    r = s.apply(ElectMaster(A, 1, alive={1: LiveInfo(1, 500), 2: LiveInfo(1, 400)}, restarted=True))
    assert r.ok and r.changed
    bs = s.broker_sets[A]
    assert (bs.master_id, bs.master_epoch, bs.sync_state_set) == (1, 2, {1})


def test_e8_the_member_holding_more_wins_over_the_restarted_master() -> None:
    s = mastered()
    r = s.apply(ElectMaster(A, 1, alive={1: LiveInfo(1, 400), 2: LiveInfo(1, 500)}, restarted=True))
    assert r.ok
    assert (s.broker_sets[A].master_id, s.broker_sets[A].master_epoch) == (2, 2)


def test_e8_a_late_copy_of_a_call_from_an_older_epoch_elects_nobody() -> None:
    """Seed 3694 of the simulator: a restarted master's call, given up on and run late, arrived once
    the broker was master of the newer epoch its first call got it, and holding a lease: another
    master was elected beside it."""
    s = mastered()  # master 1 at epoch 1, SyncStateSet {1, 2}
    ask = ElectMaster(
        A, 1, alive={1: LiveInfo(1, 500), 2: LiveInfo(1, 400)}, restarted=True, restarted_epoch=1
    )
    assert s.apply(ask).ok
    assert (s.broker_sets[A].master_id, s.broker_sets[A].master_epoch) == (1, 2)
    # the late copy, with member 2 now holding more: it would win
    late = ElectMaster(
        A, 1, alive={1: LiveInfo(2, 400), 2: LiveInfo(2, 500)}, restarted=True, restarted_epoch=1
    )
    refused(s, late, "CONTROLLER_FENCED_MASTER_EPOCH")
    assert (s.broker_sets[A].master_id, s.broker_sets[A].master_epoch) == (1, 2)
    refused(s, ElectMaster(A, 1, alive={1: LiveInfo(1, 9)}, restarted_epoch=2), "INVALID_ARGUMENT")


def test_e8_only_the_recorded_master_may_ask_and_only_alive_members_win() -> None:
    refused(
        mastered(), ElectMaster(A, 2, alive={2: LiveInfo(1, 9)}, restarted=True), "CONTROLLER_INVALID_MASTER"
    )
    refused(mastered(), ElectMaster(A, 1, alive={}, restarted=True), "CONTROLLER_ELECT_MASTER_FAILED")
    refused(
        mastered(), ElectMaster(A, 3, alive={3: LiveInfo(1, 9)}, restarted=True), "CONTROLLER_INVALID_MASTER"
    )
    refused(
        mastered(),
        ElectMaster(A, 1, designated=True, alive={1: LiveInfo(1, 9)}, restarted=True),
        "INVALID_ARGUMENT",
    )
