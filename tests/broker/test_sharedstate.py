"""The shared mode's rules (broker/sharedstate.py): leases, receipts, redelivery, dead letters;
table tests of the documented cases and Hypothesis over random sequences of calls."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker import sharedstate as ss
from tidelog.errors import InvalidArgumentError, ReceiptInvalidError

INV = 1000


def test_a_receive_hands_out_new_offsets_up_to_the_confirmed_end() -> None:
    q = ss.start(5)
    got = ss.receive(q, 0, 9, 10, INV, 3)
    assert [(d.offset, d.attempts) for d in got.deliveries] == [(5, 1), (6, 1), (7, 1), (8, 1)]
    assert ss.receive(q, 1, 9, 10, INV, 3).deliveries == [], "leased messages are invisible"


def test_an_unacknowledged_message_comes_back_after_its_invisible_time_with_a_higher_count() -> None:
    q = ss.start(0)
    first = ss.receive(q, 0, 2, 10, INV, 3).deliveries
    ss.ack(q, first[0].receipt)
    again = ss.receive(q, INV, 2, 10, INV, 3).deliveries
    assert [(d.offset, d.attempts) for d in again] == [(1, 2)]
    with pytest.raises(ReceiptInvalidError):
        ss.ack(q, first[1].receipt)  # stale: the message went out again
    ss.ack(q, again[0].receipt)
    assert (q.floor, q.next, q.leases, q.finished) == (2, 2, {}, set())


def test_after_max_attempts_a_message_is_dead_once() -> None:
    q = ss.start(0)
    for n in range(1, 4):
        got = ss.receive(q, n * INV, 1, 10, INV, 3)
        assert [(d.offset, d.attempts) for d in got.deliveries] == [(0, n)] and got.dead == []
    got = ss.receive(q, 4 * INV, 1, 10, INV, 3)
    assert got.deliveries == [] and got.dead == [(0, 3)]
    assert ss.receive(q, 9 * INV, 1, 10, INV, 3) == ss.Received([], [])
    assert q.floor == 1


def test_a_nack_makes_the_message_visible_at_once_and_the_old_receipt_stale() -> None:
    q = ss.start(0)
    d = ss.receive(q, 0, 1, 10, INV, 5).deliveries[0]
    moved = ss.change_invisible(q, d.receipt, 10, 0)
    assert moved.offset == 0 and moved.receipt != d.receipt
    with pytest.raises(ReceiptInvalidError):
        ss.ack(q, d.receipt)
    again = ss.receive(q, 10, 1, 10, INV, 5).deliveries
    assert [(x.offset, x.attempts) for x in again] == [(0, 2)]


def test_extending_the_invisible_time_keeps_the_message_from_other_receives() -> None:
    q = ss.start(0)
    d = ss.receive(q, 0, 1, 10, INV, 5).deliveries[0]
    ss.change_invisible(q, d.receipt, 500, 5 * INV)
    assert ss.receive(q, 2 * INV, 1, 10, INV, 5).deliveries == []
    assert ss.next_visible(q) == 500 + 5 * INV


def test_the_window_bounds_what_is_leased_beyond_the_floor() -> None:
    q = ss.start(0)
    got = ss.receive(q, 0, 100, 100, INV, 5, window=10)
    assert len(got.deliveries) == 10
    assert not ss.deliverable(q, 1, 100, 10)
    ss.ack(q, got.deliveries[0].receipt)
    assert [d.offset for d in ss.receive(q, 1, 100, 100, INV, 5, window=10).deliveries] == [10]


def test_retention_below_the_floor_counts_as_finished() -> None:
    q = ss.start(0)
    ss.receive(q, 0, 5, 10, INV, 5)
    ss.trim(q, 3)
    assert (q.floor, sorted(q.leases)) == (3, [3, 4])


@pytest.mark.parametrize("text", ["", "1.2", "1.2.3.4", "x.1.1", "-1.1.1", "+1.1.1", "1. 1.1", "a" * 100])
def test_a_forged_receipt_is_an_invalid_argument(text: str) -> None:
    q = ss.start(0)
    ss.receive(q, 0, 3, 10, INV, 5)
    with pytest.raises(InvalidArgumentError):
        ss.ack(q, text)


def test_a_receipt_nobody_was_given_matches_nothing() -> None:
    q = ss.start(0)
    d = ss.receive(q, 0, 3, 10, INV, 5).deliveries[0]
    off, attempts, seq = ss.parse_receipt(d.receipt)
    for forged in (
        f"{off:x}.{attempts:x}.{seq + 7:x}",
        f"{off + 9:x}.1.1",
        f"{off:x}.{attempts + 1:x}.{seq:x}",
    ):
        with pytest.raises(ReceiptInvalidError):
            ss.ack(q, forged)
    assert 0 in q.leases, "nothing changed"


Op = st.one_of(
    st.tuples(st.just("receive"), st.integers(1, 5), st.integers(0, 3000)),
    st.tuples(st.just("ack"), st.integers(0, 20), st.integers(0, 3000)),
    st.tuples(st.just("nack"), st.integers(0, 20), st.integers(0, 3000)),
    st.tuples(st.just("produce"), st.integers(1, 4), st.integers(0, 3000)),
)


@settings(max_examples=300)
@given(st.lists(Op, max_size=60), st.integers(1, 4))
def test_random_calls_keep_the_state_whole_and_never_lease_one_message_twice(
    ops: list[tuple[str, int, int]], max_attempts: int
) -> None:
    q = ss.start(0)
    confirmed, now = 0, 0
    held: dict[int, str] = {}  # offset -> the receipt a member holds
    acked: set[int] = set()
    dead: set[int] = set()
    for kind, n, dt in ops:
        now += dt
        if kind == "produce":
            confirmed += n
        elif kind == "receive":
            got = ss.receive(q, now, confirmed, n, INV, max_attempts, window=8)
            for d in got.deliveries:
                assert d.offset not in acked and d.offset not in dead, "a finished message came back"
                assert d.attempts <= max_attempts
                held[d.offset] = d.receipt
            for off, attempts in got.dead:
                assert attempts == max_attempts and off not in dead
                dead.add(off)
                held.pop(off, None)
        elif held:
            off = sorted(held)[n % len(held)]
            lease = q.leases.get(off)
            current = lease is not None and ss.receipt(off, lease) == held[off]
            if not current:
                with pytest.raises(ReceiptInvalidError):
                    ss.ack(q, held[off])
                del held[off]
            elif kind == "ack":
                ss.ack(q, held.pop(off))
                acked.add(off)
            else:
                held[off] = ss.change_invisible(q, held[off], now, 0).receipt
        # the state's own invariants: [floor, next) is leased or finished, never both
        assert q.floor <= q.next <= confirmed
        assert set(q.leases) | q.finished == set(range(q.floor, q.next))
        assert not set(q.leases) & q.finished and q.floor not in q.finished
        assert all(off < q.floor or off in q.finished for off in acked | dead)
        # the stored form gives back the same state
        assert ss.encode(ss.decode(json.loads(ss.dumps(q)))) == ss.encode(q)


@given(
    st.dictionaries(
        st.text(max_size=3),
        st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=3)),
    )
)
def test_decoding_anything_else_is_a_value_error(doc: dict[str, object]) -> None:
    try:
        q = ss.decode(doc)
    except ValueError:
        return
    assert 0 <= q.floor <= q.next and not set(q.leases) & q.finished  # only a sound state decodes


@given(
    st.integers(0, 50), st.lists(st.integers(-5, 60), max_size=5), st.lists(st.integers(-5, 60), max_size=5)
)
def test_a_stored_state_with_offsets_out_of_place_does_not_decode(
    floor: int, leased: list[int], finished: list[int]
) -> None:
    doc = {"f": floor, "n": floor + 10, "s": 1, "l": [[o, 0, 1, 1] for o in leased], "d": finished}
    sound = all(0 <= o < 10 for o in leased + finished) and not set(leased) & set(finished)
    if sound:
        ss.decode(doc)
    else:
        with pytest.raises(ValueError):
            ss.decode(doc)


def test_key_order_holds_a_keys_next_message_until_the_one_out_is_finished() -> None:
    q = ss.start(0)
    keys = {0: 7, 1: 7, 2: None, 3: 8, 4: 7}
    got = ss.receive(q, 0, 5, 10, INV, 5, keys=keys)
    assert [d.offset for d in got.deliveries] == [0, 2, 3], "offsets 1 and 4 wait for key 7"
    assert q.skipped == {1: 7, 4: 7}
    ss.ack(q, got.deliveries[0].receipt)
    again = ss.receive(q, 1, 5, 10, INV, 5, keys=keys)
    assert [d.offset for d in again.deliveries] == [1], "then the next of key 7, and only it"
    # an expired lease of the key goes out again before anything later of that key
    later = ss.receive(q, 1 + INV, 5, 10, INV, 5, keys=keys)
    assert [(d.offset, d.attempts) for d in later.deliveries] == [(1, 2), (2, 2), (3, 2)]
    assert 4 in q.skipped


KeyOp = st.one_of(
    st.tuples(st.just("receive"), st.integers(1, 4), st.integers(0, 1500)),
    st.tuples(st.just("ack"), st.integers(0, 20), st.integers(0, 1500)),
    st.tuples(st.just("nack"), st.integers(0, 20), st.integers(0, 1500)),
    st.tuples(
        st.just("produce"),
        st.lists(st.sampled_from([None, 1, 2, 3]), min_size=1, max_size=4),
        st.integers(0, 1500),
    ),
)


@settings(max_examples=300)
@given(st.lists(KeyOp, max_size=60), st.integers(1, 3))
def test_key_order_one_message_of_a_key_out_at_a_time_in_order(
    ops: list[tuple[str, Any, int]], max_attempts: int
) -> None:
    q = ss.start(0)
    keys: dict[int, int | None] = {}
    now = 0
    held: dict[int, str] = {}
    finished: set[int] = set()
    first_delivery: dict[int, int] = {}  # key -> the highest offset delivered for the first time
    for kind, arg, dt in ops:
        now += dt
        if kind == "produce":
            for k in arg:
                keys[len(keys)] = k
        elif kind == "receive":
            got = ss.receive(q, now, len(keys), arg, INV, max_attempts, window=8, keys=keys)
            for off, _ in got.dead:
                finished.add(off)
                held.pop(off, None)
            for d in got.deliveries:
                k = keys[d.offset]
                held[d.offset] = d.receipt
                if k is not None:
                    earlier = [o for o in range(d.offset) if keys[o] == k and o not in finished]
                    assert earlier == [], f"offset {d.offset} of key {k} out before {earlier} finished"
                    if d.attempts == 1:
                        assert d.offset > first_delivery.get(k, -1)
                        first_delivery[k] = d.offset
        elif held:
            off = sorted(held)[arg % len(held)]
            lease = q.leases.get(off)
            if lease is None or ss.receipt(off, lease) != held[off]:
                del held[off]
            elif kind == "ack":
                ss.ack(q, held.pop(off))
                finished.add(off)
            else:
                held[off] = ss.change_invisible(q, held[off], now, 0).receipt
        leased_keys = [le.key for le in q.leases.values() if le.key is not None]
        assert len(leased_keys) == len(set(leased_keys)), "two messages of one key out at once"
        assert set(q.leases) | q.finished | set(q.skipped) == set(range(q.floor, q.next))
        assert ss.encode(ss.decode(json.loads(ss.dumps(q)))) == ss.encode(q)
