"""The data plane's frames: produce and pull over a plain TCP connection (docs/ARCHITECTURE.md §1.5).

gRPC costs a few hundred microseconds of Python per call on each side, and copies every byte
of a message through protobuf; the record batches of a produce or a pull are already in the
commit log's format (commitlog/batch.py), so they travel here as they are. Every broker serves
these frames on its data port beside its gRPC port (which keeps everything else: admin, offsets,
ledgers, status). Pure codec, no I/O; all integers big-endian.

    request  = length u32 | op u8     | request id u32 | body      (length counts op onward)
    reply    = length u32 | status u8 | request id u32 | body      (status 0 ok, 1 error)

    PRODUCE  body: topic_len u16 | queue u32 | count u32 | crc u32 | topic | records
             ok:   broker_set_len u16 | first queue offset u64 | n u32 | broker_set | n × phys u64
    PULL     body: topic_len u16 | queue u32 | offset u64 | max_messages u32 | max_bytes u32 |
                   wait_ms u32 | topic
             ok:   next offset u64 | min u64 | max u64 | confirmed u64 | count u32 | crc u32 | records
                   (crc: CRC32C of the records, checked by the client; the broker checked each
                   record's own CRC when it read them)
    AUTH     body: n u16 | n × (name_len u16 | value_len u16 | name | value)   (UTF-8)
             ok:   empty
    LEDGER_ADD  body: ledger_id u64 | password_len u16 | count u32 | password |
                      count × (entry_id i64 | lac i64 | length i64 | digest_len u16 | data_len u32 |
                               digest | data)
             ok:   first entry id i64 | last entry id i64 | broker id u32 | n u16 | n × replica u32
                   (a ledger's `AddBatch`, ledger/API.md: the entries as the writer made them,
                   checked and appended by the master like the gRPC call it stands for)
    LEDGER_ADDS body: n u16 | n × (len u32 | a LEDGER_ADD body)      (n in 1..MAX_LEDGER_GROUPS)
             ok:   n u16 | n × (status u8 | len u32 | a LEDGER_ADD ok body, or an error body)
                   (the adds of several ledgers bound for one broker, in one frame: each group
                   is checked, appended and answered as its own LEDGER_ADD would be, so one
                   ledger's refusal, a fence say, leaves the others' adds alone)
    COMMITS  body: n u32 | n × (group_len u16 | topic_len u16 | queue i32 | offset i64 | group | topic)
             ok:   empty
                   (group commits, the gRPC `CommitOffsets` they stand for: n in 1..MAX_COMMITS,
                   checked and written in one write, all or none; a client's commit pace,
                   client/commitpace.py, gathers many groups' commits in one)
    error    body: code_len u16 | leader_len u16 | code | leader | message (UTF-8)

With auth on (tidelog/guard.py), a connection's first frame is AUTH: the same metadata a gRPC call
carries (a user's `authorization` and `x-mq-date-time`, or a cluster member's token). Every frame
before a successful AUTH is answered UNAUTHENTICATED and the connection is closed; every request
after it is checked against the permission rules like the gRPC call it stands for.

Limits: a frame is at most MAX_FRAME bytes (`produce_room`: the records a produce may carry); a
produce at most MAX_PRODUCE_RECORDS records; a topic at most 255 bytes. A frame that breaks the
layout is a protocol error: the connection that sent it is closed, nothing else.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tidelog.errors import InvalidArgumentError, TidelogError
from tidelog.wire import MAX_MESSAGE_BYTES

OP_PRODUCE = 1
OP_PULL = 2
OP_AUTH = 3
OP_LEDGER_ADD = 4
OP_LEDGER_ADDS = 5
OP_COMMITS = 6
#: How a broker answers an operation it does not know (one older than the operation).
UNKNOWN_OP = "unknown data-port operation"
OK = 0
ERROR = 1

HEAD = struct.Struct(">IBI")
HEAD_SIZE = HEAD.size  # 9
MAX_FRAME = (64 << 20) + 4096  # the largest batch gRPC would take, plus room for the fields
#: The most records one produce request carries (the broker refuses more, on both transports).
MAX_PRODUCE_RECORDS = 10_000
# room for a ProduceBatchRequest's fields beside its records in one gRPC message (the topic is
# at most 255 bytes; every other field is a few bytes)
_GRPC_PRODUCE_FIELDS = 1024
_PRODUCE = struct.Struct(">HIII")
_PRODUCED = struct.Struct(">HQI")
_PULL = struct.Struct(">HIQIII")
_PULLED = struct.Struct(">QQQQII")
_ERROR = struct.Struct(">HH")
_LEDGER_ADD = struct.Struct(">QHI")
_LEDGER_ENTRY = struct.Struct(">qqqHI")
_LEDGER_ADDED = struct.Struct(">qqIH")
#: The most entries one ledger add frame carries (the writer sends at most 1,000 a call).
MAX_LEDGER_ENTRIES = 10_000
#: The most ledgers whose adds one LEDGER_ADDS frame carries.
MAX_LEDGER_GROUPS = 1024
#: group commits in one COMMITS frame, as in one `CommitOffsets` call
MAX_COMMITS = MAX_PRODUCE_RECORDS
_COMMIT = struct.Struct(">HHiq")
_COMMITS = struct.Struct(">I")
_GROUP = struct.Struct(">I")
GROUP_HEAD = _GROUP.size  # the length field before each batch of a LEDGER_ADDS frame
_OUTCOME = struct.Struct(">BI")
_COUNT = struct.Struct(">H")
#: The method name an AUTH frame's signature is made for (a cluster member's token names it).
AUTH_METHOD = "/tidelog.broker.v1.DataPort/Auth"
MAX_AUTH_ENTRIES = 8
MAX_AUTH_TEXT = 1024


class FrameError(InvalidArgumentError):
    """A frame that breaks the data plane's layout; its connection is closed."""


def frame(kind: int, rid: int, *parts: bytes) -> list[bytes]:
    """A whole frame as pieces to write (no copy of the payload)."""
    return [HEAD.pack(HEAD_SIZE - 4 + sum(len(p) for p in parts), kind, rid), *parts]


def body_length(length: int) -> int:
    """The body's length from a frame's length field, or FrameError."""
    if not HEAD_SIZE - 4 <= length <= MAX_FRAME:
        raise FrameError(f"frame length {length} is outside 5..{MAX_FRAME}")
    return length - (HEAD_SIZE - 4)


# --- produce ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProduceCall:
    topic: str
    queue: int
    count: int
    crc: int
    records: memoryview


def produce_request(topic: str, queue: int, count: int, crc: int) -> bytes:
    """The fields before a produce's records (the records follow as their own piece)."""
    t = topic.encode()
    return _PRODUCE.pack(len(t), queue, count, crc) + t


def produce_room(topic: str) -> int:
    """The most record bytes one produce request to `topic` may carry: within one frame, and
    within one gRPC message for the fall-back. A client cuts a larger batch into several
    requests: a frame over MAX_FRAME would close its whole connection."""
    fields = HEAD_SIZE - 4 + _PRODUCE.size + len(topic.encode())
    return min(MAX_FRAME - fields, MAX_MESSAGE_BYTES - _GRPC_PRODUCE_FIELDS)


def parse_produce(body: bytes) -> ProduceCall:
    if len(body) < _PRODUCE.size:
        raise FrameError("a produce frame is shorter than its fields")
    tlen, queue, count, crc = _PRODUCE.unpack_from(body)
    start = _PRODUCE.size + tlen
    if start > len(body):
        raise FrameError("a produce frame's topic runs past its end")
    return ProduceCall(_text(body, _PRODUCE.size, start), queue, count, crc, memoryview(body)[start:])


def produced(broker_set: str, first: int, phys: list[int]) -> bytes:
    b = broker_set.encode()
    return _PRODUCED.pack(len(b), first, len(phys)) + b + struct.pack(f">{len(phys)}Q", *phys)


def parse_produced(body: bytes | bytearray) -> tuple[str, int, tuple[int, ...]]:
    """(broker set, first queue offset, physical offset of each record)."""
    if len(body) < _PRODUCED.size:
        raise FrameError("a produce reply is shorter than its fields")
    blen, first, n = _PRODUCED.unpack_from(body)
    at = _PRODUCED.size + blen
    if len(body) != at + 8 * n:
        raise FrameError("a produce reply's size does not match its fields")
    return _text(body, _PRODUCED.size, at), first, struct.unpack_from(f">{n}Q", body, at)


# --- pull ------------------------------------------------------------------------------------


class PullCall(NamedTuple):
    topic: str
    queue: int
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int


class Offsets(NamedTuple):
    min: int
    max: int
    confirmed: int


@dataclass(frozen=True, slots=True)
class Pulled:
    """A pull's answer, with the names of the gRPC PullReply's fields."""

    next_offset: int
    offsets: Offsets
    count: int
    records: bytes | memoryview  # a data-port reply's records: a view of the reply, not a copy
    crc: int


def pull_request(call: PullCall) -> bytes:
    t = call.topic.encode()
    return _PULL.pack(len(t), call.queue, call.offset, call.max_messages, call.max_bytes, call.wait_ms) + t


def parse_pull(body: bytes) -> PullCall:
    if len(body) < _PULL.size:
        raise FrameError("a pull frame is shorter than its fields")
    tlen, queue, offset, max_messages, max_bytes, wait_ms = _PULL.unpack_from(body)
    if _PULL.size + tlen != len(body):
        raise FrameError("a pull frame's size does not match its topic")
    return PullCall(_text(body, _PULL.size, len(body)), queue, offset, max_messages, max_bytes, wait_ms)


def pulled_head(next_offset: int, offsets: Offsets, count: int, crc: int) -> bytes:
    """The fields before a pull reply's records (the records follow as their own piece)."""
    return _PULLED.pack(next_offset, offsets.min, offsets.max, offsets.confirmed, count, crc)


def parse_pulled(body: bytes | bytearray) -> Pulled:
    if len(body) < _PULLED.size:
        raise FrameError("a pull reply is shorter than its fields")
    nxt, low, high, confirmed, count, crc = _PULLED.unpack_from(body)
    # A view: a reply holds megabytes, and the Spark reader builds its columns from it as it is.
    return Pulled(nxt, Offsets(low, high, confirmed), count, memoryview(body)[_PULLED.size :], crc)


# --- ledger adds ------------------------------------------------------------------------------


class LedgerEntry(NamedTuple):
    """One ledger entry, with the names of the gRPC `Entry`'s fields: what an add carries and a
    read answers per entry (broker/ledgers.py's `Entry`). A tuple, not a frozen dataclass: a batch
    builds thousands of them, at a third of the cost."""

    entry_id: int
    lac: int
    length: int
    digest: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class LedgerAddCall:
    ledger_id: int
    password: bytes
    entries: list[LedgerEntry]


def ledger_add_request(ledger_id: int, password: bytes, entries: Sequence[LedgerEntry]) -> list[bytes]:
    """A ledger add's body as pieces to write (each entry's data is its own piece, not copied)."""
    parts = [_LEDGER_ADD.pack(ledger_id, len(password), len(entries)), password]
    pack = _LEDGER_ENTRY.pack
    for e in entries:
        parts += (pack(e.entry_id, e.lac, e.length, len(e.digest), len(e.data)) + e.digest, e.data)
    return parts


def parse_ledger_add(body: bytes) -> LedgerAddCall:
    """A ledger add frame's fields; FrameError when its lengths do not add up to the frame. What
    the entries say (ids in order, digests, sizes) is the ledger's to check."""
    return _parse_ledger_add(body, 0, len(body))


def _parse_ledger_add(body: bytes, start: int, end: int) -> LedgerAddCall:
    """The ledger add in body[start:end] (a LEDGER_ADD frame's body, or one of LEDGER_ADDS)."""
    if end - start < _LEDGER_ADD.size:
        raise FrameError("a ledger add frame is shorter than its fields")
    ledger_id, plen, count = _LEDGER_ADD.unpack_from(body, start)
    if not 0 < count <= MAX_LEDGER_ENTRIES:
        raise FrameError(f"a ledger add frame carries {count} entries, not 1..{MAX_LEDGER_ENTRIES}")
    at = start + _LEDGER_ADD.size + plen
    if at > end:
        raise FrameError("a ledger add frame's password runs past its end")
    password = body[start + _LEDGER_ADD.size : at]
    entries = []
    unpack, head = _LEDGER_ENTRY.unpack_from, _LEDGER_ENTRY.size
    for _ in range(count):
        if at + head > end:
            raise FrameError("a ledger add frame's entry runs past its end")
        entry_id, lac, length, dlen, size = unpack(body, at)
        at += head
        data_at = at + dlen
        if data_at + size > end:
            raise FrameError(f"entry {entry_id} of a ledger add frame runs past its end")
        entries.append(LedgerEntry(entry_id, lac, length, body[at:data_at], body[data_at : data_at + size]))
        at = data_at + size
    if at != end:
        raise FrameError("a ledger add frame's size does not match its entries")
    return LedgerAddCall(ledger_id, password, entries)


def ledger_adds_request(groups: Sequence[list[bytes]]) -> list[bytes]:
    """A LEDGER_ADDS body as pieces to write: the `ledger_add_request` pieces of each ledger."""
    parts = [_COUNT.pack(len(groups))]
    for group in groups:
        parts.append(_GROUP.pack(sum(len(p) for p in group)))
        parts += group
    return parts


def parse_ledger_adds(body: bytes) -> list[LedgerAddCall]:
    """The ledger adds of a LEDGER_ADDS frame; FrameError when its lengths do not add up."""
    if len(body) < _COUNT.size:
        raise FrameError("a ledger adds frame is shorter than its fields")
    (n,) = _COUNT.unpack_from(body)
    if not 0 < n <= MAX_LEDGER_GROUPS:
        raise FrameError(f"a ledger adds frame carries {n} ledgers' adds, not 1..{MAX_LEDGER_GROUPS}")
    at, end, calls = _COUNT.size, len(body), []
    for _ in range(n):
        if at + _GROUP.size > end:
            raise FrameError("a ledger adds frame's group runs past its end")
        (size,) = _GROUP.unpack_from(body, at)
        at += _GROUP.size
        if at + size > end:
            raise FrameError("a ledger adds frame's group runs past its end")
        calls.append(_parse_ledger_add(body, at, at + size))
        at += size
    if at != end:
        raise FrameError("a ledger adds frame's size does not match its groups")
    return calls


def ledger_adds_reply(outcomes: Sequence[tuple[int, bytes]]) -> list[bytes]:
    """A LEDGER_ADDS reply's body: per group, in order, its status (OK or ERROR) and its body (a
    LEDGER_ADD reply's, or an error's)."""
    parts = [_COUNT.pack(len(outcomes))]
    for status, body in outcomes:
        parts += (_OUTCOME.pack(status, len(body)), body)
    return parts


def parse_ledger_adds_reply(body: bytes | bytearray, groups: int) -> list[tuple[int, bytes | bytearray]]:
    """(status, body) per group of a LEDGER_ADDS reply; FrameError unless it answers `groups`."""
    if len(body) < _COUNT.size or _COUNT.unpack_from(body)[0] != groups:
        raise FrameError(f"a ledger adds reply does not answer its {groups} groups")
    at, end, out = _COUNT.size, len(body), []
    for _ in range(groups):
        if at + _OUTCOME.size > end:
            raise FrameError("a ledger adds reply's outcome runs past its end")
        status, size = _OUTCOME.unpack_from(body, at)
        at += _OUTCOME.size
        if status not in (OK, ERROR) or at + size > end:
            raise FrameError("a ledger adds reply's outcome is malformed")
        out.append((status, body[at : at + size]))
        at += size
    if at != end:
        raise FrameError("a ledger adds reply's size does not match its outcomes")
    return out


class LedgerAdded(NamedTuple):
    """A batch of adds as the master answers it, with the names of the gRPC `AddBatchReply`'s
    fields: its first and last entry ids, the answering broker and the replicas holding them."""

    first_entry_id: int
    last_entry_id: int
    broker_id: int
    replicas: tuple[int, ...]


def ledger_added(first: int, last: int, broker_id: int, replicas: Sequence[int]) -> bytes:
    return _LEDGER_ADDED.pack(first, last, broker_id, len(replicas)) + struct.pack(
        f">{len(replicas)}I", *replicas
    )


def parse_ledger_added(body: bytes | bytearray) -> LedgerAdded:
    if len(body) < _LEDGER_ADDED.size:
        raise FrameError("a ledger add reply is shorter than its fields")
    first, last, broker_id, n = _LEDGER_ADDED.unpack_from(body)
    if len(body) != _LEDGER_ADDED.size + 4 * n:
        raise FrameError("a ledger add reply's size does not match its fields")
    return LedgerAdded(first, last, broker_id, struct.unpack_from(f">{n}I", body, _LEDGER_ADDED.size))


# --- group commits ---------------------------------------------------------------------------


class Commit(NamedTuple):
    """One group commit of a COMMITS frame (the fields of a `CommitOffsetRequest`)."""

    group: str
    topic: str
    queue: int
    offset: int


class CommitsCall(NamedTuple):
    commits: list[Commit]


def commits_request(commits: Sequence[tuple[str, str, int, int]]) -> bytes:
    """A COMMITS body of (group, topic, queue, offset) commits."""
    parts = [_COMMITS.pack(len(commits))]
    try:
        for group, topic, queue, offset in commits:
            g, t = group.encode(), topic.encode()
            parts += (_COMMIT.pack(len(g), len(t), queue, offset), g, t)
    except struct.error as exc:
        raise InvalidArgumentError(f"a commit that no frame can carry: {exc}") from None
    return b"".join(parts)


def parse_commits(body: bytes) -> CommitsCall:
    """The commits of a COMMITS frame; FrameError when its lengths do not add up or it holds
    more than MAX_COMMITS (their fields are the service's to judge, as a gRPC call's)."""
    if len(body) < _COMMITS.size:
        raise FrameError("a commits frame is shorter than its count")
    (n,) = _COMMITS.unpack_from(body)
    if n > MAX_COMMITS:
        raise FrameError(f"a commits frame carries {n} commits, more than {MAX_COMMITS}")
    at, end, commits = _COMMITS.size, len(body), []
    for _ in range(n):
        if at + _COMMIT.size > end:
            raise FrameError("a commits frame's commit runs past its end")
        glen, tlen, queue, offset = _COMMIT.unpack_from(body, at)
        at += _COMMIT.size
        group = _text(body, at, at + glen)
        topic = _text(body, at + glen, at + glen + tlen)
        at += glen + tlen
        commits.append(Commit(group, topic, queue, offset))
    if at != end:
        raise FrameError("a commits frame's size does not match its commits")
    return CommitsCall(commits)


# --- auth ------------------------------------------------------------------------------------


def auth_request(metadata: tuple[tuple[str, str], ...]) -> bytes:
    """An AUTH frame's body: the metadata entries that sign the connection."""
    parts = [_COUNT.pack(len(metadata))]
    for name, value in metadata:
        n, v = name.encode(), value.encode()
        parts.append(_ERROR.pack(len(n), len(v)) + n + v)
    return b"".join(parts)


def parse_auth(body: bytes) -> dict[str, str]:
    """The metadata of an AUTH frame (names lower-cased; the first of a repeated name counts)."""
    if len(body) < _COUNT.size:
        raise FrameError("an auth frame is shorter than its fields")
    (n,) = _COUNT.unpack_from(body)
    if n > MAX_AUTH_ENTRIES:
        raise FrameError(f"an auth frame has {n} entries, at most {MAX_AUTH_ENTRIES}")
    at = _COUNT.size
    out: dict[str, str] = {}
    for _ in range(n):
        if at + _ERROR.size > len(body):
            raise FrameError("an auth frame's entry runs past its end")
        nlen, vlen = _ERROR.unpack_from(body, at)
        if nlen > MAX_AUTH_TEXT or vlen > MAX_AUTH_TEXT:
            raise FrameError(f"an auth entry is longer than {MAX_AUTH_TEXT} bytes")
        at += _ERROR.size
        name = _text(body, at, at + nlen)
        value = _text(body, at + nlen, at + nlen + vlen)
        out.setdefault(name.lower(), value)
        at += nlen + vlen
    if at != len(body):
        raise FrameError("an auth frame's size does not match its entries")
    return out


# --- errors ----------------------------------------------------------------------------------


def error_body(err: TidelogError, leader: str | None) -> bytes:
    code = err.code.encode()
    lead = (leader or "").encode()
    return _ERROR.pack(len(code), len(lead)) + code + lead + err.message.encode()


def parse_error(body: bytes | bytearray) -> tuple[str, str, str]:
    """(code, leader, message) of an error reply."""
    if len(body) < _ERROR.size:
        raise FrameError("an error reply is shorter than its fields")
    clen, llen = _ERROR.unpack_from(body)
    at = _ERROR.size
    return (
        _text(body, at, at + clen),
        _text(body, at + clen, at + clen + llen),
        _text(body, at + clen + llen, len(body)),
    )


def _text(body: bytes | bytearray, start: int, end: int) -> str:
    if end > len(body):
        raise FrameError("a text field runs past the frame's end")
    try:
        return bytes(body[start:end]).decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"a text field is not UTF-8: {exc}") from exc
