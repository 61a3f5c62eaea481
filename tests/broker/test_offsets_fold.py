"""The fold of group-offset records (broker/offsets.py): commits and tombstones, pure.

As a property over any sequence of commits and deletes, the fold gives each (group, topic,
queue) its last commit with that commit's position, and nothing for a key whose last record is
a tombstone; malformed bodies change nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.offsets import (
    TOMBSTONE,
    Key,
    commit_message,
    fold_commit,
    is_tombstone,
    parse_commit,
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
