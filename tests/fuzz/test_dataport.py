"""Fuzzing the data port's frames (tidelog/dataport_frames.py) on both ends: the broker's parsing and
serving of a request body (produce, pull, ledger add, group commits; broker/dataport.py, through
a real in-process master), and the
client's reading of a reply stream (client/dataconn.py).

Contract:
- every parser returns its fields or raises FrameError (the connection is then closed), and a
  request it accepts encodes back to the same bytes;
- a request body the port serves is answered with a reply frame or a typed error frame, never
  INTERNAL, within its bound (a pull's `wait_ms` is cut to 20 ms here: a long poll waits by
  design), and the reply parses on the client;
- the client's reader, given any byte stream, ends with the connection closed and every pending
  call answered: its reply, or UnavailableError;
- with auth on, a connection's first frame that is not a user's valid AUTH frame never
  authenticates: it is answered UNAUTHENTICATED (or the connection just closes), never INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import FUZZ, Check, Fuzzer, inputs, plain
from tests.fuzz.replica import QUEUES, TOPIC, master
from tidelog import dataport_frames as df
from tidelog.acl import AclState, User
from tidelog.broker.dataport import ByteBudget, DataPort, _Held, _Link
from tidelog.client.aio import OutMessage
from tidelog.client.dataconn import DataConnection, ReplyReader
from tidelog.commitlog import batch
from tidelog.credentials import Credentials
from tidelog.errors import TidelogError, UnavailableError
from tidelog.guard import AuthSettings, Guard
from tidelog.wire import make_error

topics = st.one_of(st.just(TOPIC), st.text(max_size=6))
queues = st.one_of(st.integers(0, QUEUES), st.just(2**32 - 1))


@st.composite
def produce_bodies(draw: st.DrawFn) -> bytes:
    topic = draw(topics)
    queue = draw(queues)
    msgs = draw(
        st.lists(
            st.builds(OutMessage, st.binary(max_size=30), st.none(), st.none(), st.none()),
            min_size=1,
            max_size=3,
        )
    )
    records = batch.encode_batch(topic.encode(), queue, msgs, 1)
    count = draw(st.sampled_from([len(msgs), 0, len(msgs) + 1]))
    crc = crc32c(records) if draw(st.booleans()) else 0
    return bytes([df.OP_PRODUCE]) + df.produce_request(topic, queue, count, crc) + records


u32 = st.integers(0, 2**32 - 1)
pull_bodies = st.builds(
    lambda call: bytes([df.OP_PULL]) + df.pull_request(call),
    st.builds(df.PullCall, topics, queues, st.integers(0, 2**64 - 1), u32, u32, st.integers(0, 20)),
)
ledger_add_bodies = st.builds(
    lambda lid, password, entries: (
        bytes([df.OP_LEDGER_ADD]) + b"".join(df.ledger_add_request(lid, password, entries))
    ),
    st.integers(0, 3) | st.integers(0, 2**64 - 1),
    st.binary(max_size=8),
    st.lists(
        st.builds(
            df.LedgerEntry,
            st.integers(-2, 5),
            st.integers(-2, 5),
            st.integers(0, 100),
            st.binary(max_size=8),
            st.binary(max_size=30),
        ),
        min_size=1,
        max_size=3,
    ),
)
commit_bodies = st.builds(
    lambda commits: bytes([df.OP_COMMITS]) + df.commits_request(commits),
    st.lists(
        st.tuples(
            st.sampled_from(["g", "", " ", "g" * 256]) | st.text(max_size=6),
            topics,
            st.integers(-1, QUEUES) | st.integers(-(2**31), 2**31 - 1),
            st.integers(-1, 5) | st.integers(-(2**63), 2**63 - 1),
        ),
        max_size=4,
    ),
)
requests = st.one_of(produce_bodies(), pull_bodies, ledger_add_bodies, commit_bodies)

replies = st.one_of(
    st.builds(
        df.produced,
        st.text(max_size=8),
        st.integers(0, 2**64 - 1),
        st.lists(st.integers(0, 2**64 - 1), max_size=3),
    ),
    st.builds(
        lambda n, c, data: df.pulled_head(n, df.Offsets(0, n, n), c, crc32c(data)) + data,
        st.integers(0, 2**64 - 1),
        u32,
        st.binary(max_size=40),
    ),
    st.builds(
        lambda code, leader, msg: df.error_body(make_error(code, msg), leader),
        st.sampled_from(["NOT_MASTER", "INVALID_ARGUMENT", "WHAT"]),
        st.none() | st.text(max_size=8),
        st.text(max_size=20),
    ),
)
#: A reply stream: frames with request ids 1 and 2 and status ok or error.
reply_stream = st.lists(
    st.builds(
        lambda body, status, rid: b"".join(df.frame(status, rid, body)),
        replies,
        st.sampled_from([0, 1, 7]),
        st.sampled_from([1, 2, 3]),
    ),
    max_size=3,
).map(b"".join)


# --- the parsers ------------------------------------------------------------------------------


def _parsed(fn, body: bytes):  # type: ignore[no-untyped-def]
    try:
        return fn(body)
    except df.FrameError as exc:
        assert exc.message
        return None


def check_parsers(data: bytes) -> None:
    body = data[1:]
    call = _parsed(df.parse_produce, body)
    if call is not None:
        assert df.produce_request(call.topic, call.queue, call.count, call.crc) + bytes(call.records) == body
    pull = _parsed(df.parse_pull, body)
    if pull is not None:
        assert df.pull_request(pull) == body
    add = _parsed(df.parse_ledger_add, body)
    if add is not None:  # a ledger add that parses is exactly its fields
        assert b"".join(df.ledger_add_request(add.ledger_id, add.password, add.entries)) == body
    commits = _parsed(df.parse_commits, body)
    if commits is not None:  # so are group commits
        assert df.commits_request(commits.commits) == body
    for fn in (df.parse_produced, df.parse_pulled, df.parse_error, df.parse_ledger_added):
        _parsed(fn, body)
    auth = _parsed(df.parse_auth, body)
    if auth is not None:  # what an AUTH frame decodes to is bounded, and re-encodes to a valid frame
        assert len(auth) <= df.MAX_AUTH_ENTRIES
        assert df.parse_auth(df.auth_request(tuple(auth.items()))) == auth
    if len(data) >= 4:
        with contextlib.suppress(df.FrameError):
            assert 0 <= df.body_length(struct.unpack_from(">I", data)[0]) <= df.MAX_FRAME


# --- the broker's port ---------------------------------------------------------------------


def _cut_wait(op: int, body: bytes) -> bytes:
    """A pull's wait_ms cut to at most 20 ms (the u32 after topic_len, queue, offset and limits)."""
    at = df._PULL.size - 4
    if op != df.OP_PULL or len(body) < df._PULL.size:
        return body
    (wait,) = struct.unpack_from(">I", body, at)
    return body[:at] + struct.pack(">I", min(wait, 20)) + body[at + 4 :]


@contextlib.contextmanager
def _port_check() -> Iterator[Check]:
    with master() as m:
        port = DataPort(m.replica)

        def check(data: bytes) -> None:
            if not data:
                return
            op, body = data[0], _cut_wait(data[0], data[1:])
            held = _Held(ByteBudget(df.MAX_FRAME * 2), len(body))
            reply, code = m.run(port._reply(op, 9, body, held), timeout=10)
            assert code != "INTERNAL", reply
            head, *rest = reply
            length, status, rid = df.HEAD.unpack(head)
            payload = b"".join(rest)
            assert rid == 9 and df.body_length(length) == len(payload)
            if status == df.ERROR:
                got = df.parse_error(payload)
                assert got[0] == code
            elif op == df.OP_PRODUCE:
                df.parse_produced(payload)
            elif op == df.OP_LEDGER_ADD:
                df.parse_ledger_added(payload)
            elif op == df.OP_COMMITS:
                assert payload == b""  # written: an empty ok
            else:
                pulled = df.parse_pulled(payload)
                assert crc32c(pulled.records) == pulled.crc

        yield check


# --- the AUTH frame of a guarded port ---------------------------------------------------------

ALICE = Credentials("AKalice1", "alice-secret")
GUARD = Guard(
    AuthSettings(True),
    lambda: AclState(1, {"alice": User("alice", ALICE.access_key, ALICE.signing_key)}),
    lambda method, metadata, request: False,
)


class _Writer:
    """What the port writes its answer to the AUTH frame into."""

    def __init__(self) -> None:
        self.out = bytearray()

    def is_closing(self) -> bool:
        return False

    def writelines(self, parts: list[bytes]) -> None:
        self.out += b"".join(parts)

    async def drain(self) -> None:
        return None

    def get_extra_info(self, name: str) -> None:
        return None


async def _first_frame(frame: bytes) -> tuple[bool, bytes, str]:
    """Whether `frame`, a connection's first bytes, authenticated it; the answer; the identity."""
    reader = asyncio.StreamReader()
    reader.feed_data(frame)
    reader.feed_eof()
    writer = _Writer()
    link = _Link(writer)  # type: ignore[arg-type]
    replica = SimpleNamespace(ctx="fuzz", cfg=SimpleNamespace(data_partial_frame_bytes=64 << 20))
    port = DataPort(replica, guard=GUARD)  # type: ignore[arg-type]
    try:
        ok = await port._authenticate(reader, link, GUARD)
    except (df.FrameError, asyncio.IncompleteReadError):
        return False, b"", ""  # the connection closes, nothing answered
    return ok, bytes(writer.out), link.identity


def check_auth(data: bytes) -> None:
    # half the inputs as the body of an AUTH frame, half as raw first bytes
    frame = b"".join(df.frame(df.OP_AUTH, 1, data[1:])) if data[:1] < b"\x80" else data
    ok, answer, identity = asyncio.run(asyncio.wait_for(_first_frame(frame), 5))  # noqa: TID251
    assert not ok and not identity, "random bytes authenticated a data-port connection"
    if answer:
        length, status, _rid = df.HEAD.unpack_from(answer)
        assert status == df.ERROR and df.parse_error(answer[df.HEAD_SIZE :])[0] == "UNAUTHENTICATED"


def test_a_users_auth_frame_authenticates_and_names_the_user() -> None:
    body = df.auth_request(ALICE.metadata(method=df.AUTH_METHOD))
    ok, answer, identity = asyncio.run(_first_frame(b"".join(df.frame(df.OP_AUTH, 7, body))))
    assert ok and identity == "alice"
    assert df.HEAD.unpack_from(answer)[1:] == (df.OK, 7)
    wrong = df.auth_request(Credentials(ALICE.access_key, "guess").metadata(method=df.AUTH_METHOD))
    assert not asyncio.run(_first_frame(b"".join(df.frame(df.OP_AUTH, 7, wrong))))[0]


@FUZZ
@given(inputs(requests))
def test_no_first_frame_but_a_users_authenticates(data: bytes) -> None:
    check_auth(data)


# --- the client's reader -----------------------------------------------------------------------


async def _receive(data: bytes) -> None:
    conn = DataConnection("127.0.0.1:1")
    loop = asyncio.get_running_loop()
    pending = {rid: loop.create_future() for rid in (1, 2)}
    conn._pending.update(pending)
    reader = ReplyReader(conn._on_frame, conn._on_lost)
    # the stream in the pieces a socket might deliver it in: 1 byte, then ever larger reads
    pos, piece = 0, 1
    while pos < len(data) and not conn.closed:
        buf = reader.get_buffer(-1)
        n = min(len(buf), piece, len(data) - pos)
        assert n > 0, "the reader offered no room while a frame was incomplete"
        buf[:n] = data[pos : pos + n]
        reader.buffer_updated(n)
        pos, piece = pos + n, piece * 3
    reader.connection_lost(None)
    assert conn.closed
    for fut in pending.values():
        assert fut.done()
        if fut.exception() is not None:
            assert isinstance(fut.exception(), UnavailableError)
            continue
        status, body = fut.result()
        if status != df.OK:
            with contextlib.suppress(df.FrameError):  # the client raises it as INVALID_ARGUMENT
                code, leader, message = df.parse_error(body)
                assert isinstance(
                    make_error(code, message, **({"leader": leader} if leader else {})), TidelogError
                )


def check_client(data: bytes) -> None:
    asyncio.run(asyncio.wait_for(_receive(data), 5))  # noqa: TID251 (a test bound, nothing to cancel)


FUZZERS = [
    Fuzzer("dataport.parse", requests | replies.map(lambda b: b"\0" + b), plain(check_parsers)),
    Fuzzer("dataport.serve", requests, _port_check),
    Fuzzer("dataconn.receive", reply_stream, plain(check_client)),
    Fuzzer("dataport.auth", requests, plain(check_auth)),
]


@FUZZ
@given(inputs(requests | replies.map(lambda b: b"\0" + b)))
def test_parsers(data: bytes) -> None:
    check_parsers(data)


@pytest.fixture(scope="module")
def port_check() -> Iterator[Check]:
    with _port_check() as check:  # one master for every example
        yield check


@FUZZ
@given(data=inputs(requests))
def test_port_serves_any_body(port_check: Check, data: bytes) -> None:
    port_check(data)


@FUZZ
@given(inputs(reply_stream))
def test_client_reader(data: bytes) -> None:
    check_client(data)
