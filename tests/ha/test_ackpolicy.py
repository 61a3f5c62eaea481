"""Ack policy: docs/reference/rocketmq-controller-ha.md §4 and docs/ARCHITECTURE.md §3.4 as tables, plus properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.errors import ConfigError, InSyncReplicasNotEnoughError
from tidelog.ha.ackpolicy import (
    EVERY_MEMBER,
    AckConfig,
    acked_by,
    confirm_offset,
    release_need,
    required_acks,
)

FAIL = InSyncReplicasNotEnoughError
M = 0  # the master's broker id in the tables


@pytest.mark.parametrize(
    ("name", "cfg", "sss_size", "expected"),
    [
        # async answers after the local append, whatever the set looks like
        ("async needs only the master", AckConfig(replication="async", in_sync_replicas=3), 1, 1),
        (
            "async ignores min_in_sync",
            AckConfig(replication="async", in_sync_replicas=2, min_in_sync_replicas=2),
            1,
            1,
        ),
        # §4 defaults: inSyncReplicas=1, minInSyncReplicas=1
        ("defaults: the master alone", AckConfig(), 1, 1),
        ("defaults with a slave in the set still need 1", AckConfig(), 2, 1),
        ("in_sync 2 of a set of 2", AckConfig(in_sync_replicas=2), 2, 2),
        ("in_sync 2 of a set of 3", AckConfig(in_sync_replicas=2), 3, 2),
        # §4 "inSyncReplicasNums() < minInSyncReplicas -> IN_SYNC_REPLICAS_NOT_ENOUGH, nothing written"
        ("set below min_in_sync fails fast", AckConfig(in_sync_replicas=2, min_in_sync_replicas=2), 1, FAIL),
        # tidelog: only members ack, so a need larger than the set could never complete
        ("need above the set fails fast", AckConfig(in_sync_replicas=2), 1, FAIL),
        ("need 3 of a set of 2 fails fast", AckConfig(in_sync_replicas=3, min_in_sync_replicas=2), 2, FAIL),
        # docs/ARCHITECTURE.md §3.4: needed = max(min(in_sync_replicas, |SSS|), min_in_sync_replicas)
        (
            "auto: three of three",
            AckConfig(in_sync_replicas=3, min_in_sync_replicas=2, auto_in_sync_replicas=True),
            3,
            3,
        ),
        (
            "auto: two of three replicas left, min 2",
            AckConfig(in_sync_replicas=3, min_in_sync_replicas=2, auto_in_sync_replicas=True),
            2,
            2,
        ),
        (
            "auto: one left, min 2, fails fast",
            AckConfig(in_sync_replicas=3, min_in_sync_replicas=2, auto_in_sync_replicas=True),
            1,
            FAIL,
        ),
        (
            "auto: min 1 lets the master go alone",
            AckConfig(in_sync_replicas=3, auto_in_sync_replicas=True),
            1,
            1,
        ),
        ("auto never raises the need", AckConfig(in_sync_replicas=2, auto_in_sync_replicas=True), 5, 2),
        # §4 allAckInSyncStateSet: need = -1 = every member of getSyncStateSet()
        ("all_ack: every member of 3", AckConfig(all_ack_in_sync_state_set=True), 3, 3),
        ("all_ack: the master alone", AckConfig(all_ack_in_sync_state_set=True), 1, 1),
        # a pending expansion {M, A} -> {M, A, B}: the caller passes |local ∪ proposed| = 3
        (
            "all_ack with a pending expansion counts the union",
            AckConfig(all_ack_in_sync_state_set=True),
            3,
            3,
        ),
        (
            "all_ack still honours min_in_sync",
            AckConfig(in_sync_replicas=2, min_in_sync_replicas=2, all_ack_in_sync_state_set=True),
            1,
            FAIL,
        ),
        ("all_ack wins over in_sync", AckConfig(in_sync_replicas=3, all_ack_in_sync_state_set=True), 2, 2),
    ],
)
def test_required_acks_table(name, cfg, sss_size, expected):
    if expected is FAIL:
        with pytest.raises(InSyncReplicasNotEnoughError) as info:
            required_acks(cfg, sss_size)
        assert info.value.retryable  # nothing was written
        assert info.value.details["sync_state_set_size"] == sss_size
    else:
        assert required_acks(cfg, sss_size) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replication": "semi-sync"},
        {"replication": "SYNC"},
        {"in_sync_replicas": 0},
        {"min_in_sync_replicas": 0},
        {"in_sync_replicas": -1},
        {"in_sync_replicas": True},
        {"in_sync_replicas": 2.0},
        {"in_sync_replicas": 2, "min_in_sync_replicas": 3},
        {"auto_in_sync_replicas": "yes"},
        {"all_ack_in_sync_state_set": 1},
    ],
)
def test_config_validation(kwargs):
    with pytest.raises(ConfigError):
        AckConfig(**kwargs)


def test_config_defaults_are_rocketmqs():
    cfg = AckConfig()
    assert (cfg.replication, cfg.in_sync_replicas, cfg.min_in_sync_replicas) == ("sync", 1, 1)
    assert not cfg.auto_in_sync_replicas and not cfg.all_ack_in_sync_state_set


@pytest.mark.parametrize(
    ("name", "needed", "master_offset", "acks", "sss", "expected"),
    [
        ("needed 1 is the master's append", 1, 200, {}, {M}, 200),
        ("needed 0 is the master's append", 0, 200, {1: 5}, {M, 1}, 200),
        ("2 of 3: the best slave", 2, 200, {1: 100, 2: 50}, {M, 1, 2}, 100),
        ("3 of 3: the slowest member", 3, 200, {1: 100, 2: 50}, {M, 1, 2}, 50),
        ("acks outside the set do not count", 2, 200, {1: 10, 5: 1000}, {M, 1}, 10),
        ("an outsider cannot stand in for a member", 2, 200, {5: 1000}, {M, 1}, 0),
        ("a member without an ack holds 0", 3, 200, {1: 10}, {M, 1, 2}, 0),
        ("an ack beyond the master is capped", 2, 200, {1: 500}, {M, 1}, 200),
        # e.g. stale acks from before the master truncated: bytes that are gone are not acked
        ("two acks beyond the master are capped", 2, 200, {1: 500, 2: 600}, {M, 1, 2}, 200),
        ("more needed than members: nothing", 3, 200, {1: 200}, {M, 1}, 0),
        ("the master counts even if not listed", 2, 200, {1: 70}, {1}, 70),
        # a pending expansion: the caller passes local ∪ proposed, so B's ack is needed too
        ("all of a pending union", 3, 200, {1: 150, 2: 120}, {M, 1, 2}, 120),
    ],
)
def test_acked_by_table(name, needed, master_offset, acks, sss, expected):
    assert acked_by(needed, M, master_offset, acks, sss) == expected


@pytest.mark.parametrize(
    ("name", "master_offset", "acks", "connected", "sss", "current", "expected"),
    [
        ("the master alone confirms its own end", 100, {}, set(), {M}, 40, 100),
        ("min of the master and the slave", 100, {1: 80}, {1}, {M, 1}, 50, 80),
        ("min over every member", 100, {1: 80, 2: 60}, {1, 2}, {M, 1, 2}, 50, 60),
        ("a disconnected member stops the advance", 100, {1: 80, 2: 90}, {1}, {M, 1, 2}, 50, 50),
        ("a member without an ack stops the advance", 100, {}, {1}, {M, 1}, 50, 50),
        ("never backwards", 100, {1: 30}, {1}, {M, 1}, 50, 50),
        ("never past the master", 100, {1: 300}, {1}, {M, 1}, 50, 100),
        ("outsiders neither help nor block", 100, {1: 70, 9: 100}, {1}, {M, 1}, 50, 70),
        ("an outsider's absence does not block", 100, {1: 70}, {1}, {M, 1}, 50, 70),
        # pending shrink {M, 1, 2} -> {M, 1} after 2 disconnected: union still holds 2
        ("pending shrink of a gone member holds confirm", 100, {1: 90}, {1}, {M, 1, 2}, 50, 50),
    ],
)
def test_confirm_offset_table(name, master_offset, acks, connected, sss, current, expected):
    assert confirm_offset(M, master_offset, acks, connected, sss, current) == expected


# --- properties ---------------------------------------------------------------------------

IDS = st.integers(min_value=1, max_value=6)
OFF = st.integers(min_value=0, max_value=10_000)


@st.composite
def situations(draw):
    sss = draw(st.frozensets(IDS, max_size=5)) | {M}
    acks = draw(st.dictionaries(st.integers(min_value=1, max_value=8), OFF, max_size=8))
    master_offset = draw(OFF)
    needed = draw(st.integers(min_value=0, max_value=len(sss) + 1))
    return needed, master_offset, acks, sss


@given(s=situations(), bump_id=st.integers(min_value=1, max_value=8), bump=OFF, grow=OFF)
def test_acked_by_is_monotone_and_bounded(s, bump_id, bump, grow):
    needed, master_offset, acks, sss = s
    base = acked_by(needed, M, master_offset, acks, sss)
    assert 0 <= base <= master_offset
    more_acks = {**acks, bump_id: acks.get(bump_id, 0) + bump}
    assert acked_by(needed, M, master_offset, more_acks, sss) >= base
    assert acked_by(needed, M, master_offset + grow, acks, sss) >= base
    # needing more never acknowledges more
    assert acked_by(needed + 1, M, master_offset, acks, sss) <= base


@given(s=situations())
def test_acked_by_everyone_is_the_minimum_over_the_set(s):
    _, master_offset, acks, sss = s
    expected = min([master_offset] + [min(acks.get(m, 0), master_offset) for m in sss if m != M])
    assert acked_by(len(sss), M, master_offset, acks, sss) == expected


@given(
    s=situations(),
    connected=st.frozensets(IDS),
    current_frac=st.floats(0, 1),
    later=st.lists(st.tuples(OFF, st.dictionaries(IDS, OFF, max_size=6)), max_size=5),
)
def test_confirm_offset_never_decreases_nor_passes_the_master(s, connected, current_frac, later):
    _, master_offset, acks, sss = s
    current = int(master_offset * current_frac)
    for step in [(0, acks), *later]:
        grow, new_acks = step
        master_offset += grow  # the master's log only grows between truncations
        new = confirm_offset(M, master_offset, new_acks, connected, sss, current)
        assert current <= new <= master_offset
        if all(m in connected for m in sss - {M}):
            # with everyone connected it is exactly "held by every member", kept monotone
            assert new == max(current, acked_by(len(sss), M, master_offset, new_acks, sss))
        else:
            assert new == current
        current = new


@st.composite
def configs(draw) -> AckConfig:
    in_sync = draw(st.integers(1, 5))
    return AckConfig(
        replication=draw(st.sampled_from(["sync", "async"])),
        in_sync_replicas=in_sync,
        min_in_sync_replicas=draw(st.integers(1, in_sync)),
        auto_in_sync_replicas=draw(st.booleans()),
        all_ack_in_sync_state_set=draw(st.booleans()),
    )


@given(cfg=configs(), sss_size=st.integers(1, 6))
def test_required_acks_is_reachable_or_refused(cfg, sss_size):
    try:
        needed = required_acks(cfg, sss_size)
    except InSyncReplicasNotEnoughError:
        assert cfg.replication == "sync"
        return
    # whatever is asked for can be delivered by the set, and sync never asks for less than min
    assert 1 <= needed <= sss_size
    if cfg.replication == "sync":
        assert needed >= cfg.min_in_sync_replicas


@given(needed=st.integers(1, 6), size=st.integers(1, 6))
def test_a_write_that_needs_the_whole_set_waits_for_every_member_at_release(needed: int, size: int) -> None:
    need = release_need(needed, size)
    assert (need == EVERY_MEMBER) == (needed >= size)
    assert need in (needed, EVERY_MEMBER)
