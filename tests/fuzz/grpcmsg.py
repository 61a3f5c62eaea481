"""Hypothesis strategies for any protobuf request message, read off its descriptor: every field
may be left unset or given an arbitrary value of its type — integers at and past the edges of
their width, odd strings (empty, blank, NUL, reserved names, past 255 characters), bytes up to
past the broker's message limit — nested messages and maps included; and the fake servicer
context the handlers answer through (its `abort` is how `tidelog.wire.rpc` reports a status).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from tidelog.errors import by_code
from tidelog.wire import ERROR_CODE_KEY

F = FieldDescriptor


def _ints(bits: int, signed: bool) -> st.SearchStrategy[int]:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    edges = sorted(v for v in {lo, hi, 0, 1, -1, 2, 60_001, 2**31 - 1, 2**31, 2**32} if lo <= v <= hi)
    return st.one_of(
        st.integers(-2, 10).filter(lambda v: lo <= v <= hi), st.sampled_from(edges), st.integers(lo, hi)
    )


ODD_TEXT = ["", " ", "\x00", "t", "%OFFSETS%", "..", ".", "a" * 256, "é" * 200, "\ud7ff", "broker-a", "0"]
BIG = b"\0" * ((1 << 20) + 1)  # past the fuzzed master's max_message_bytes

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    F.TYPE_INT32: _ints(32, True),
    F.TYPE_SINT32: _ints(32, True),
    F.TYPE_SFIXED32: _ints(32, True),
    F.TYPE_INT64: _ints(64, True),
    F.TYPE_SINT64: _ints(64, True),
    F.TYPE_SFIXED64: _ints(64, True),
    F.TYPE_UINT32: _ints(32, False),
    F.TYPE_FIXED32: _ints(32, False),
    F.TYPE_UINT64: _ints(64, False),
    F.TYPE_FIXED64: _ints(64, False),
    F.TYPE_BOOL: st.booleans(),
    F.TYPE_STRING: st.one_of(st.sampled_from(ODD_TEXT), st.text(max_size=20)),
    F.TYPE_BYTES: st.one_of(st.binary(max_size=64), st.sampled_from([b"", BIG])),
    F.TYPE_DOUBLE: st.floats(),
    F.TYPE_FLOAT: st.floats(width=32),
}


def _field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if f.type == F.TYPE_MESSAGE:
        if f.message_type.GetOptions().map_entry:
            k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            return st.dictionaries(_field(k, depth), _field(v, depth + 1), max_size=3)
        inner = (
            messages(f.message_type, depth + 1) if depth < 2 else st.just(GetMessageClass(f.message_type)())
        )
        return st.lists(inner, max_size=3) if _repeated(f) else inner
    if f.type == F.TYPE_ENUM:
        one: st.SearchStrategy[Any] = st.one_of(
            st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-1, 99)
        )
    else:
        one = _SCALARS[f.type]
    return st.lists(one, max_size=4) if _repeated(f) else one


def _repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated) if hasattr(f, "is_repeated") else f.label == F.LABEL_REPEATED


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """A message of `descriptor`'s type, each field unset or arbitrary."""
    cls = GetMessageClass(descriptor)
    fields = {f.name: _field(f, depth) for f in descriptor.fields}
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


class Aborted(Exception):
    """What the fake context's `abort` raises, as gRPC's does (the handler does not go on)."""


class Context:
    """The servicer context a handler gets: records the status it aborts with."""

    def __init__(self) -> None:
        self.status: grpc.StatusCode | None = None
        self.details = ""
        self.metadata: dict[str, str] = {}

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.status, self.details, self.metadata = code, details, dict(trailing_metadata or ())
        raise Aborted

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[()]:
        return ()


def check_answer(ctx: Context, reply: object, out_type: type) -> None:
    """A handler answered a reply of its type, or a typed error's status (never INTERNAL), whose
    error code is one tidelog/errors.py maps to that status."""
    if ctx.status is None:
        assert isinstance(reply, out_type), reply
        return
    assert ctx.status != grpc.StatusCode.INTERNAL, ctx.details
    code = ctx.metadata.get(ERROR_CODE_KEY)
    assert code, f"{ctx.status} without a tidelog error code: {ctx.details}"
    assert by_code(code).status == ctx.status.name, (code, ctx.status)
