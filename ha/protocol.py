"""The HA wire format: length-prefixed frames between a master and its slaves over raw TCP.

Theory of operation
-------------------
Every frame is ``u32 length | u8 type | payload``; `length` counts everything after itself
(type byte included), integers are big-endian. The frame types:

=================  ===============  ============================================================
type               direction        payload
=================  ===============  ============================================================
AUTH_HELLO (7)     slave -> master  str broker_set | u64 broker_id | bytes16 slave_nonce
AUTH_CHALLENGE 8   master -> slave  u64 master_id | u64 master_epoch | bytes16 master_nonce |
                                    bytes32 master_proof
AUTH_PROOF (9)     slave -> master  bytes32 slave_proof
HANDSHAKE (1)      slave -> master  str broker_set | u64 broker_id | u64 max_offset | epochs
HANDSHAKE_REPLY 2  master -> slave  u64 master_id | u64 master_epoch | u64 max_offset |
                                    u64 min_offset | epochs
TRANSFER (3)       master -> slave  u64 offset | u64 epoch | u64 epoch_start | u64 confirm_offset |
                                    raw commit-log bytes up to the end of the frame (none = heartbeat)
ACK (4)            slave -> master  u64 max_offset
LEDGER_FENCED (6)  slave -> master  u64 ledger_id
RANGE_REQUEST 10   either           u64 offset | u32 length   (bytes the sender found damaged)
RANGE_DATA (11)    either           u64 offset | the sender's bytes of that range (none: no copy)
ERROR (5)          either           str code | str message
=================  ===============  ============================================================

A connection opens with the mutual proof of the cluster secret (`tidelog.clusterauth`): the
slave names itself and sends a fresh nonce; the master answers with its own nonce and an HMAC
over both nonces, the broker set, both ids and its epoch; the slave checks it (a stranger
pretending to be the master is refused before the slave's log is touched) and answers with its
own HMAC over the same fields under another purpose. Only then does the slave send its
HANDSHAKE, and only after checking the slave's proof does the master read it and send anything
of its log. Frames read before the proofs are checked may be at most `MAX_AUTH_FRAME` bytes.

``str`` is a u16 byte count and that many bytes of UTF-8; ``epochs`` is a u32 count and that
many ``(u64 epoch, u64 start offset)`` pairs, epochs strictly ascending and starts never going
backwards (the epoch file's own rule, so a list that breaks it cannot come from a sane peer).

Compared with RocketMQ (docs/reference/rocketmq-controller-ha.md §3.4) the frames carry an explicit type and length, so a
reader never has to know the peer's state to parse a frame, and the slave names its broker set
so a master can refuse a slave of another set before it streams anything.

This module does no I/O of its own except `read_frame`, and it has exactly one error:
`HaProtocolError`. Every violation (unknown type, a length over `MAX_FRAME` or under 1, a payload
shorter or longer than its fields, a count the frame cannot hold, bad UTF-8, an epoch list out of
order) raises it, and nothing else may escape a decoder: the caller closes the connection and
the process goes on. A `FrameDecoder` that has raised stays broken (like h11's ERROR state):
the byte stream has lost its framing, so every later `feed` raises again.

Encoding validates too (offsets and epochs must fit a u64, strings their u16 length, a frame
`MAX_FRAME`), with the same error, so a bug on our side fails here instead of at the peer.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.clusterauth import NONCE_BYTES, PROOF_BYTES
from tidelog.errors import HaProtocolError
from tidelog.tasks import within

__all__ = [
    "HEADER_TIMEOUT_S",
    "MAX_AUTH_FRAME",
    "MAX_FRAME",
    "MAX_RANGE_FRAME",
    "MAX_REPAIR_BYTES",
    "Ack",
    "AuthChallenge",
    "AuthHello",
    "AuthProof",
    "ErrorFrame",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "Handshake",
    "HandshakeReply",
    "LedgerFenced",
    "RangeData",
    "RangeRequest",
    "Transfer",
    "decode_body",
    "encode",
    "encode_transfer_header",
    "error_frame",
    "read_frame",
]

# A transfer batch is far smaller (32 KiB by default); 64 MiB leaves room for a larger batch
# setting, and the extra KiB for headers. A bigger length is a broken or hostile stream, and
# refusing it before reading bounds what one connection can make us buffer.
MAX_FRAME = 64 * 1024 * 1024 + 1024

# Every frame a peer may send before it has proven the cluster secret (and every frame a slave
# sends unasked) fits in this; a longer length is refused before its body is read.
MAX_AUTH_FRAME = 64 * 1024
#: The largest range one replica may ask another to send again (one record at most: a record
#: never exceeds max_message_bytes, whose default is 4 MiB).
MAX_REPAIR_BYTES = 16 << 20
#: A RANGE_DATA frame of MAX_REPAIR_BYTES: what a master reads from a slave it asked for a range.
MAX_RANGE_FRAME = MAX_REPAIR_BYTES + 64
#: A frame's length prefix, once its first byte arrived, must be whole within this long.
HEADER_TIMEOUT_S = 5.0

MAX_STR = 0xFFFF
_U64_MAX = 2**64 - 1

_LEN = struct.Struct(">I")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_U64_PAIR = _PAIR
_HANDSHAKE_FIXED = struct.Struct(">QQ")  # broker_id, max_offset (after the broker set)
_REPLY_FIXED = struct.Struct(">QQQQ")  # master_id, master_epoch, max_offset, min_offset
_TRANSFER_FIXED = struct.Struct(">QQQQ")  # offset, epoch, epoch_start, confirm_offset
_TRANSFER_HEADER = struct.Struct(">IBQQQQ")  # length, type, then the fixed fields

TRANSFER_HEADER_SIZE = _TRANSFER_HEADER.size
MAX_TRANSFER_DATA = MAX_FRAME - 1 - _TRANSFER_FIXED.size


class FrameType(enum.IntEnum):
    HANDSHAKE = 1
    HANDSHAKE_REPLY = 2
    TRANSFER = 3
    ACK = 4
    ERROR = 5
    LEDGER_FENCED = 6
    AUTH_HELLO = 7
    AUTH_CHALLENGE = 8
    AUTH_PROOF = 9
    RANGE_REQUEST = 10
    RANGE_DATA = 11


Epochs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Handshake:
    """Slave -> master, first frame of a connection: who I am and what my log holds."""

    broker_set: str
    broker_id: int
    max_offset: int
    epochs: Epochs  # (epoch, start offset), ascending


@dataclass(frozen=True, slots=True)
class HandshakeReply:
    """Master -> slave: the master's epoch map, so the slave can find the last consistent point."""

    master_id: int
    master_epoch: int
    max_offset: int
    min_offset: int
    epochs: Epochs


@dataclass(frozen=True, slots=True)
class Transfer:
    """Master -> slave: commit-log bytes starting at `offset`, written in `epoch`; empty = heartbeat."""

    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    """Slave -> master: my log now ends at `max_offset`."""

    max_offset: int


@dataclass(frozen=True, slots=True)
class LedgerFenced:
    """Slave -> master: this replica has fenced ledger `ledger_id` (sent before any later ack).

    Records of the ledger that reach the slave after its fence are not entries there, so the
    master must stop counting the slave's acks for that ledger's pending adds: it fences the
    ledger itself on receipt. A slave repeats every fence it holds before its first ack of a
    connection, so a new master learns them too."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class AuthHello:
    """Slave -> master, first frame: who I claim to be, and my challenge for the master."""

    broker_set: str
    broker_id: int
    nonce: bytes  # NONCE_BYTES


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """Master -> slave: my proof of the secret over both nonces, and my challenge for the slave."""

    master_id: int
    master_epoch: int
    nonce: bytes  # NONCE_BYTES
    proof: bytes  # PROOF_BYTES


@dataclass(frozen=True, slots=True)
class AuthProof:
    """Slave -> master: my proof of the secret over both nonces."""

    proof: bytes  # PROOF_BYTES


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Send me your bytes [offset, offset + length); mine are damaged there. A slave asks its
    master; a master asks a slave whose acks cover the range (the master is the only copy
    elected, and damaged)."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class RangeData:
    """The bytes of a requested range (whole records the sender holds in common with the asker);
    empty from a slave that cannot send them."""

    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """Either side, just before closing: why (an errors.py code and a human message)."""

    code: str
    message: str


Frame = (
    Handshake
    | HandshakeReply
    | Transfer
    | Ack
    | LedgerFenced
    | ErrorFrame
    | AuthHello
    | AuthChallenge
    | AuthProof
    | RangeRequest
    | RangeData
)


# --- encoding -----------------------------------------------------------------------------


def _u64(value: int, what: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise HaProtocolError(f"cannot encode {what}={value!r}: not an unsigned 64-bit integer")
    return _U64.pack(value)


def _str(value: str, what: str) -> bytes:
    try:
        raw = value.encode("utf-8")
    except (UnicodeEncodeError, AttributeError) as exc:
        raise HaProtocolError(f"cannot encode {what}: {exc}") from exc
    if len(raw) > MAX_STR:
        raise HaProtocolError(f"cannot encode {what}: {len(raw)} bytes of UTF-8, at most {MAX_STR} fit")
    return _U16.pack(len(raw)) + raw


def _fixed(value: bytes, size: int, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != size:
        raise HaProtocolError(f"cannot encode {what}: need exactly {size} bytes")
    return bytes(value)


def _epochs(epochs: Epochs) -> bytes:
    _check_epoch_order(epochs)
    parts = [_U32.pack(len(epochs))]
    for epoch, start in epochs:
        parts.append(_u64(epoch, "epoch") + _u64(start, "epoch start"))
    return b"".join(parts)


def _check_epoch_order(epochs: Epochs) -> None:
    for (e1, s1), (e2, s2) in zip(epochs, epochs[1:], strict=False):
        if e2 <= e1 or s2 < s1:
            raise HaProtocolError(f"epoch list out of order: ({e1}, {s1}) then ({e2}, {s2})")


def _frame(ftype: FrameType, payload: bytes) -> bytes:
    length = 1 + len(payload)
    if length > MAX_FRAME:
        raise HaProtocolError(f"frame of {length} bytes exceeds MAX_FRAME={MAX_FRAME}")
    return _LEN.pack(length) + _U8.pack(ftype) + payload


def _encode_range_request(frame: RangeRequest) -> bytes:
    if not isinstance(frame.length, int) or not 0 < frame.length <= 0xFFFFFFFF:
        raise HaProtocolError(f"cannot encode a range of {frame.length!r} bytes")
    return _frame(FrameType.RANGE_REQUEST, _u64(frame.offset, "offset") + _U32.pack(frame.length))


# One encoder per frame type (the payload layouts in the module docstring).
_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    Transfer: lambda f: (
        encode_transfer_header(f.offset, f.epoch, f.epoch_start, f.confirm_offset, len(f.data))
        + bytes(f.data)
    ),
    Ack: lambda f: _frame(FrameType.ACK, _u64(f.max_offset, "max_offset")),
    LedgerFenced: lambda f: _frame(FrameType.LEDGER_FENCED, _u64(f.ledger_id, "ledger_id")),
    Handshake: lambda f: _frame(
        FrameType.HANDSHAKE,
        _str(f.broker_set, "broker_set")
        + _u64(f.broker_id, "broker_id")
        + _u64(f.max_offset, "max_offset")
        + _epochs(f.epochs),
    ),
    HandshakeReply: lambda f: _frame(
        FrameType.HANDSHAKE_REPLY,
        _u64(f.master_id, "master_id")
        + _u64(f.master_epoch, "master_epoch")
        + _u64(f.max_offset, "max_offset")
        + _u64(f.min_offset, "min_offset")
        + _epochs(f.epochs),
    ),
    ErrorFrame: lambda f: _frame(FrameType.ERROR, _str(f.code, "code") + _str(f.message, "message")),
    AuthHello: lambda f: _frame(
        FrameType.AUTH_HELLO,
        _str(f.broker_set, "broker_set")
        + _u64(f.broker_id, "broker_id")
        + _fixed(f.nonce, NONCE_BYTES, "nonce"),
    ),
    AuthChallenge: lambda f: _frame(
        FrameType.AUTH_CHALLENGE,
        _u64(f.master_id, "master_id")
        + _u64(f.master_epoch, "master_epoch")
        + _fixed(f.nonce, NONCE_BYTES, "nonce")
        + _fixed(f.proof, PROOF_BYTES, "proof"),
    ),
    AuthProof: lambda f: _frame(FrameType.AUTH_PROOF, _fixed(f.proof, PROOF_BYTES, "proof")),
    RangeRequest: _encode_range_request,
    RangeData: lambda f: _frame(FrameType.RANGE_DATA, _u64(f.offset, "offset") + bytes(f.data)),
}


def encode(frame: Frame) -> bytes:
    """The bytes of one frame, length prefix included."""
    encoder = _ENCODERS.get(type(frame))
    if encoder is None:
        raise HaProtocolError(f"cannot encode {type(frame).__name__}: not an HA frame")
    return encoder(frame)


def encode_transfer_header(
    offset: int, epoch: int, epoch_start: int, confirm_offset: int, data_len: int
) -> bytes:
    """The frame bytes before a transfer's data, so a large batch is written without copying it.

    ``encode_transfer_header(o, e, s, c, len(data)) + data == encode(Transfer(o, e, s, c, data))``.
    """
    if not isinstance(data_len, int) or not 0 <= data_len <= MAX_TRANSFER_DATA:
        raise HaProtocolError(f"transfer of {data_len!r} bytes: at most {MAX_TRANSFER_DATA} fit in a frame")
    fields = (
        _u64(offset, "offset"),
        _u64(epoch, "epoch"),
        _u64(epoch_start, "epoch_start"),
        _u64(confirm_offset, "confirm_offset"),
    )
    return _LEN.pack(1 + _TRANSFER_FIXED.size + data_len) + _U8.pack(FrameType.TRANSFER) + b"".join(fields)


def error_frame(code: str, message: str) -> ErrorFrame:
    """An ErrorFrame whose strings are cut (at a character boundary) to what the wire can carry."""
    return ErrorFrame(_fit(code), _fit(message))


def _fit(text: str) -> str:
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= MAX_STR:
        return raw.decode("utf-8")
    return raw[:MAX_STR].decode("utf-8", errors="ignore")


# --- decoding -----------------------------------------------------------------------------


class _Cursor:
    """Reads fields off one frame's payload; every short read is a protocol error, never an IndexError."""

    __slots__ = ("_buf", "_pos", "_what")

    def __init__(self, buf: memoryview, what: str) -> None:
        self._buf = buf
        self._pos = 0
        self._what = what

    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def take(self, n: int, field: str) -> memoryview:
        if n > self.remaining():
            raise HaProtocolError(
                f"{self._what} frame too short: {field} needs {n} bytes, {self.remaining()} left"
            )
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def unpack(self, st: struct.Struct, field: str) -> tuple[int, ...]:
        return st.unpack(self.take(st.size, field))

    def u64(self, field: str) -> int:
        return self.unpack(_U64, field)[0]

    def string(self, field: str) -> str:
        (n,) = self.unpack(_U16, field + " length")
        raw = self.take(n, field)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise HaProtocolError(f"{self._what} frame: {field} is not valid UTF-8") from exc

    def epochs(self) -> Epochs:
        (count,) = self.unpack(_U32, "epoch count")
        # Check the count against what is left before building anything: a forged count must
        # not make us allocate (or loop) beyond the frame's own size.
        if count * _PAIR.size != self.remaining():
            raise HaProtocolError(
                f"{self._what} frame: {count} epochs need {count * _PAIR.size} bytes, {self.remaining()} left"
            )
        raw = self.take(count * _PAIR.size, "epochs")
        out = tuple(_PAIR.iter_unpack(raw))
        _check_epoch_order(out)
        return out

    def end(self) -> None:
        if self.remaining():
            raise HaProtocolError(f"{self._what} frame has {self.remaining()} bytes beyond its fields")


def _decode_handshake(cur: _Cursor) -> Handshake:
    broker_set = cur.string("broker_set")
    broker_id, max_offset = cur.unpack(_HANDSHAKE_FIXED, "handshake")
    return Handshake(broker_set, broker_id, max_offset, cur.epochs())


def _decode_reply(cur: _Cursor) -> HandshakeReply:
    master_id, master_epoch, max_offset, min_offset = cur.unpack(_REPLY_FIXED, "handshake reply")
    return HandshakeReply(master_id, master_epoch, max_offset, min_offset, cur.epochs())


def _decode_transfer(cur: _Cursor) -> Transfer:
    offset, epoch, epoch_start, confirm = cur.unpack(_TRANSFER_FIXED, "transfer header")
    return Transfer(offset, epoch, epoch_start, confirm, bytes(cur.take(cur.remaining(), "data")))


def _decode_hello(cur: _Cursor) -> AuthHello:
    broker_set = cur.string("broker_set")
    return AuthHello(broker_set, cur.u64("broker_id"), bytes(cur.take(NONCE_BYTES, "nonce")))


def _decode_challenge(cur: _Cursor) -> AuthChallenge:
    master_id, master_epoch = cur.unpack(_U64_PAIR, "challenge")
    return AuthChallenge(
        master_id, master_epoch, bytes(cur.take(NONCE_BYTES, "nonce")), bytes(cur.take(PROOF_BYTES, "proof"))
    )


def _decode_range_request(cur: _Cursor) -> RangeRequest:
    offset = cur.u64("offset")
    (length,) = cur.unpack(_U32, "length")
    if length == 0:
        raise HaProtocolError("RANGE_REQUEST frame: an empty range")
    return RangeRequest(offset, length)


def _decode_range_data(cur: _Cursor) -> RangeData:
    offset = cur.u64("offset")
    return RangeData(offset, bytes(cur.take(cur.remaining(), "data")))


# One decoder per frame type; each reads its fields in order and `decode_body` checks nothing is left.
_DECODERS: dict[FrameType, Callable[[_Cursor], Frame]] = {
    FrameType.TRANSFER: _decode_transfer,
    FrameType.ACK: lambda cur: Ack(cur.u64("max_offset")),
    FrameType.LEDGER_FENCED: lambda cur: LedgerFenced(cur.u64("ledger_id")),
    FrameType.HANDSHAKE: _decode_handshake,
    FrameType.HANDSHAKE_REPLY: _decode_reply,
    FrameType.AUTH_HELLO: _decode_hello,
    FrameType.AUTH_CHALLENGE: _decode_challenge,
    FrameType.AUTH_PROOF: lambda cur: AuthProof(bytes(cur.take(PROOF_BYTES, "proof"))),
    FrameType.RANGE_REQUEST: _decode_range_request,
    FrameType.RANGE_DATA: _decode_range_data,
    FrameType.ERROR: lambda cur: ErrorFrame(cur.string("code"), cur.string("message")),
}


def decode_body(body: bytes | bytearray | memoryview) -> Frame:
    """One frame from its bytes after the length prefix (type byte first)."""
    view = memoryview(body)
    if len(view) < 1:
        raise HaProtocolError("empty frame: no type byte")
    try:
        ftype = FrameType(view[0])
    except ValueError:
        raise HaProtocolError(f"unknown HA frame type {view[0]}") from None
    cur = _Cursor(view[1:], ftype.name)
    frame = _DECODERS[ftype](cur)
    cur.end()
    return frame


def _check_length(length: int, limit: int = MAX_FRAME) -> None:
    if length < 1:
        raise HaProtocolError("frame length 0: no type byte")
    if length > limit:
        raise HaProtocolError(f"frame length {length} exceeds the limit of {limit} bytes here")


class FrameDecoder:
    """Incremental decoder: feed it whatever the socket gave, get back every complete frame.

    Partial frames are kept for the next `feed`. After a `HaProtocolError` the decoder is
    broken for good (the stream's framing is lost) and every later `feed` raises again; frames
    completed earlier in the same `feed` as the error are dropped with the connection.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._broken: HaProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._broken is not None:
            raise HaProtocolError(f"decoder already failed: {self._broken.message}")
        self._buf += data
        frames: list[Frame] = []
        try:
            pos = 0
            buf = self._buf
            while len(buf) - pos >= _LEN.size:
                (length,) = _LEN.unpack_from(buf, pos)
                _check_length(length)
                end = pos + _LEN.size + length
                if end > len(buf):
                    break
                with memoryview(buf) as view:
                    frames.append(decode_body(view[pos + _LEN.size : end]))
                pos = end
            # One deletion per feed, not per frame: bytearray front deletion is cheap, but a
            # feed that completes thousands of acks should not pay for it thousands of times.
            del buf[:pos]
        except HaProtocolError as exc:
            self._broken = exc
            self._buf = bytearray()
            raise
        return frames


async def read_frame(reader: asyncio.StreamReader, max_length: int | Callable[[], int] = MAX_FRAME) -> Frame:
    """Read exactly one frame of at most `max_length` bytes (its length prefix not counted); a
    callable is asked once the length has arrived (a limit that may grow while the read waits).

    Raises HaProtocolError on a malformed or longer frame (before reading its body, so a hostile
    length costs nothing) and asyncio.IncompleteReadError on EOF (also EOF in the middle of a
    frame: the peer went away, which is not a protocol violation).
    """
    first = await reader.readexactly(1)  # an idle link may wait here: the callers time idleness
    # a length begun must be whole soon: a peer that sends part of one holds its connection
    # slot otherwise (the data port's HEADER_TIMEOUT_S, the same rule)
    rest = await within(reader.readexactly(_LEN.size - 1), HEADER_TIMEOUT_S)
    (length,) = _LEN.unpack(first + rest)
    _check_length(length, max_length() if callable(max_length) else max_length)
    return decode_body(await reader.readexactly(length))
