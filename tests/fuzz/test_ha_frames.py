"""Fuzzing the HA frame decoder (ha/protocol.py): `decode_body`, the incremental `FrameDecoder`
and `read_frame` under a lying length prefix.

Contract: a frame either decodes to one of the frame classes, and then encodes back to exactly
the bytes it came from (the format has one encoding per frame), or raises HaProtocolError; a
decoder that raised stays broken; cutting the same bytes into other chunks yields the same
frames; the decoder never holds more than one frame's bytes; a length over the limit is refused
before its body is read.
"""

from __future__ import annotations

import asyncio
import hashlib

from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import FUZZ, Fuzzer, inputs, plain
from tidelog.clusterauth import NONCE_BYTES, PROOF_BYTES
from tidelog.errors import HaProtocolError
from tidelog.ha import protocol as p

u64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]))
text = st.text(max_size=40)


@st.composite
def _epochs(draw: st.DrawFn) -> tuple[tuple[int, int], ...]:
    n = draw(st.integers(0, 5))
    epochs = sorted(set(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n))))
    starts = sorted(draw(st.lists(st.integers(0, 2**64 - 1), min_size=len(epochs), max_size=len(epochs))))
    return tuple(zip(epochs, starts, strict=True))


frames = st.one_of(
    st.builds(p.Handshake, text, u64, u64, _epochs()),
    st.builds(p.HandshakeReply, u64, u64, u64, u64, _epochs()),
    st.builds(p.Transfer, u64, u64, u64, u64, st.binary(max_size=200)),
    st.builds(p.Ack, u64),
    st.builds(p.LedgerFenced, u64),
    st.builds(p.ErrorFrame, text, text),
    st.builds(p.AuthHello, text, u64, st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES)),
    st.builds(
        p.AuthChallenge,
        u64,
        u64,
        st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
        st.binary(min_size=PROOF_BYTES, max_size=PROOF_BYTES),
    ),
    st.builds(p.AuthProof, st.binary(min_size=PROOF_BYTES, max_size=PROOF_BYTES)),
    st.builds(p.RangeRequest, u64, st.integers(1, 2**32 - 1)),
    st.builds(p.RangeData, u64, st.binary(max_size=200)),
)
FRAME_TYPES = (
    p.Handshake,
    p.HandshakeReply,
    p.Transfer,
    p.Ack,
    p.LedgerFenced,
    p.ErrorFrame,
    p.AuthHello,
    p.AuthChallenge,
    p.AuthProof,
    p.RangeRequest,
    p.RangeData,
)

#: One frame's bytes, length prefix included.
one_frame = frames.map(p.encode)
#: Several frames back to back, as a socket delivers them.
stream = st.lists(one_frame, min_size=1, max_size=6).map(b"".join)


def check_body(data: bytes) -> None:
    """`decode_body` answers a frame that encodes back to `data`, or HaProtocolError."""
    try:
        frame = p.decode_body(data)
    except HaProtocolError as exc:
        assert exc.message
        return
    assert isinstance(frame, FRAME_TYPES)
    assert p.encode(frame) == p._LEN.pack(len(data)) + data, f"{frame!r} does not encode back"


def _chunks(data: bytes) -> list[bytes]:
    """`data` cut at places that depend only on its bytes (so a failure repeats)."""
    cuts = sorted({b % (len(data) + 1) for b in hashlib.blake2b(data, digest_size=8).digest()})
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _feed_all(decoder: p.FrameDecoder, parts: list[bytes]) -> tuple[list[p.Frame], bool]:
    got: list[p.Frame] = []
    for part in parts:
        try:
            got += decoder.feed(part)
        except HaProtocolError:
            return got, True
        assert decoder.buffered <= p.MAX_FRAME + p._LEN.size, "the decoder holds more than one frame"
    return got, False


def check_stream(data: bytes) -> None:
    """A `FrameDecoder` fed `data` whole or in chunks yields the same frames, each one valid, and
    once it has raised it raises on every later feed."""
    whole, whole_failed = _feed_all(p.FrameDecoder(), [data])
    decoder = p.FrameDecoder()
    chunked, chunked_failed = _feed_all(decoder, _chunks(data))
    # one feed that fails drops the frames it completed: the whole run answers none, the chunked
    # one those of its earlier chunks
    assert whole_failed == chunked_failed
    if whole_failed:
        assert whole == []
    else:
        assert chunked == whole
    for frame in chunked:
        assert isinstance(frame, FRAME_TYPES)
    if chunked_failed:
        try:
            decoder.feed(p.encode(p.Ack(1)))
        except HaProtocolError:
            pass
        else:
            raise AssertionError("a broken decoder decoded a frame")


FUZZERS = [
    Fuzzer("ha.decode_body", one_frame.map(lambda b: b[4:]), plain(check_body)),
    Fuzzer("ha.stream", stream, plain(check_stream)),
]


@FUZZ
@given(inputs(one_frame.map(lambda b: b[4:])))
def test_decode_body(data: bytes) -> None:
    check_body(data)


@FUZZ
@given(inputs(stream))
@example(b"\x00\x00\x00\x00")  # a zero length: no type byte
@example(b"\xff\xff\xff\xff\x03")  # a length over MAX_FRAME
def test_frame_stream(data: bytes) -> None:
    check_stream(data)


@FUZZ
@given(frames)
def test_every_frame_round_trips(frame: p.Frame) -> None:
    data = p.encode(frame)
    assert p.decode_body(data[4:]) == frame
    assert p.FrameDecoder().feed(data) == [frame]


async def _read(data: bytes, limit: int, eof: bool) -> p.Frame | BaseException:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    try:
        return await asyncio.wait_for(p.read_frame(reader, limit), 1.0)  # noqa: TID251 (a test bound, no cancellation race to lose)
    except (HaProtocolError, asyncio.IncompleteReadError, TimeoutError) as exc:
        return exc


@FUZZ
@given(st.integers(p.MAX_AUTH_FRAME + 1, 2**32 - 1), st.binary(max_size=64))
def test_a_lying_length_is_refused_before_its_body(length: int, rest: bytes) -> None:
    """A length over the limit raises at once, with only the prefix read: the claimed body is
    neither waited for nor allocated."""
    got = asyncio.run(_read(p._LEN.pack(length) + rest, p.MAX_AUTH_FRAME, eof=False))
    assert isinstance(got, HaProtocolError), got
    assert "exceeds the limit" in got.message


@FUZZ
@given(inputs(stream))
def test_read_frame_agrees_with_the_decoder(data: bytes) -> None:
    """`read_frame` (the master's and slave's reader) answers what `FrameDecoder` answers."""
    got = asyncio.run(_read(data, p.MAX_FRAME, eof=True))
    try:
        want = p.FrameDecoder().feed(data)
    except HaProtocolError:
        want = None
    if isinstance(got, HaProtocolError):
        assert want is None or want == [], (got, want)  # the first frame was the broken one
    elif isinstance(got, asyncio.IncompleteReadError):
        assert want == []  # EOF before a whole first frame
    else:
        assert not isinstance(got, BaseException), got
        if want is not None:
            assert want[0] == got
