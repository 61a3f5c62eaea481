"""Inputs the fuzzers found that broke a contract, kept as explicit cases (each was a bug, fixed
in the product code; the comment says what it did before the fix)."""

from __future__ import annotations

import json
import struct

import pytest
from crc32c import crc32c

from tests.fuzz.test_records import check_records
from tests.fuzz.test_recovery import _epoch_check, _recovery_check

# A record with a valid CRC: size 65, topic length 1, every other field zero, then the topic.
_HEAD = bytes.fromhex("000000417de10601")

RECORDS = [
    # check_at called it VALID, decode raised UnicodeDecodeError (topic b"\x80")
    pytest.param(_HEAD + bytes.fromhex("9973f61600000001") + b"\0" * 48 + b"\x80", id="topic-not-utf8"),
    # properties b"\x00\x00" cut short: decode raised struct.error
    pytest.param(
        b"\x00\x00\x00C}\xe1\x06\x01\xfa\x1d\xcd\x1c\x00\x00\x00\x01"
        + b"\0" * 43
        + b"\x02\x00\x00\x00\x000\x00\x00",
        id="properties-cut-short",
    ),
    pytest.param(
        b"\x00\x00\x00B}\xe1\x06\x01\xb7\x95\xc4\x92\x00\x00\x00\x01"
        + b"\0" * 43
        + b"\x01\x00\x00\x00\x000\x00",
        id="property-name-length-cut-short",
    ),
]


@pytest.mark.parametrize("data", RECORDS)
def test_record_decoders(data: bytes) -> None:
    check_records(data)


def _epochs(entries: object, crc: int | None = None) -> bytes:
    doc = {"version": 1, "entries": entries, "crc": crc}
    return json.dumps(doc).encode()


EPOCH_FILES = [
    # json.loads takes Infinity; int() of it raised OverflowError out of the reader
    pytest.param(_epochs([[float("inf"), 0]]), id="infinity"),
    # entries out of the file's own order, with a matching CRC, were accepted
    pytest.param(_epochs([[0, 0], [0, 0]], crc32c(b"0-0;0-0")), id="epoch-repeated"),
    pytest.param(_epochs([[2, 0], [1, 5]], crc32c(b"2-0;1-5")), id="epoch-going-back"),
    pytest.param(_epochs([[1, 9], [2, 5]], crc32c(b"1-9;2-5")), id="start-going-back"),
    pytest.param(_epochs([[-1, 0]], crc32c(b"-1-0")), id="negative-epoch"),
    # a float or a bool in place of an integer was converted silently
    pytest.param(_epochs([[1.0, 0]], crc32c(b"1-0")), id="float"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="nested-past-the-parser"),
]


@pytest.mark.parametrize("data", EPOCH_FILES)
def test_epoch_file_reader(data: bytes) -> None:
    with _epoch_check() as check:
        check(data)


LOGS = [
    # a CRC-valid record of topic ":" (no topic name): recovery raised INVALID_ARGUMENT from
    # the consume queue instead of naming the file and offset
    pytest.param(
        struct.pack(">qqq", 0, 0, 0) + _HEAD + bytes.fromhex("4084ace700000001") + b"\0" * 48 + b":",
        id="topic-not-a-name",
    ),
    # the same below the flushed offset: corruption, named
    pytest.param(
        struct.pack(">qqq", 65, 0, 0) + _HEAD + bytes.fromhex("4084ace700000001") + b"\0" * 48 + b":",
        id="topic-not-a-name-flushed",
    ),
    pytest.param(
        struct.pack(">qqq", 65, 0, 0) + _HEAD + bytes.fromhex("9973f61600000001") + b"\0" * 48 + b"\x80",
        id="topic-not-utf8-flushed",
    ),
]


@pytest.mark.parametrize("data", LOGS)
def test_recovery(data: bytes) -> None:
    with _recovery_check() as check:
        check(data)
