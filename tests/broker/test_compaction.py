"""Carry-forward of metadata records before retention (broker/compaction.py, docs/ARCHITECTURE.md
§6.4): the decision's table, then rounds over a real commit log — group offsets and topic
markers survive the deletion of the segments that held them, also for a replica that folds the
log again from scratch; a commit of a deleted topic is not revived; a key with a newer
unconfirmed record is kept rather than copied; a tombstone (a deleted group's offsets) is never
copied and takes the commits it hides with it; and, as a property over random mixes of commits,
deletes and rounds, a fresh fold always finds every latest commit and none that was deleted."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker import sharedstate as ss
from tidelog.broker.compaction import Live, MetadataFold, carry_plan, copy_message
from tidelog.broker.offsets import GroupOffsets, batch_messages, commit_message, tombstone_message
from tidelog.broker.shared import SharedStates, state_message
from tidelog.broker.topics import MARKS_TOPIC, TopicTable, decode_mark
from tidelog.commitlog import CommitLog, Message

SEG = 4096
T = "t"

G = ("offsets", "g", T, "0")
M = ("topic", T)

PLAN_CASES = [
    # (name, live, pending, limit, ledger starts, dead ledgers, carried offsets, floor)
    ("nothing below the limit", [Live(G, 500, b"")], set(), 100, {}, set(), [], None),
    ("a live record below is copied and holds", [Live(G, 50, b""), Live(M, 20, b"")], set(), 100, {}, set(), [20, 50], 20),
    ("a pending key holds without a copy", [Live(G, 50, b"")], {G}, 100, {}, set(), [], 50),
    ("an existing ledger holds from its CREATE", [], set(), 100, {7: 30}, set(), [], 30),
    ("a deleted ledger holds nothing", [], set(), 100, {7: 30}, {7}, [], None),
    ("a ledger created past the limit holds nothing here", [], set(), 100, {7: 300}, set(), [], None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "live", "pending", "limit", "starts", "dead", "carried", "floor"),
    PLAN_CASES,
    ids=[c[0] for c in PLAN_CASES],
)
def test_carry_plan_table(
    name: str,
    live: list[Live],
    pending: set[tuple[str, ...]],
    limit: int,
    starts: dict[int, int],
    dead: set[int],
    carried: list[int],
    floor: int | None,
) -> None:
    plan = carry_plan(live, pending, limit, starts, dead)
    assert [r.offset for r in plan.carry] == carried
    assert plan.floor == floor


def test_a_marker_copy_names_the_original_position() -> None:
    body = json.dumps({"t": T, "g": 2, "cut": {"0": 5}}).encode()
    first = copy_message(Live(M, 1234, body))
    assert first.topic == MARKS_TOPIC and json.loads(first.body)["at"] == 1234
    again = copy_message(Live(M, 9999, first.body))  # a copy of a copy keeps the original's
    assert json.loads(again.body)["at"] == 1234
    assert decode_mark(again.body) == (T, 2, {0: 5})


# ------------------------------------------------------------------ rounds over a real log


def _open(path: Path) -> CommitLog:
    return CommitLog.open(path, segment_bytes=SEG)


def _append(log: CommitLog, msgs: list[Message], confirm: bool = True) -> None:
    log.append(msgs)
    if confirm:
        log.confirm_offset = log.max_offset


def _table(log: CommitLog, generation: int) -> TopicTable:
    table = TopicTable(log)
    table.update("a", [SimpleNamespace(name=T, queues={"a": 2}, generation=generation)])
    return table


def _fill(log: CommitLog, segments: int) -> None:
    """Messages until the log has rolled `segments` more segments."""
    target = len(log.segment_infos()) + segments
    while len(log.segment_infos()) < target:
        _append(log, [Message(T, 1, b"x" * 500)])


def _round(log: CommitLog) -> int:
    """One master round with every closed segment expired: copy, confirm, delete what may go."""
    if not log.segment_infos():
        return log.min_offset
    limit = log.segment_infos()[-1].base
    fold = MetadataFold(log)
    plan = carry_plan(*fold.refresh(), limit, {}, set())
    if plan.carry:
        _append(log, [copy_message(r) for r in plan.carry])
    return log.delete_before(limit if plan.floor is None else min(limit, plan.floor))


def _fetch(log: CommitLog, table: TopicTable, group: str, queue: int) -> int | None:
    table.marks.refresh()
    return GroupOffsets(log).fetch(group, T, queue, since=table.marks.marked_at(T))


def test_offsets_and_markers_survive_retention_and_a_refold(tmp_path: Path) -> None:
    log = _open(tmp_path)
    table = _table(log, 1)
    table.serve(T, lambda m: log.append([m])[-1])
    _append(log, [Message(T, 0, b"m%d" % i) for i in range(5)])
    _append(log, [commit_message("g", T, 0, 3), commit_message("g", T, 1, 0), commit_message("h", T, 0, 1)])
    _append(log, [commit_message("g", T, 1, 0)])
    marker_at = table.marks.marked_at(T)
    _fill(log, 3)
    first_min = _round(log)  # copies appended; the originals hold their segment this round
    assert first_min == 0
    second_min = _round(log)
    assert second_min > marker_at  # the original records are gone now
    log.close()

    log = _open(tmp_path)  # a replica folding everything again from its log
    table = _table(log, 1)
    assert table.marks.generation(T) == 1
    assert table.marks.marked_at(T) == marker_at
    assert _fetch(log, table, "g", 0) == 3
    assert _fetch(log, table, "g", 1) == 0
    assert _fetch(log, table, "h", 0) == 1
    table.serve(T, None)  # a slave serves it: its log holds the current generation
    log.close()


def test_a_commit_of_a_deleted_topic_is_not_revived(tmp_path: Path) -> None:
    log = _open(tmp_path)
    table = _table(log, 1)
    table.serve(T, lambda m: log.append([m])[-1])
    _append(log, [Message(T, 0, b"old")])
    _append(log, [commit_message("g", T, 0, 1)])
    table.update("a", [SimpleNamespace(name=T, queues={"a": 2}, generation=2)])
    table.serve(T, lambda m: log.append([m])[-1])  # the topic was deleted and created again
    log.confirm_offset = log.max_offset
    assert _fetch(log, table, "g", 0) is None
    _fill(log, 3)
    _round(log)
    _round(log)
    log.close()
    log = _open(tmp_path)
    table = _table(log, 2)
    assert table.marks.generation(T) == 2
    assert _fetch(log, table, "g", 0) is None
    log.close()


def test_a_key_with_an_unconfirmed_newer_commit_keeps_its_segment(tmp_path: Path) -> None:
    log = _open(tmp_path)
    _append(log, [commit_message("g", T, 0, 1)])
    first = log.segment_infos()[0]
    _fill(log, 3)
    _append(log, [commit_message("g", T, 0, 2)], confirm=False)
    limit = log.segment_infos()[-1].base
    plan = carry_plan(*MetadataFold(log).refresh(), limit, {}, set())
    assert plan.carry == []  # a copy of offset 1 would land after the pending 2 and undo it
    assert plan.floor is not None and plan.floor < first.end
    log.close()


def test_a_tombstone_is_never_copied_and_goes_with_the_commit_it_hides(tmp_path: Path) -> None:
    log = _open(tmp_path)
    _append(log, [commit_message("g", T, 0, 3), commit_message("h", T, 0, 1)])
    _append(log, [tombstone_message("g", T, 0)])
    live, _ = MetadataFold(log).refresh()
    assert [json.loads(r.body)["g"] for r in live] == ["h"]  # g's commit is hidden, its tombstone dead
    _fill(log, 3)
    _round(log)
    _round(log)
    copies = [
        json.loads(m.body) for m in log.read("%OFFSETS%", 0, log.queue_offsets("%OFFSETS%", 0).min, 100)
    ]
    assert copies == [{"g": "h", "t": T, "q": 0, "o": 1}]  # only h's commit was carried forward
    log.close()
    log = _open(tmp_path)  # a replica folding its log again after retention
    try:
        offsets = GroupOffsets(log)
        assert offsets.fetch("g", T, 0) is None
        assert offsets.fetch("h", T, 0) == 1
    finally:
        log.close()


def test_a_batch_record_carries_only_its_live_commits(tmp_path: Path) -> None:
    """A record of many commits (`CommitOffsets`) whose commit of one key was superseded: the
    copy carries the others alone, so the superseded commit does not come back after it."""
    log = _open(tmp_path)
    try:
        _append(log, batch_messages([("g", T, 0, 5), ("g", T, 1, 7), ("h", T, 0, 2)]))
        _fill(log, 2)
        _append(log, [commit_message("g", T, 0, 9)])  # supersedes the batch's first commit, kept
        _round(log)
        _round(log)
        assert log.min_offset > 0  # the batch's segment is gone
        assert [_fetch(log, _table(log, 0), g, q) for g, q in (("g", 0), ("g", 1), ("h", 0))] == [9, 7, 2]
    finally:
        log.close()


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["commit", "unconfirmed"]),
            st.sampled_from(["g", "h"]),
            st.integers(0, 1),
            st.integers(0, 9),
        ),
        st.tuples(
            st.sampled_from(["delete", "unconfirmed-delete"]), st.sampled_from(["g", "h"]), st.integers(0, 1)
        ),
        st.tuples(
            st.sampled_from(["batch", "unconfirmed-batch"]),
            st.lists(
                st.tuples(st.sampled_from(["g", "h"]), st.integers(0, 1), st.integers(-1, 9)),
                min_size=2,
                max_size=4,
            ),
        ),
        st.tuples(st.just("fill"), st.integers(1, 2)),
        st.tuples(st.just("round")),
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_OPS)
def test_any_mix_of_commits_and_rounds_keeps_every_latest_commit(ops: list[tuple[Any, ...]]) -> None:
    """Property: whatever retention deleted, a fresh fold of the log gives each (group, queue)
    the last offset committed — never an older one, never none — and nothing once deleted; also
    when commits share a record (a batch: its superseded commits must not come back with a copy)."""
    want: dict[tuple[str, int], int | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = _open(Path(tmp))
        try:
            for op in ops:
                if op[0] in ("commit", "unconfirmed"):
                    kind, group, queue, offset = op
                    _append(log, [commit_message(group, T, queue, offset)], confirm=kind == "commit")
                    want[(group, queue)] = offset
                elif op[0] in ("delete", "unconfirmed-delete"):
                    kind, group, queue = op
                    _append(log, [tombstone_message(group, T, queue)], confirm=kind == "delete")
                    want[(group, queue)] = None
                elif op[0] in ("batch", "unconfirmed-batch"):
                    # one record of many commits (a tombstone among them: offset -1)
                    (msg,) = batch_messages([(g, T, q, o) for g, q, o in op[1]])
                    _append(log, [msg], confirm=op[0] == "batch")
                    for g, q, o in op[1]:
                        want[(g, q)] = None if o < 0 else o
                elif op[0] == "fill":
                    _fill(log, op[1])
                else:
                    _round(log)
            _fill(log, 2)
            _round(log)
            _round(log)
        finally:
            log.close()
        log = _open(Path(tmp))
        try:
            offsets = GroupOffsets(log)
            got = {k: offsets.fetch(k[0], T, k[1]) for k in want}
        finally:
            log.close()
    assert got == want


def test_shared_subscription_states_survive_retention_and_a_refold(tmp_path: Path) -> None:
    """broker/shared.py: a group's shared-mode state (its floor, its leases) is carried forward
    like an offset commit, so retention never sends a group back to redeliver what it finished."""
    log = _open(tmp_path)
    table = _table(log, 1)
    table.serve(T, lambda m: log.append([m])[-1])
    _append(log, [Message(T, 0, b"m%d" % i) for i in range(5)])
    st = ss.start(0)
    got = ss.receive(st, 0, 5, 3, 1000, 5)
    ss.ack(st, got.deliveries[0].receipt)
    _append(log, [state_message(("g", T, 0), st)])
    marker_at = table.marks.marked_at(T)
    _fill(log, 3)
    _round(log)
    assert _round(log) > marker_at  # the original state record is gone now
    log.close()

    log = _open(tmp_path)
    table = _table(log, 1)
    table.marks.refresh()
    kept = SharedStates(log).get(("g", T, 0), since=table.marks.marked_at(T))
    assert kept is not None and ss.encode(kept) == ss.encode(st)
    assert (kept.floor, sorted(kept.leases)) == (1, [1, 2])
    log.close()


def test_a_shared_state_of_a_deleted_topic_is_not_revived(tmp_path: Path) -> None:
    log = _open(tmp_path)
    table = _table(log, 1)
    table.serve(T, lambda m: log.append([m])[-1])
    _append(log, [state_message(("g", T, 0), ss.start(7))])
    table.update("a", [SimpleNamespace(name=T, queues={"a": 2}, generation=2)])
    table.serve(T, lambda m: log.append([m])[-1])  # the topic deleted and created again
    log.confirm_offset = log.max_offset
    table.marks.refresh()
    assert SharedStates(log).get(("g", T, 0), since=table.marks.marked_at(T)) is None
    live, _ = MetadataFold(log).refresh()
    assert not [r for r in live if r.key[0] == "shared"], "never carried forward"
    log.close()
