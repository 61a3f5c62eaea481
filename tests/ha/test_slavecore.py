"""The slave's replication core (`ha.slavecore.SlaveCore`): fork repair (docs/ARCHITECTURE.md §3.2, §4.2)
and the checks on each frame (§4.3) as tables, plus properties over random transfers and handshakes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.ha.slavecore import (
    Ack,
    AckTick,
    Append,
    AwaitFlush,
    LocalLog,
    MasterAnswered,
    RecordEpoch,
    Refuse,
    SetConfirm,
    SlaveCore,
    StartAt,
    TransferArrived,
    Truncate,
)

MASTER = 2


def local(
    epochs=((1, 0), (2, 100)),
    *,
    min_offset: int = 0,
    max_offset: int = 200,
    confirm: int = 150,
    flushed: int | None = None,
) -> LocalLog:
    return LocalLog(
        tuple(epochs), min_offset, max_offset, confirm, max_offset if flushed is None else flushed
    )


def slave(*, epoch: int = 2, flush_sync: bool = False, unclean: int = 0, seen: int = 0) -> SlaveCore:
    return SlaveCore(MASTER, epoch, flush_sync, unclean_epoch=unclean, seen_epoch=seen)


# --- MasterAnswered: the handshake and fork repair (§3.2, §4.2) ----------------------------

ANSWERED = {
    "3_2_deposed_master_older_than_the_assigned_epoch_is_refused": (
        slave(epoch=5),
        MasterAnswered(4, 0, 300, ((1, 0), (4, 100)), local()),
        [Refuse],
        "deposed",
        None,
    ),
    "3_2_deposed_master_older_than_the_local_epoch_file_is_refused": (
        slave(epoch=2),
        MasterAnswered(2, 0, 300, ((1, 0), (2, 100)), local(((1, 0), (2, 100), (3, 180)))),
        [Refuse],
        "deposed",
        None,
    ),
    "4_2_empty_replica_below_the_masters_retention_starts_at_its_min": (
        slave(epoch=3),
        MasterAnswered(3, 512, 900, ((3, 0),), local((), max_offset=0, confirm=0)),
        [StartAt, Ack],
        None,
        (StartAt(512), 512),
    ),
    "4_2_empty_replica_within_the_masters_log_starts_at_its_end": (
        slave(epoch=3),
        MasterAnswered(3, 0, 900, ((3, 0),), local((), max_offset=0, confirm=0)),
        [Ack],
        None,
        (None, 0),
    ),
    "4_2_replica_in_agreement_acks_its_end": (
        slave(epoch=2),
        MasterAnswered(2, 0, 300, ((1, 0), (2, 100)), local()),
        [Ack],
        None,
        (None, 200),
    ),
    "3_2_fork_is_cut_at_the_last_consistent_point": (
        # local epoch 3 never reached the master of epoch 4; epoch 2 ends at 150 here, at 170 there
        slave(epoch=4),
        MasterAnswered(
            4, 0, 300, ((1, 0), (2, 100), (4, 170)), local(((1, 0), (2, 100), (3, 150)), confirm=120)
        ),
        [Truncate, Ack],
        None,
        (Truncate(150), 150),
    ),
    "3_2_cut_below_the_confirm_offset_is_refused_after_a_clean_election": (
        slave(epoch=3),
        MasterAnswered(3, 0, 300, ((1, 0), (3, 150)), local(confirm=180)),
        [Refuse],
        "below-confirm",
        None,
    ),
    "3_2_cut_below_the_confirm_offset_is_refused_when_the_unclean_epoch_is_not_newer": (
        slave(epoch=3, unclean=2),
        MasterAnswered(3, 0, 300, ((1, 0), (3, 150)), local(confirm=180)),
        [Refuse],
        "below-confirm",
        None,
    ),
    "3_2_cut_below_the_confirm_offset_is_allowed_after_a_newer_unclean_election": (
        slave(epoch=3, unclean=3),
        MasterAnswered(3, 0, 300, ((1, 0), (3, 150)), local(confirm=180)),
        [Truncate, Ack],
        None,
        (Truncate(100), 100),
    ),
    "3_2_no_common_epoch_discards_the_local_log": (
        slave(epoch=4),
        MasterAnswered(
            4, 0, 300, ((1, 0), (4, 100)), local(((3, 50),), min_offset=50, max_offset=120, confirm=50)
        ),
        [Truncate, Ack],
        None,
        (Truncate(50, no_common_epoch=True), 50),
    ),
    "3_2_no_common_epoch_below_the_confirm_offset_is_refused": (
        slave(epoch=4),
        MasterAnswered(
            4, 0, 300, ((1, 0), (4, 100)), local(((3, 50),), min_offset=50, max_offset=120, confirm=80)
        ),
        [Refuse],
        "below-confirm",
        None,
    ),
    "4_2_lagging_replica_is_not_cut": (
        slave(epoch=3),
        MasterAnswered(3, 0, 300, ((1, 0), (2, 100), (3, 250)), local()),
        [Ack],
        None,
        (None, 200),
    ),
    "4_2_flush_sync_awaits_the_flush_before_the_first_ack": (
        slave(epoch=2, flush_sync=True),
        MasterAnswered(2, 0, 300, ((1, 0), (2, 100)), local()),
        [AwaitFlush, Ack],
        None,
        (None, 200),
    ),
    "4_2_flush_sync_awaits_the_flush_of_the_cut_log": (
        slave(epoch=4, flush_sync=True),
        MasterAnswered(
            4, 0, 300, ((1, 0), (2, 100), (4, 170)), local(((1, 0), (2, 100), (3, 150)), confirm=120)
        ),
        [Truncate, AwaitFlush, Ack],
        None,
        (Truncate(150), 150),
    ),
}


@pytest.mark.parametrize("name", list(ANSWERED))
def test_master_answered(name: str):
    core, event, types, refuse_kind, expected = ANSWERED[name]
    actions = core.step(event, now_ms=0)
    assert [type(a) for a in actions] == types
    if refuse_kind is not None:
        assert actions[0].kind == refuse_kind
        return
    cut, end = expected
    assert (actions[0] if cut is not None else None) == cut
    assert actions[-1] == Ack(end)
    if core.flush_sync:
        assert actions[-2] == AwaitFlush(end)


def test_3_2_after_a_cut_the_stream_may_carry_the_masters_older_epoch():
    # cut inside epoch 2: the lagging slave takes the rest of epoch 2 from the master, then epoch 4
    core = slave(epoch=4)
    core.step(
        MasterAnswered(
            4, 0, 300, ((1, 0), (2, 100), (4, 170)), local(((1, 0), (2, 100), (3, 150)), confirm=120)
        ),
        0,
    )
    assert core.seen_epoch == 2
    cut = local(((1, 0), (2, 100)), max_offset=150, confirm=120)
    assert core.step(TransferArrived(150, 2, 100, 150, 20, cut), 0) == [Append(), Ack(170), SetConfirm(150)]
    after = local(((1, 0), (2, 100)), max_offset=170, confirm=150)
    assert core.step(TransferArrived(170, 4, 170, 180, 30, after), 0) == [
        RecordEpoch(4, 170),
        Append(),
        Ack(200),
        SetConfirm(180),
    ]
    assert core.seen_epoch == 4


def test_3_2_refused_handshake_leaves_the_seen_epoch():
    core = slave(epoch=3, seen=1)
    core.step(MasterAnswered(3, 0, 300, ((1, 0), (3, 150)), local(confirm=180)), 0)
    assert core.seen_epoch == 1


# --- TransferArrived: the checks on each frame (§4.3) --------------------------------------

AT_200 = local(max_offset=200, confirm=150)

TRANSFERS = {
    "4_3_data_of_an_older_epoch_than_seen_is_refused": (
        slave(seen=3),
        TransferArrived(200, 2, 100, 200, 50, AT_200),
        [Refuse("epoch-went-back", "")],
    ),
    "4_3_heartbeat_of_an_older_epoch_than_seen_is_refused": (
        slave(seen=3),
        TransferArrived(200, 2, 100, 200, 0, AT_200),
        [Refuse("epoch-went-back", "")],
    ),
    "4_3_transfer_not_at_the_local_end_is_refused": (
        slave(seen=2),
        TransferArrived(210, 2, 100, 200, 50, AT_200),
        [Refuse("offset-mismatch", "")],
    ),
    "4_3_transfer_before_the_local_end_is_refused": (
        slave(seen=2),
        TransferArrived(190, 2, 100, 200, 50, AT_200),
        [Refuse("offset-mismatch", "")],
    ),
    "4_3_data_of_the_current_epoch_is_appended_and_acked": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 150, 50, AT_200),
        [Append(), Ack(250)],
    ),
    "4_3_data_of_a_new_epoch_records_it_first": (
        slave(seen=2),
        TransferArrived(200, 3, 200, 220, 50, AT_200),
        [RecordEpoch(3, 200), Append(), Ack(250), SetConfirm(220)],
    ),
    "4_3_data_under_flush_sync_awaits_the_flush_before_the_ack": (
        slave(seen=2, flush_sync=True),
        TransferArrived(200, 3, 200, 220, 50, AT_200),
        [RecordEpoch(3, 200), Append(), AwaitFlush(250), Ack(250), SetConfirm(220)],
    ),
    "4_3_confirm_follows_the_master_never_past_the_new_end": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 400, 50, AT_200),
        [Append(), Ack(250), SetConfirm(250)],
    ),
    "4_3_heartbeat_moves_only_the_confirm_offset": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 180, 0, AT_200),
        [SetConfirm(180)],
    ),
    "4_3_heartbeat_confirm_never_passes_the_local_end": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 400, 0, AT_200),
        [SetConfirm(200)],
    ),
    "4_3_heartbeat_with_the_same_confirm_does_nothing": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 150, 0, AT_200),
        [],
    ),
    "4_3_heartbeat_with_an_older_confirm_does_nothing": (
        slave(seen=2),
        TransferArrived(200, 2, 100, 120, 0, AT_200),
        [],
    ),
    "4_3_heartbeat_of_a_new_epoch_records_nothing": (
        slave(seen=2),
        TransferArrived(200, 3, 200, 150, 0, AT_200),
        [],
    ),
}


@pytest.mark.parametrize("name", list(TRANSFERS))
def test_transfer_arrived(name: str):
    core, event, expected = TRANSFERS[name]
    seen_before = core.seen_epoch
    actions = core.step(event, now_ms=0)
    if expected and isinstance(expected[0], Refuse):
        assert len(actions) == 1 and isinstance(actions[0], Refuse)
        assert actions[0].kind == expected[0].kind
        assert core.seen_epoch == seen_before  # a refused frame teaches nothing
    else:
        assert actions == expected
        assert core.seen_epoch == max(seen_before, event.epoch)


def test_4_3_seen_epoch_fences_a_deposed_master_after_a_heartbeat_of_the_new_one():
    core = slave(seen=2)
    assert core.step(TransferArrived(200, 3, 200, 150, 0, AT_200), 0) == []
    assert core.seen_epoch == 3
    assert [type(a) for a in core.step(TransferArrived(200, 2, 100, 150, 10, AT_200), 0)] == [Refuse]


# --- AckTick -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flush_sync", "expected"), [(False, Ack(200)), (True, Ack(170))])
def test_4_1_periodic_ack_is_the_flushed_offset_under_flush_sync(flush_sync: bool, expected: Ack):
    assert slave(flush_sync=flush_sync).step(AckTick(local(max_offset=200, flushed=170)), 0) == [expected]


# --- properties ----------------------------------------------------------------------------


@st.composite
def local_logs(draw: st.DrawFn) -> LocalLog:
    starts = sorted(draw(st.lists(st.integers(0, 300), max_size=4)))
    epochs = tuple(
        zip(
            sorted(draw(st.sets(st.integers(1, 8), min_size=len(starts), max_size=len(starts)))),
            starts,
            strict=True,
        )
    )
    low = starts[0] if starts else 0
    max_offset = draw(st.integers(starts[-1] if starts else 0, 400))
    min_offset = draw(st.integers(0, low if starts else max_offset))
    confirm = draw(st.integers(min_offset, max_offset))
    flushed = draw(st.integers(0, max_offset))
    return LocalLog(epochs, min_offset, max_offset, confirm, flushed)


@settings(max_examples=200, deadline=None)
@given(
    local_logs(),
    st.integers(0, 8),
    st.booleans(),
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(-20, 20),
    st.integers(0, 500),
    st.integers(0, 100),
)
def test_4_3_transfer_never_confirms_past_its_end_nor_acks_what_it_refuses(
    log, seen, flush_sync, epoch, epoch_start, shift, master_confirm, length
):
    core = slave(flush_sync=flush_sync, seen=seen)
    offset = max(0, log.max_offset + (shift if shift % 3 == 0 else 0))  # mostly at the local end
    actions = core.step(TransferArrived(offset, epoch, epoch_start, master_confirm, length, log), 0)
    refused = [a for a in actions if isinstance(a, Refuse)]
    if refused:
        assert actions == refused and len(refused) == 1
        assert core.seen_epoch == seen
        return
    assert offset == log.max_offset and epoch >= seen
    for action in actions:
        if isinstance(action, SetConfirm):
            assert log.confirm_offset < action.offset <= offset + length
            assert action.offset <= master_confirm
        if isinstance(action, (Ack, AwaitFlush)):
            assert action.offset == offset + length and length > 0
    kinds = [type(a) for a in actions]
    if length:
        assert kinds.index(Append) < kinds.index(Ack)
        assert (AwaitFlush in kinds) == flush_sync
        if flush_sync:
            assert kinds.index(AwaitFlush) < kinds.index(Ack)


@settings(max_examples=200, deadline=None)
@given(local_logs(), local_logs(), st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.booleans())
def test_3_2_handshake_never_cuts_below_the_confirm_offset_after_a_clean_election(
    log, master_log, assigned, unclean, master_epoch, flush_sync
):
    core = slave(epoch=assigned, unclean=unclean, flush_sync=flush_sync)
    event = MasterAnswered(
        max(master_epoch, master_log.last_epoch),
        master_log.min_offset,
        master_log.max_offset,
        master_log.epochs,
        log,
    )
    actions = core.step(event, 0)
    refused = [a for a in actions if isinstance(a, Refuse)]
    if refused:
        assert actions == refused and len(refused) == 1
        return
    assert event.master_epoch >= max(assigned, log.last_epoch)  # a deposed master is always refused
    end = log.max_offset
    cuts = [a for a in actions if isinstance(a, Truncate)]
    if cuts:
        [cut] = cuts
        assert actions[0] == cut
        assert log.min_offset <= cut.to < log.max_offset
        assert cut.to >= log.confirm_offset or unclean > log.last_epoch
        end = cut.to
    starts = [a for a in actions if isinstance(a, StartAt)]
    if starts:  # only an empty replica below the master's retention begins anew, at the master's min
        [start] = starts
        assert actions[0] == start and not cuts
        assert log.min_offset == log.max_offset < start.offset == master_log.min_offset and not log.epochs
        end = start.offset
    assert actions[-1] == Ack(end)
    assert (AwaitFlush(end) in actions) == flush_sync
    assert core.seen_epoch <= log.last_epoch
