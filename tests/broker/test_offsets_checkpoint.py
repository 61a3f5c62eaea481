"""The group-offsets fold's checkpoint (broker/offsetscheckpoint.py, broker/offsets.py).

Pure: a fold checkpointed anywhere in a sequence of commits and tombstones, encoded, decoded and
folded on from there, equals the fold of the whole sequence; any damage to the bytes decodes to
nothing; the trust rule refuses a log that no longer holds the history the checkpoint covers.
On a real commit log: a fresh fold starting from the checkpoint reads only the commits after it
and ends where a fold of the whole log ends; a corrupt checkpoint is ignored with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker import offsetscheckpoint as ocp
from tidelog.broker.offsets import (
    CHECKPOINT_FILE,
    OFFSETS_TOPIC,
    GroupOffsets,
    Key,
    commit_body,
    commit_message,
    fold_commit,
    parse_commit,
    tombstone_message,
)
from tidelog.commitlog import CommitLog

_NAMES = st.sampled_from(["g", "h", "é", 'q"x'])
_KEYS = st.tuples(_NAMES, st.sampled_from(["t", "u"]), st.integers(0, 2))
_RECORDS = st.lists(st.tuples(_KEYS, st.one_of(st.none(), st.integers(0, 50))), max_size=40)


def _body(key: Key, offset: int | None) -> bytes:
    return (tombstone_message(*key) if offset is None else commit_message(*key, offset)).body


def _fold(records: list[tuple[Key, int | None]], start: int = 0) -> dict[Key, tuple[int, int]]:
    out: dict[Key, tuple[int, int]] = {}
    for phys, (key, offset) in enumerate(records[start:], start):
        fold_commit(out, _body(key, offset), phys)
    return out


@given(_RECORDS, st.data())
def test_a_fold_resumed_from_its_checkpoint_equals_the_fold_of_every_commit(
    records: list[tuple[Key, int | None]], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(records)))
    cp = ocp.FoldCheckpoint(
        applied=cut,
        covers=cut,
        last=None if cut == 0 else ocp.LastRecord(cut - 1, 1, 7),
        epoch=None if cut == 0 else (1, 0),
        offsets=_fold(records[:cut]),
    )
    decoded = ocp.decode(ocp.encode(cp))
    assert decoded == cp
    resumed = ocp.restore(decoded, 0)
    for phys, (key, offset) in enumerate(records[cut:], cut):
        fold_commit(resumed, _body(key, offset), phys)
    assert resumed == _fold(records)


def _sample() -> ocp.FoldCheckpoint:
    return ocp.FoldCheckpoint(
        applied=3,
        covers=300,
        last=ocp.LastRecord(200, 2, 99),
        epoch=(2, 100),
        offsets={("g", "t", 0): (5, 150), ("g", "t", 1): (7, 200), ("h", "t", 0): (1, 40)},
    )


@given(st.data())
def test_any_damage_to_a_checkpoint_decodes_to_nothing(data: st.DataObject) -> None:
    raw = bytearray(ocp.encode(_sample()))
    how = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "cut":
        del raw[data.draw(st.integers(0, len(raw) - 1)) :]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=8))
    assert ocp.decode(bytes(raw)) is None


def _facts(**kw: object) -> ocp.LogFacts:
    base = ocp.LogFacts(
        max_offset=500,
        confirm_offset=500,
        min_offset=0,
        epoch_at_covers=(2, 100),
        record_at_last=(2, 2, 99),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "trusted"),
    [
        (_facts(), True),
        (_facts(max_offset=299), False),  # the log lost what the checkpoint covers
        (_facts(epoch_at_covers=(3, 250)), False),  # cut below covers and written again in a new epoch
        (_facts(epoch_at_covers=None), False),
        (_facts(record_at_last=(2, 2, 98)), False),  # another record at the same place
        (_facts(record_at_last=None), False),
        (_facts(min_offset=250, record_at_last=None), True),  # retention took it: the epoch decides
    ],
)
def test_a_checkpoint_is_trusted_only_while_the_log_holds_its_history(
    facts: ocp.LogFacts, trusted: bool
) -> None:
    assert (ocp.trust(_sample(), facts) is None) is trusted


def test_a_trusted_checkpoint_is_taken_once_its_commits_are_confirmed_again() -> None:
    assert not ocp.ready(_sample(), 299)  # the fold shows confirmed commits only
    assert ocp.ready(_sample(), 300)


def test_restore_drops_the_commits_whose_record_retention_removed() -> None:
    # (h, t, 0) was committed at 40, below the log's start now: compaction did not carry it (it
    # was dead), so a fold of the whole log would not find it either
    assert ocp.restore(_sample(), 100) == {("g", "t", 0): (5, 150), ("g", "t", 1): (7, 200)}


# --- on a real commit log -------------------------------------------------------------------


def _commit_round(log: CommitLog, groups: int, value: int) -> None:
    log.append([commit_message(f"g{g}", "orders", q, value + q) for g in range(groups) for q in range(4)])
    log.confirm_offset = log.max_offset


@pytest.fixture
def log(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened = CommitLog.open(tmp_path / "data", flush="async")
    yield opened
    opened.close()


def test_a_restart_folds_only_the_commits_after_the_checkpoint(log: CommitLog) -> None:
    _commit_round(log, 20, 100)
    first = GroupOffsets(log)
    assert first.save_checkpoint()
    path = Path(log.directory) / CHECKPOINT_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    covered = first.checkpoint_now()  # nothing new: nothing to write
    assert covered is None
    checkpoint_end = log.max_offset
    _commit_round(log, 20, 200)
    log.append([tombstone_message("g3", "orders", 1)])
    log.confirm_offset = log.max_offset

    read: list[int] = []
    tail = log.tail

    def counted(topic, queue, start, *args, **kwargs):  # type: ignore[no-untyped-def]
        for m in tail(topic, queue, start, *args, **kwargs):
            read.append(m.phys_offset)
            yield m

    log.tail = counted  # type: ignore[method-assign]
    restarted = GroupOffsets(log)
    got = restarted.committed()
    log.tail = tail  # type: ignore[method-assign]
    assert restarted.restored_from == checkpoint_end
    assert read and min(read) >= checkpoint_end  # nothing before the checkpoint read again
    assert got == GroupOffsets(log, checkpoint=False).committed()
    assert ("g3", "orders", 1) not in got and got[("g0", "orders", 2)][0] == 202


def test_a_corrupt_checkpoint_is_ignored_with_a_warning(
    log: CommitLog, caplog: pytest.LogCaptureFixture
) -> None:
    _commit_round(log, 5, 10)
    assert GroupOffsets(log).save_checkpoint()
    path = Path(log.directory) / CHECKPOINT_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    _commit_round(log, 5, 20)
    with caplog.at_level(logging.WARNING, logger="tidelog.broker.offsets"):
        restarted = GroupOffsets(log)
        got = restarted.committed()
    assert "not an intact checkpoint" in caplog.text
    assert restarted.restored_from is None
    assert got == GroupOffsets(log, checkpoint=False).committed()
    assert got[("g4", "orders", 3)][0] == 23


def test_a_checkpoint_of_a_longer_history_than_the_log_holds_is_not_used(
    log: CommitLog, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    _commit_round(log, 5, 10)
    other = CommitLog.open(tmp_path / "other", flush="async")
    try:
        _commit_round(other, 5, 10)
        _commit_round(other, 5, 20)
        assert GroupOffsets(other).save_checkpoint()
        os.replace(Path(other.directory) / CHECKPOINT_FILE, Path(log.directory) / CHECKPOINT_FILE)
    finally:
        other.close()
    with caplog.at_level(logging.WARNING, logger="tidelog.broker.offsets"):
        restarted = GroupOffsets(log)
        got = restarted.committed()
    assert "no longer matches the log" in caplog.text
    assert got == GroupOffsets(log, checkpoint=False).committed()
    assert got[("g0", "orders", 0)][0] == 10


def test_the_checkpoint_covers_confirmed_commits_only(log: CommitLog) -> None:
    _commit_round(log, 3, 10)
    log.append([commit_message("g0", "orders", 0, 99)])  # not confirmed
    offsets = GroupOffsets(log)
    cp = offsets.checkpoint_now()
    assert cp is not None and cp.covers == log.confirm_offset < log.max_offset
    assert cp.offsets[("g0", "orders", 0)][0] == 10
    assert cp.applied == 12 and log.read_at(cp.last.phys_offset).topic == OFFSETS_TOPIC  # type: ignore[union-attr]


def test_a_fork_repair_below_the_fold_is_folded_again_even_once_the_log_grew_back(log: CommitLog) -> None:
    """A cut that the log grows back past before the next refresh: without the truncation
    listener the fold (and every checkpoint written from it) would keep the commits cut away."""
    placed = log.append([commit_message("g", "orders", q, 5) for q in range(4)])
    log.confirm_offset = log.max_offset
    offsets = GroupOffsets(log)
    assert offsets.committed()[("g", "orders", 3)][0] == 5
    log.truncate(placed[2].phys_offset)  # commits of queues 2 and 3 go
    log.append([commit_message("h", "orders", 0, 1) for _ in range(6)])  # grows back past them
    log.confirm_offset = log.max_offset
    got = offsets.committed()
    assert ("g", "orders", 3) not in got
    assert got == GroupOffsets(log, checkpoint=False).committed()
    cp = offsets.checkpoint_now()
    assert cp is not None and ("g", "orders", 2) not in cp.offsets


def test_a_checkpoint_past_the_confirm_offset_waits_for_it_and_is_then_taken(log: CommitLog) -> None:
    """A restarted replica's confirm offset can start short of the checkpoint (a slave before
    its master's next transfer): the fold shows what is confirmed meanwhile, and takes the
    checkpoint once the confirm offset reaches it."""
    _commit_round(log, 4, 10)
    confirmed_end = log.max_offset
    log.append([commit_message(f"g{g}", "orders", 0, 50 + g) for g in range(4)])  # not confirmed yet
    # the checkpoint a replica wrote while these were confirmed, before its restart
    state: dict[Key, tuple[int, int]] = {}
    records = list(log.tail(OFFSETS_TOPIC, 0, 0))
    for m in records:
        fold_commit(state, m.body, m.phys_offset)
    last = records[-1]
    cp = ocp.FoldCheckpoint(
        applied=last.queue_offset + 1,
        covers=last.phys_offset + last.size,
        last=ocp.LastRecord(last.phys_offset, last.epoch, crc32c(last.body)),
        epoch=None,
        offsets=state,
    )
    (Path(log.directory) / CHECKPOINT_FILE).write_bytes(ocp.encode(cp))
    offsets = GroupOffsets(log)
    assert offsets.committed()[("g0", "orders", 0)][0] == 10  # only what is confirmed
    assert offsets.restored_from is None and log.confirm_offset == confirmed_end
    log.confirm_offset = log.max_offset
    assert offsets.committed()[("g0", "orders", 0)][0] == 50
    assert offsets.restored_from == cp.covers
    assert offsets.committed() == GroupOffsets(log, checkpoint=False).committed()


@settings(deadline=None, max_examples=50)  # each example opens and writes a log
@given(_RECORDS, st.data())
def test_the_group_count_is_the_groups_holding_a_commit(
    tmp_path_factory: pytest.TempPathFactory, records: list[tuple[Key, int | None]], data: st.DataObject
) -> None:
    """`max_groups` counts the groups with a confirmed commit: commits add a group, tombstones of
    its last key remove it, and a fold resumed from its checkpoint counts the same."""
    log = CommitLog.open(tmp_path_factory.mktemp("groups"), flush="async")
    try:
        cut = data.draw(st.integers(0, len(records)))
        for key, offset in records[:cut]:
            log.append([tombstone_message(*key) if offset is None else commit_message(*key, offset)])
        log.confirm_offset = log.max_offset
        first = GroupOffsets(log)
        first.committed()
        first.save_checkpoint()
        for key, offset in records[cut:]:
            log.append([tombstone_message(*key) if offset is None else commit_message(*key, offset)])
        log.confirm_offset = log.max_offset
        want = {g for g, _, _ in _fold(records)}
        for offsets in (first, GroupOffsets(log), GroupOffsets(log, checkpoint=False)):
            others = {"g", "h", "é", 'q"x'} - want
            assert offsets.new_groups(want | others) == (others, len(want))
    finally:
        log.close()


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.text(max_size=20), st.from_regex(r"[A-Za-z0-9_%-]{1,20}", fullmatch=True)),
    st.one_of(st.text(max_size=20), st.from_regex(r"[A-Za-z0-9_%-]{1,20}", fullmatch=True)),
    st.integers(0, 1 << 31),
    st.integers(-1, 1 << 62),
)
def test_a_commit_body_is_the_json_encoders_bytes_and_parses_back(group, topic, queue, offset):
    """The encoder-free body of plain names is byte for byte what json.dumps writes, for any names."""
    want = json.dumps({"g": group, "t": topic, "q": queue, "o": offset}, separators=(",", ":")).encode()
    assert commit_body(group, topic, queue, offset) == want
    assert parse_commit(want) == ((group, topic, queue), offset)
