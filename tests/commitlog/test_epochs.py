"""The epoch file and the last-consistent-point rule, from docs/reference/rocketmq-controller-ha.md §5 (EpochFileCacheTest)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.commitlog.epochs import OPEN_END, EpochEntry, EpochFile, last_consistent_point
from tidelog.errors import CorruptRecordError, EpochRejectedError

A = [(1, 100), (2, 300), (3, 500)]


@pytest.mark.parametrize(
    ("name", "local", "local_end", "remote", "remote_end", "expected"),
    [
        # Sample1: epoch 3 starts differ; epoch 2 matches -> min(500, 450)
        ("sample1", A, None, [(1, 100), (2, 300), (3, 450)], None, 450),
        # Sample2: epoch 3 matches; local ends at 700, remote at 600
        ("sample2", A, 700, [(1, 100), (2, 300), (3, 500)], 600, 600),
        # Sample3: no epoch with an equal start
        ("sample3", A, None, [(1, 200), (2, 500)], None, -1),
        # Sample4: epoch 4 missing remotely; epoch 3 matches -> min(800, 700)
        ("sample4", [(1, 100), (2, 300), (3, 500), (4, 800)], None, A, 700, 700),
    ],
)
def test_5_find_consistent_point_samples(name, local, local_end, remote, remote_end, expected):
    assert last_consistent_point(local, local_end, remote, remote_end) == expected


@pytest.fixture
def cache_a(tmp_path):
    end = {"value": OPEN_END}
    f = EpochFile(str(tmp_path), lambda: end["value"])
    for epoch, start in A:
        f.append(epoch, start)
    return f, end, tmp_path


def test_5_setup_entry_ends_at_next_start(cache_a):
    f, _, _ = cache_a
    assert f.entries[1] == EpochEntry(2, 300, 500)


def test_5_init_from_file(cache_a):
    _, _, path = cache_a
    again = EpochFile(str(path), lambda: OPEN_END)
    assert again.entries[1] == EpochEntry(2, 300, 500)
    assert again.pairs() == A


def test_5_truncate_suffix_by_offset(cache_a):
    f, _, path = cache_a
    f.truncate_suffix(150)
    assert f.pairs() == [(1, 100)]
    assert EpochFile(str(path), lambda: OPEN_END).pairs() == [(1, 100)]
    # the new last entry is open again (the reference's QUIRK left the old end in memory)
    assert f.entries[-1].end == OPEN_END


def test_5_truncate_to_nothing_is_persisted(cache_a):
    f, _, path = cache_a
    f.truncate_suffix(0)
    assert EpochFile(str(path), lambda: OPEN_END).pairs() == []


def test_5_find_epoch_entry_by_offset(cache_a):
    f, _, _ = cache_a
    assert f.find(350) == EpochEntry(2, 300, 500)
    assert f.find(99) is None


@pytest.mark.parametrize(("epoch", "start"), [(3, 600), (2, 600), (4, 400), (-1, 700)])
def test_5_append_rejects_non_increasing(cache_a, epoch, start):
    f, _, _ = cache_a
    with pytest.raises(EpochRejectedError):
        f.append(epoch, start)
    assert f.pairs() == A


def test_5_append_allows_an_epoch_with_no_data(cache_a):
    f, _, _ = cache_a
    f.append(4, 500)  # a term that wrote nothing starts where the previous one started
    assert f.pairs()[-1] == (4, 500)


def test_truncate_prefix_keeps_the_entry_holding_the_offset(cache_a):
    f, _, _ = cache_a
    f.truncate_prefix(350)
    assert f.pairs() == [(2, 300), (3, 500)]


def test_damaged_file_is_an_error_not_an_empty_map(cache_a):
    _, _, path = cache_a
    p = path / EpochFile.FILE_NAME
    doc = json.loads(p.read_text())
    doc["entries"][1][1] = 301
    p.write_text(json.dumps(doc))
    with pytest.raises(CorruptRecordError, match="CRC"):
        EpochFile(str(path), lambda: OPEN_END)


@st.composite
def forked_histories(draw):
    """Two logs that share a history up to a point, then diverge with different epochs."""
    n_common = draw(st.integers(1, 5))
    starts = sorted(draw(st.lists(st.integers(0, 10_000), min_size=n_common, max_size=n_common, unique=True)))
    common = [(i + 1, s) for i, s in enumerate(starts)]
    fork = draw(st.integers(starts[-1], starts[-1] + 5000))
    local_tail = draw(st.integers(0, 3))
    remote_tail = draw(st.integers(0, 3))
    local = list(common)
    remote = list(common)
    epoch = common[-1][0]
    pos = fork
    for k in range(local_tail):
        epoch += 1
        local.append((epoch, pos + k * 10 + 1))
    for k in range(remote_tail):
        epoch += 1  # epochs differ from the local ones: each master term is unique
        remote.append((epoch, pos + k * 10 + 2))
    local_end = max(fork, local[-1][1]) + draw(st.integers(0, 100))
    remote_end = max(fork, remote[-1][1]) + draw(st.integers(0, 100))
    return local, local_end, remote, remote_end, n_common


@settings(max_examples=300, deadline=None)
@given(forked_histories())
def test_consistent_point_is_where_the_last_shared_epoch_ends_on_either_side(h):
    local, local_end, remote, remote_end, n_common = h
    local_e_end = local[n_common][1] if len(local) > n_common else local_end
    remote_e_end = remote[n_common][1] if len(remote) > n_common else remote_end
    expected = min(local_e_end, remote_e_end)
    assert last_consistent_point(local, local_end, remote, remote_end) == expected
    assert last_consistent_point(remote, remote_end, local, local_end) == expected


@settings(max_examples=200, deadline=None)
@given(forked_histories())
def test_consistent_point_with_itself_is_its_end(h):
    local, local_end, *_ = h
    assert last_consistent_point(local, local_end, local, local_end) == local_end
