"""The producer's batching rule and options (client/batching.py), as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.client.batching import KEYLESS_PIECE_MIN, KEYLESS_PIECES, BatchLimits, split_keyless, take_batch
from tidelog.errors import InvalidArgumentError


@given(st.lists(st.integers(1, 5000), max_size=200), st.integers(1, 50), st.integers(1024, 20000))
def test_batches_cover_every_send_once_in_order_within_limits(
    sizes: list[int], max_messages: int, max_bytes: int
) -> None:
    rest = list(enumerate(sizes))
    batches: list[list[int]] = []
    while rest:
        n = take_batch([s for _, s in rest], max_messages, max_bytes)
        assert 1 <= n <= max_messages
        batch, rest = rest[:n], rest[n:]
        assert n == 1 or sum(s for _, s in batch) <= max_bytes  # only a lone message may exceed
        batches.append([i for i, _ in batch])
    assert [i for b in batches for i in b] == list(range(len(sizes)))
    assert take_batch([], max_messages, max_bytes) == 0


@pytest.mark.parametrize(
    "kw",
    [
        {"linger_ms": -1},
        {"linger_ms": 60_001},
        {"batch_max_messages": 0},
        {"batch_max_bytes": 10},
        {"max_in_flight": 0},
        {"max_in_flight": True},
        {"linger_ms": 1.5},
    ],
)
def test_out_of_range_options_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        BatchLimits(**kw)  # type: ignore[arg-type]


@given(st.lists(st.integers(), max_size=3000, unique=True))
def test_keyless_pieces_cover_every_message_once_and_stay_few_and_large(indexes: list[int]) -> None:
    pieces = split_keyless(indexes)
    assert [i for p in pieces for i in p] == indexes
    assert len(pieces) <= KEYLESS_PIECES and all(pieces)
    if len(pieces) > 1:
        assert min(len(p) for p in pieces) >= KEYLESS_PIECE_MIN - KEYLESS_PIECES  # no tiny tail piece
