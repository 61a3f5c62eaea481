"""The data port's frames (tidelog/dataport_frames.py): every field round-trips, and a frame that breaks
the layout is a FrameError (its connection is closed), never another exception."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import dataport_frames as df
from tidelog.errors import InvalidArgumentError, NotMasterError

topics = st.text(min_size=1, max_size=40)
u32 = st.integers(0, 2**32 - 1)
u63 = st.integers(0, 2**63 - 1)


def _body(parts: list[bytes]) -> bytes:
    """A frame's body, as the reader gets it after the head."""
    whole = b"".join(parts)
    length, _, _ = df.HEAD.unpack_from(whole)
    assert df.body_length(length) == len(whole) - df.HEAD_SIZE
    return whole[df.HEAD_SIZE :]


@settings(max_examples=100, deadline=None)
@given(topics, u32, u32, u32, st.binary(max_size=200))
def test_produce_round_trips(topic, queue, count, crc, records):
    body = _body(df.frame(df.OP_PRODUCE, 7, df.produce_request(topic, queue, count, crc), records))
    call = df.parse_produce(body)
    assert (call.topic, call.queue, call.count, call.crc, bytes(call.records)) == (
        topic,
        queue,
        count,
        crc,
        records,
    )


@settings(max_examples=100, deadline=None)
@given(topics, u63, st.lists(u63, max_size=50))
def test_produce_reply_round_trips(broker_set, first, phys):
    assert df.parse_produced(df.produced(broker_set, first, phys)) == (broker_set, first, tuple(phys))


@settings(max_examples=100, deadline=None)
@given(topics, u32, u63, u32, u32, u32, u63, u63, u63, u32, st.binary(max_size=100), u32)
def test_pull_and_its_reply_round_trip(
    topic, queue, offset, n, size, wait, low, high, confirmed, count, records, crc
):
    call = df.PullCall(topic, queue, offset, n, size, wait)
    assert df.parse_pull(df.pull_request(call)) == call
    offsets = df.Offsets(low, high, confirmed)
    got = df.parse_pulled(df.pulled_head(offset, offsets, count, crc) + records)
    assert got == df.Pulled(offset, offsets, count, records, crc)


i64 = st.integers(-(2**63), 2**63 - 1)
ledger_entries = st.lists(
    st.builds(df.LedgerEntry, i64, i64, i64, st.binary(max_size=20), st.binary(max_size=300)),
    min_size=1,
    max_size=20,
)


@settings(max_examples=100, deadline=None)
@given(u63, st.binary(max_size=40), ledger_entries)
def test_a_ledger_add_round_trips(ledger_id, password, entries):
    body = _body(df.frame(df.OP_LEDGER_ADD, 3, *df.ledger_add_request(ledger_id, password, entries)))
    assert df.parse_ledger_add(body) == df.LedgerAddCall(ledger_id, password, entries)


@settings(max_examples=100, deadline=None)
@given(i64, i64, u32, st.lists(u32, max_size=10))
def test_a_ledger_add_reply_round_trips(first, last, broker_id, replicas):
    assert df.parse_ledger_added(df.ledger_added(first, last, broker_id, replicas)) == (
        first,
        last,
        broker_id,
        tuple(replicas),
    )


@settings(max_examples=100, deadline=None)
@given(u63, st.binary(max_size=10), ledger_entries, st.data())
def test_a_ledger_add_cut_short_or_padded_is_a_frame_error(ledger_id, password, entries, data):
    body = b"".join(df.ledger_add_request(ledger_id, password, entries))
    cut = data.draw(st.integers(0, len(body) - 1))
    for broken in (body[:cut], body + b"\x00"):
        with pytest.raises(df.FrameError):
            df.parse_ledger_add(broken)


def test_a_ledger_add_carries_at_least_one_and_at_most_max_entries():
    one = df.LedgerEntry(0, -1, 1, b"", b"x")
    with pytest.raises(df.FrameError, match="entries"):
        df.parse_ledger_add(b"".join(df.ledger_add_request(1, b"", [])))
    too_many = [one._replace(entry_id=i) for i in range(df.MAX_LEDGER_ENTRIES + 1)]
    with pytest.raises(df.FrameError, match="entries"):
        df.parse_ledger_add(b"".join(df.ledger_add_request(1, b"", too_many)))


ledger_groups = st.lists(st.tuples(u63, st.binary(max_size=10), ledger_entries), min_size=1, max_size=6)


@settings(max_examples=100, deadline=None)
@given(ledger_groups)
def test_several_ledgers_adds_round_trip_in_one_frame(groups):
    parts = df.ledger_adds_request([df.ledger_add_request(*g) for g in groups])
    body = _body(df.frame(df.OP_LEDGER_ADDS, 7, *parts))
    assert df.parse_ledger_adds(body) == [df.LedgerAddCall(*g) for g in groups]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([df.OK, df.ERROR]), st.binary(max_size=40)), min_size=1, max_size=8)
)
def test_a_ledger_adds_reply_round_trips_and_must_answer_every_group(outcomes):
    body = b"".join(df.ledger_adds_reply(outcomes))
    assert df.parse_ledger_adds_reply(body, len(outcomes)) == outcomes
    with pytest.raises(df.FrameError):
        df.parse_ledger_adds_reply(body, len(outcomes) + 1)


@settings(max_examples=100, deadline=None)
@given(ledger_groups, st.data())
def test_several_ledgers_adds_cut_short_or_padded_are_a_frame_error(groups, data):
    body = b"".join(df.ledger_adds_request([df.ledger_add_request(*g) for g in groups]))
    cut = data.draw(st.integers(0, len(body) - 1))
    for broken in (body[:cut], body + b"\x00"):
        with pytest.raises(df.FrameError):
            df.parse_ledger_adds(broken)


def test_a_ledger_adds_frame_carries_at_least_one_and_at_most_max_groups():
    one = df.ledger_add_request(1, b"", [df.LedgerEntry(0, -1, 1, b"", b"x")])
    with pytest.raises(df.FrameError, match="ledgers"):
        df.parse_ledger_adds(b"".join(df.ledger_adds_request([])))
    with pytest.raises(df.FrameError, match="ledgers"):
        df.parse_ledger_adds(b"".join(df.ledger_adds_request([one] * (df.MAX_LEDGER_GROUPS + 1))))


commits = st.lists(
    st.tuples(
        st.text(max_size=30),
        st.text(max_size=30),
        st.integers(-(2**31), 2**31 - 1),
        st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=20,
)


@settings(max_examples=100, deadline=None)
@given(commits)
def test_group_commits_round_trip_in_one_frame(commits):
    body = _body(df.frame(df.OP_COMMITS, 3, df.commits_request(commits)))
    assert [tuple(c) for c in df.parse_commits(body).commits] == commits


@settings(max_examples=100, deadline=None)
@given(commits.filter(bool), st.data())
def test_group_commits_cut_short_or_padded_are_a_frame_error(commits, data):
    body = df.commits_request(commits)
    cut = data.draw(st.integers(0, len(body) - 1))
    for broken in (body[:cut], body + b"\x00"):
        with pytest.raises(df.FrameError):
            df.parse_commits(broken)


def test_a_commits_frame_carries_at_most_max_commits_and_names_are_utf8():
    too_many = [("g", "t", 0, 1)] * (df.MAX_COMMITS + 1)
    with pytest.raises(df.FrameError, match="commits"):
        df.parse_commits(df.commits_request(too_many))
    assert df.parse_commits(df.commits_request([])).commits == []  # none: the service answers it
    body = bytearray(df.commits_request([("gg", "t", 0, 1)]))
    body[-3] = 0xFF  # the group's first byte
    with pytest.raises(df.FrameError, match="UTF-8"):
        df.parse_commits(bytes(body))
    with pytest.raises(InvalidArgumentError, match="no frame can carry"):
        df.commits_request([("g" * 70_000, "t", 0, 1)])


def test_an_error_carries_its_code_and_the_masters_address():
    err = NotMasterError("not here", master_address="10.0.0.1:10911")
    assert df.parse_error(df.error_body(err, err.leader)) == ("NOT_MASTER", "10.0.0.1:10911", "not here")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_any_bytes_parse_or_raise_frame_error(blob):
    parsers = (df.parse_produce, df.parse_pull, df.parse_pulled, df.parse_error, df.parse_produced)
    for parse in (
        *parsers,
        df.parse_ledger_add,
        df.parse_ledger_added,
        df.parse_ledger_adds,
        df.parse_commits,
    ):
        try:
            parse(blob)
        except df.FrameError:
            pass
        except (struct.error, UnicodeDecodeError, ValueError):
            pytest.fail(f"{parse.__name__} raised struct.error on {blob!r}")


@pytest.mark.parametrize("length", [0, 4, df.MAX_FRAME + 1, 2**32 - 1])
def test_a_lying_length_prefix_is_refused_before_the_body_is_read(length):
    with pytest.raises(df.FrameError):
        df.body_length(length)


def test_auth_frames_round_trip_and_bound_their_entries() -> None:
    md = (("authorization", "MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time, Signature=00"),)
    md += (("X-MQ-Date-Time", "20261126T171138Z"),)
    assert df.parse_auth(df.auth_request(md)) == {
        "authorization": md[0][1],
        "x-mq-date-time": "20261126T171138Z",  # names lower-cased, as gRPC metadata's are
    }
    with pytest.raises(df.FrameError):
        df.parse_auth(df.auth_request(tuple((f"k{i}", "v") for i in range(df.MAX_AUTH_ENTRIES + 1))))
    with pytest.raises(df.FrameError):
        df.parse_auth(df.auth_request((("k", "v" * (df.MAX_AUTH_TEXT + 1)),)))
    with pytest.raises(df.FrameError):
        df.parse_auth(df.auth_request(md) + b"x")
