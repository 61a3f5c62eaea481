"""The fold of group-offset records (broker/offsets.py): commits and tombstones, pure.

As a property over any sequence of commits and deletes, the fold gives each (group, topic,
queue) its last commit with that commit's position, and nothing for a key whose last record is
a tombstone; malformed bodies change nothing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.offsets import (
    BATCH_BODY_BYTES,
    FLAG_CONSUMER_OFFSET,
    OFFSETS_TOPIC,
    TOMBSTONE,
    Key,
    batch_messages,
    commit_message,
    fold_commit,
    is_tombstone,
    parse_commit,
    parse_commits,
    tombstone_message,
)

_KEYS = st.tuples(st.sampled_from(["g", "h"]), st.sampled_from(["t", "u"]), st.integers(0, 2))
_RECORDS = st.lists(st.tuples(_KEYS, st.one_of(st.none(), st.integers(0, 50))), max_size=40)


def test_a_tombstone_is_a_commit_body_with_the_tombstone_offset() -> None:
    body = tombstone_message("g", "t", 3).body
    assert parse_commit(body) == (("g", "t", 3), TOMBSTONE)
    assert is_tombstone(body)
    assert not is_tombstone(commit_message("g", "t", 3, 0).body)


def test_malformed_bodies_are_ignored() -> None:
    offsets: dict[Key, tuple[int, int]] = {("g", "t", 0): (5, 10)}
    for body in (b"", b"{", b"[]", b'{"g": "g"}', b'{"g": "g", "t": "t", "q": "x", "o": 1}'):
        assert parse_commit(body) is None
        assert not is_tombstone(body)
        fold_commit(offsets, body, 99)
    assert offsets == {("g", "t", 0): (5, 10)}


@given(_RECORDS)
def test_the_fold_keeps_the_last_word_per_key(records: list[tuple[Key, int | None]]) -> None:
    offsets: dict[Key, tuple[int, int]] = {}
    model: dict[Key, tuple[int, int] | None] = {}
    for phys, (key, offset) in enumerate(records):
        group, topic, queue = key
        msg = tombstone_message(group, topic, queue) if offset is None else commit_message(*key, offset)
        fold_commit(offsets, msg.body, phys)
        model[key] = None if offset is None else (offset, phys)
    assert offsets == {k: v for k, v in model.items() if v is not None}


def _decoded(body: bytes) -> tuple[Key, int] | None:
    """What the JSON decoder makes of a body: the meaning the fast reading must keep."""
    try:
        doc = json.loads(body)
        return (str(doc["g"]), str(doc["t"]), int(doc["q"])), int(doc["o"])
    except (ValueError, KeyError, TypeError):
        return None


_NAMES = st.text(max_size=12) | st.sampled_from(['a"b', "a\\b", "é", "x\ny", 'o":-1}'])


@given(_NAMES, _NAMES, st.integers(-3, 70000), st.integers(-1, 2**62))
def test_a_commit_body_reads_as_the_json_decoder_reads_it(
    group: str, topic: str, queue: int, offset: int
) -> None:
    body = commit_message(group, topic, queue, offset).body
    assert parse_commit(body) == _decoded(body) == ((group, topic, queue), offset)
    assert is_tombstone(body) == (offset < 0)


_PIECES = st.sampled_from(
    [
        b'{"g":"a","t":"b","q":1,"o":',
        b"-1",
        b"5",
        b"01",
        b"}",
        b"}}",
        b",",
        b'"o":',
        b'"',
        b"\\",
        b" ",
        b"\xff",
        b"\n",
    ]
)


@given(st.lists(_PIECES, max_size=8).map(b"".join))
def test_any_body_reads_as_the_json_decoder_reads_it(body: bytes) -> None:
    assert parse_commit(body) == _decoded(body)
    decoded = _decoded(body)
    assert is_tombstone(body) == (decoded is not None and decoded[1] < 0)


def test_the_bodies_commits_are_written_as_are_read_without_the_json_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart folds every commit in the log and retention asks each live one whether it is a
    tombstone: the decoder cost 20 us a commit there."""
    bodies = [commit_message(f"group-{g}", "orders", q, 7).body for g in range(3) for q in range(2)]
    monkeypatch.setattr(json, "loads", lambda *_a, **_k: pytest.fail("decoded with json"))
    assert [parse_commit(b) for b in bodies] == [
        ((f"group-{g}", "orders", q), 7) for g in range(3) for q in range(2)
    ]
    assert not any(is_tombstone(b) for b in bodies)
    assert is_tombstone(tombstone_message("group-0", "orders", 1).body)


# ------------------------------------------------------------------ batches: many commits a record

_COMMITS = st.lists(st.tuples(_NAMES, _NAMES, st.integers(0, 70000), st.integers(-1, 2**62)), max_size=30)


def _decoded_batch(body: bytes) -> list[tuple[Key, int]] | None:
    """What the JSON decoder makes of a batch's body (None: not a batch of commits)."""
    try:
        docs = json.loads(body)
        if not isinstance(docs, list):
            return None
        return [((str(d["g"]), str(d["t"]), int(d["q"])), int(d["o"])) for d in docs]
    except (ValueError, KeyError, TypeError):
        return None


@given(_COMMITS)
def test_batch_records_hold_every_commit_in_order(commits: list[tuple[str, str, int, int]]) -> None:
    records = batch_messages(commits)
    assert len(records) == (1 if commits else 0)  # small commits: one record for the call
    got = [c for m in records for c in parse_commits(m.body)]
    assert got == [((g, t, q), o) for g, t, q, o in commits]
    for m in records:
        assert m.topic == OFFSETS_TOPIC and m.queue_id == 0 and m.flags == FLAG_CONSUMER_OFFSET
        if len(commits) > 1:
            assert _decoded_batch(m.body) == got  # JSON, as the decoder reads it


@pytest.mark.parametrize("max_body", [BATCH_BODY_BYTES, 1000, 120])
def test_a_big_call_is_split_into_records_of_bounded_size(max_body: int) -> None:
    commits = [(f"group-{i:05d}", "orders", i % 8, i) for i in range(5000)]
    records = batch_messages(commits, max_body)
    assert len(records) > 1
    assert all(len(m.body) <= max_body for m in records)
    assert max(len(m.body) for m in records) > max_body - 60  # filled, not one commit each
    assert [c for m in records for c in parse_commits(m.body)] == [((g, t, q), o) for g, t, q, o in commits]


@given(_COMMITS, st.data())
def test_a_batch_body_reads_as_the_json_decoder_reads_it_or_not_at_all(
    commits: list[tuple[str, str, int, int]], data: st.DataObject
) -> None:
    """Any batch body, also spaced out or damaged: the fast reading gives the decoder's commits,
    or nothing when the decoder finds no batch of commits (the record is ignored whole)."""
    docs = [{"g": g, "t": t, "q": q, "o": o} for g, t, q, o in commits]
    body = json.dumps(docs, separators=data.draw(st.sampled_from([(",", ":"), (", ", ": ")]))).encode()
    if body != b"[]" and data.draw(st.booleans()):
        at = data.draw(st.integers(1, len(body) - 1))
        body = body[:at] + data.draw(st.sampled_from([b",", b"]", b"[", b'"', b"x", b""])) + body[at + 1 :]
    want = _decoded_batch(body)
    assert parse_commits(body) == ([] if want is None else want)


@pytest.mark.parametrize("body", [b"[", b"]", b"[,]", b"[{}]", b'[{"g":"g","t":"t","q":0,"o":1},]', b"[1,2]"])
def test_malformed_batches_fold_nothing(body: bytes) -> None:
    offsets: dict[Key, tuple[int, int]] = {("g", "t", 0): (5, 10)}
    assert parse_commits(body) == []
    assert fold_commit(offsets, body, 99) == []
    assert offsets == {("g", "t", 0): (5, 10)}


@given(_RECORDS, st.data())
def test_a_batch_folds_as_its_commits_one_record_each(
    records: list[tuple[Key, int | None]], data: st.DataObject
) -> None:
    """Grouping commits into batch records changes nothing of the fold but their positions."""
    commits = [(*key, TOMBSTONE if offset is None else offset) for key, offset in records]
    one_each: dict[Key, tuple[int, int]] = {}
    for c in commits:
        fold_commit(one_each, commit_message(*c).body, 0)
    batched: dict[Key, tuple[int, int]] = {}
    gained: dict[Key, int] = {}
    i = 0
    while i < len(commits):
        n = data.draw(st.integers(1, 5))
        for m in batch_messages(commits[i : i + n]):
            for key, delta in fold_commit(batched, m.body, 0):
                gained[key] = gained.get(key, 0) + delta
        i += n
    assert batched == one_each
    assert {k for k, n in gained.items() if n} == set(one_each)  # +1/-1 per key, as it was folded
