"""The HA wire format: round trips, exact bytes, and that garbage only ever raises HaProtocolError."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.errors import FlushSlaveTimeoutError, HaProtocolError, NotMasterError, by_code
from tidelog.ha.protocol import (
    MAX_AUTH_FRAME,
    MAX_FRAME,
    MAX_RANGE_FRAME,
    MAX_STR,
    MAX_TRANSFER_DATA,
    Ack,
    AuthChallenge,
    AuthHello,
    AuthProof,
    ErrorFrame,
    FrameDecoder,
    FrameType,
    Handshake,
    HandshakeReply,
    LedgerFenced,
    RangeData,
    RangeRequest,
    Transfer,
    decode_body,
    encode,
    encode_transfer_header,
    error_frame,
    read_frame,
)
from tidelog.tasks import within
from tidelog.wire import ERROR_CODE_KEY, LEADER_KEY, make_error, trailing_metadata_for

U64 = st.integers(min_value=0, max_value=2**64 - 1)
OFFSET = st.one_of(st.integers(min_value=0, max_value=1 << 40), U64)


@st.composite
def epoch_lists(draw) -> tuple[tuple[int, int], ...]:
    """Ascending epochs with non-decreasing starts (the epoch file's rule)."""
    n = draw(st.integers(min_value=0, max_value=6))
    epochs = sorted(draw(st.sets(st.integers(min_value=0, max_value=2**64 - 1), min_size=n, max_size=n)))
    starts = sorted(draw(st.lists(OFFSET, min_size=n, max_size=n)))
    return tuple(zip(epochs, starts, strict=True))


TEXT = st.text(max_size=40)
FRAMES = st.one_of(
    st.builds(Handshake, TEXT, U64, OFFSET, epoch_lists()),
    st.builds(HandshakeReply, U64, U64, OFFSET, OFFSET, epoch_lists()),
    st.builds(Transfer, OFFSET, U64, OFFSET, OFFSET, st.binary(max_size=300)),
    st.builds(Ack, OFFSET),
    st.builds(LedgerFenced, U64),
    st.builds(ErrorFrame, TEXT, st.text(max_size=200)),
    st.builds(AuthHello, TEXT, U64, st.binary(min_size=16, max_size=16)),
    st.builds(
        AuthChallenge, U64, U64, st.binary(min_size=16, max_size=16), st.binary(min_size=32, max_size=32)
    ),
    st.builds(AuthProof, st.binary(min_size=32, max_size=32)),
    st.builds(RangeRequest, OFFSET, st.integers(1, 2**32 - 1)),
    st.builds(RangeData, OFFSET, st.binary(max_size=300)),
)


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


@given(frames=st.lists(FRAMES, max_size=8), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_round_trip_through_decoder_in_random_pieces(frames, cuts):
    stream = b"".join(encode(f) for f in frames)
    dec = FrameDecoder()
    out = []
    for piece in _pieces(stream, cuts):
        out.extend(dec.feed(piece))
    assert out == frames
    assert dec.buffered == 0


@given(frame=FRAMES)
def test_decode_body_inverts_encode(frame):
    raw = encode(frame)
    (length,) = struct.unpack(">I", raw[:4])
    assert length == len(raw) - 4
    assert decode_body(raw[4:]) == frame


@given(offset=OFFSET, epoch=U64, start=OFFSET, confirm=OFFSET, data=st.binary(max_size=500))
def test_transfer_header_plus_data_is_the_encoded_transfer(offset, epoch, start, confirm, data):
    header = encode_transfer_header(offset, epoch, start, confirm, len(data))
    assert header + data == encode(Transfer(offset, epoch, start, confirm, data))


def test_exact_bytes_of_each_frame_type():
    # pinned bytes: a change of the wire format must be deliberate (both sides upgrade together)
    assert encode(Ack(0x0102)) == bytes.fromhex("00000009040000000000000102")
    assert encode(Transfer(1, 2, 3, 4, b"ab")) == bytes.fromhex(
        "000000230300000000000000010000000000000002000000000000000300000000000000046162"
    )
    assert encode(Handshake("b", 7, 9, ((1, 0),))) == bytes.fromhex(
        "0000002801000162000000000000000700000000000000090000000100000000000000010000000000000000"
    )
    assert encode(HandshakeReply(1, 2, 3, 4, ())) == bytes.fromhex(
        "0000002502000000000000000100000000000000020000000000000003000000000000000400000000"
    )
    assert encode(ErrorFrame("E", "é")) == bytes.fromhex("00000008050001450002c3a9")


def test_heartbeat_is_a_transfer_without_data():
    assert FrameDecoder().feed(encode(Transfer(10, 1, 0, 5, b""))) == [Transfer(10, 1, 0, 5, b"")]


def _frame(ftype: int, payload: bytes) -> bytes:
    return struct.pack(">IB", 1 + len(payload), ftype) + payload


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("unknown type", _frame(9, b"")),
        ("type zero", _frame(0, b"")),
        ("length zero", struct.pack(">I", 0)),
        ("length over MAX_FRAME", struct.pack(">I", MAX_FRAME + 1)),
        ("ack too short", _frame(FrameType.ACK, b"\x00" * 7)),
        ("ack too long", _frame(FrameType.ACK, b"\x00" * 9)),
        ("ledger fence too short", _frame(FrameType.LEDGER_FENCED, b"\x00" * 7)),
        ("transfer header cut", _frame(FrameType.TRANSFER, b"\x00" * 31)),
        ("string longer than frame", _frame(FrameType.ERROR, b"\x00\x05ab")),
        ("invalid utf-8", _frame(FrameType.ERROR, b"\x00\x02\xff\xfe\x00\x00")),
        ("error frame trailing bytes", _frame(FrameType.ERROR, b"\x00\x00\x00\x00\x00")),
        ("absurd epoch count", _frame(FrameType.HANDSHAKE_REPLY, b"\x00" * 32 + b"\xff\xff\xff\xff")),
        (
            "epoch count too small",
            _frame(FrameType.HANDSHAKE_REPLY, b"\x00" * 32 + struct.pack(">IQQQQ", 1, 1, 0, 2, 0)),
        ),
        (
            "epochs out of order",
            _frame(FrameType.HANDSHAKE_REPLY, b"\x00" * 32 + struct.pack(">IQQQQ", 2, 2, 0, 1, 5)),
        ),
        (
            "epoch repeated",
            _frame(FrameType.HANDSHAKE_REPLY, b"\x00" * 32 + struct.pack(">IQQQQ", 2, 3, 0, 3, 5)),
        ),
        (
            "epoch starts go back",
            _frame(FrameType.HANDSHAKE_REPLY, b"\x00" * 32 + struct.pack(">IQQQQ", 2, 1, 9, 2, 5)),
        ),
    ],
)
def test_malformed_frames_raise_ha_protocol_error(name, raw):
    dec = FrameDecoder()
    with pytest.raises(HaProtocolError):
        dec.feed(raw)
    # the stream's framing is lost: the decoder stays broken even for valid bytes
    with pytest.raises(HaProtocolError):
        dec.feed(encode(Ack(1)))


def test_length_is_checked_before_the_body_arrives():
    # a hostile length must be refused from the prefix alone, not after buffering 4 GiB
    with pytest.raises(HaProtocolError):
        FrameDecoder().feed(struct.pack(">I", 0xFFFFFFFF))


def test_largest_transfer_fits_and_one_more_byte_does_not():
    header = encode_transfer_header(0, 1, 0, 0, MAX_TRANSFER_DATA)
    assert struct.unpack(">I", header[:4])[0] == MAX_FRAME
    with pytest.raises(HaProtocolError):
        encode_transfer_header(0, 1, 0, 0, MAX_TRANSFER_DATA + 1)


@pytest.mark.parametrize(
    "frame",
    [
        Ack(-1),
        Ack(2**64),
        Transfer(-5, 1, 0, 0, b""),
        Handshake("x" * (MAX_STR + 1), 1, 0, ()),
        Handshake("b", 1, 0, ((2, 0), (1, 5))),
        ErrorFrame("\ud800", ""),
    ],
)
def test_encoding_refuses_what_the_wire_cannot_carry(frame):
    with pytest.raises(HaProtocolError):
        encode(frame)


def test_error_frame_helper_cuts_long_messages_at_a_character_boundary():
    frame = error_frame("HA_PROTOCOL", "é" * MAX_STR)
    assert len(frame.message.encode()) <= MAX_STR
    assert set(frame.message) == {"é"}
    assert FrameDecoder().feed(encode(frame)) == [frame]


@st.composite
def mutated_streams(draw) -> bytes:
    raw = bytearray(b"".join(encode(f) for f in draw(st.lists(FRAMES, min_size=1, max_size=3))))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(min_value=0, max_value=max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[pos] = draw(st.integers(min_value=0, max_value=255))
        elif op == "insert":
            raw[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and raw:
            del raw[pos : pos + draw(st.integers(min_value=1, max_value=8))]
        elif op == "truncate":
            del raw[pos:]
    return bytes(raw)


def _feed_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    dec = FrameDecoder()
    for piece in _pieces(data, cuts):
        try:
            dec.feed(piece)
        except HaProtocolError:
            return


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=5))
def test_random_bytes_raise_nothing_but_ha_protocol_error(data, cuts):
    _feed_only_protocol_errors(data, cuts)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated_streams(), cuts=st.lists(st.integers(min_value=0), max_size=5))
def test_mutated_valid_frames_raise_nothing_but_ha_protocol_error(data, cuts):
    _feed_only_protocol_errors(data, cuts)


@settings(max_examples=400)
@given(ftype=st.sampled_from(list(FrameType)), body=st.binary(max_size=120))
def test_random_bodies_of_every_type_raise_nothing_but_ha_protocol_error(ftype, body):
    # random bytes rarely form a plausible length; this puts garbage behind a valid header
    with contextlib.suppress(HaProtocolError):
        FrameDecoder().feed(_frame(ftype, body))


def _reader_with(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    """A StreamReader already holding `data`; call it inside a running loop (Python 3.11 binds one)."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


@given(frames=st.lists(FRAMES, min_size=1, max_size=5))
def test_read_frame_reads_one_frame_at_a_time(frames):
    async def run() -> list:
        reader = _reader_with(b"".join(encode(f) for f in frames))
        out = [await read_frame(reader) for _ in frames]
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(reader)
        return out

    assert asyncio.run(run()) == frames


def test_read_frame_waits_for_bytes_that_arrive_later():
    async def run() -> object:
        reader = asyncio.StreamReader()
        raw = encode(Transfer(0, 1, 0, 0, b"x" * 1000))
        task = asyncio.ensure_future(read_frame(reader))
        for i in range(0, len(raw), 100):
            reader.feed_data(raw[i : i + 100])
            await asyncio.sleep(0)
            assert not task.done() or i + 100 >= len(raw)
        return await task

    assert asyncio.run(run()) == Transfer(0, 1, 0, 0, b"x" * 1000)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (encode(Ack(5))[:6], asyncio.IncompleteReadError),  # EOF inside a frame
        (b"", asyncio.IncompleteReadError),  # EOF between frames
        (_frame(9, b""), HaProtocolError),
        (struct.pack(">I", MAX_FRAME + 1), HaProtocolError),
        (_frame(FrameType.ERROR, b"\x00\x01\xff\x00\x00"), HaProtocolError),
    ],
)
def test_read_frame_errors(raw, error):
    async def run() -> None:
        await read_frame(_reader_with(raw))

    with pytest.raises(error):
        asyncio.run(run())


# --- the replication errors (tidelog/errors.py) --------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        ("HA_PROTOCOL", "INTERNAL", False),
        ("NOT_MASTER", "FAILED_PRECONDITION", False),
        ("IN_SYNC_REPLICAS_NOT_ENOUGH", "UNAVAILABLE", True),  # nothing was written
        ("FLUSH_SLAVE_TIMEOUT", "DEADLINE_EXCEEDED", False),  # stored on the master: a retry may duplicate
        ("SLAVE_NOT_AVAILABLE", "UNAVAILABLE", False),
        ("FLUSH_DISK_TIMEOUT", "DEADLINE_EXCEEDED", False),
    ],
)
def test_replication_error_codes(code, status, retryable):
    cls = by_code(code)
    assert cls.code == code and cls.status == status and cls.retryable is retryable
    assert cls.__doc__ and cls.hint


def test_flush_slave_timeout_says_the_message_is_stored():
    hint = FlushSlaveTimeoutError.hint.lower()
    assert "stored on the master" in hint and "unknown" in hint and ("duplicate" in hint or "twice" in hint)


def test_not_master_carries_the_master_address_across_the_wire():
    err = NotMasterError(master_address="10.0.0.7:10911")
    assert err.master_address == err.details["master_address"] == "10.0.0.7:10911"
    # the server sends it as the error's redirect; the client rebuilds the same class with it
    md = dict(trailing_metadata_for(err))
    rebuilt = make_error(md[ERROR_CODE_KEY], "not the master", leader=md[LEADER_KEY])
    assert isinstance(rebuilt, NotMasterError)
    assert rebuilt.master_address == "10.0.0.7:10911"
    assert NotMasterError().master_address == "" and NotMasterError().leader is None


@pytest.mark.parametrize(
    "bad",
    [
        lambda: AuthHello("bs", 1, b"short"),
        lambda: AuthChallenge(1, 1, b"\0" * 16, b"\0" * 31),
        lambda: AuthProof(b"\0" * 33),
    ],
)
def test_auth_frames_refuse_wrong_sizes(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(HaProtocolError):
        encode(bad())


def test_read_frame_refuses_a_length_over_its_limit_before_reading_the_body() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">IB", MAX_AUTH_FRAME + 1, FrameType.AUTH_HELLO))  # no body follows
        with pytest.raises(HaProtocolError, match="exceeds the limit"):
            await within(read_frame(reader, MAX_AUTH_FRAME), 1.0)

    asyncio.run(main())


def test_read_frame_asks_a_callable_limit_once_the_length_has_arrived() -> None:
    """A master reads a slave's frames with a small limit, larger while a range's copy is asked of
    it: the request may go out while the read already waits, so the limit is asked late."""

    async def main() -> None:
        frame = encode(RangeData(4096, b"r" * (MAX_AUTH_FRAME + 10)))
        limit = [MAX_AUTH_FRAME]
        reader = asyncio.StreamReader()
        waiting = asyncio.ensure_future(read_frame(reader, lambda: limit[0]))
        await asyncio.sleep(0)  # the read waits for its first byte under the small limit
        limit[0] = MAX_RANGE_FRAME
        reader.feed_data(frame)
        assert await within(waiting, 1.0) == RangeData(4096, b"r" * (MAX_AUTH_FRAME + 10))
        reader.feed_data(frame)
        limit[0] = MAX_AUTH_FRAME
        with pytest.raises(HaProtocolError, match="exceeds the limit"):
            await within(read_frame(reader, lambda: limit[0]), 1.0)

    asyncio.run(main())
