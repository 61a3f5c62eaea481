"""Ledger keys in the metadata store, size limits, the checks of caller input, and `LedgerEntry`.

Pure: everything here answers from its arguments. A parameter that can never be right is
IncorrectParameterError before anything is sent (docs/reference/bookkeeper-ledger.md §1.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from tidelog.errors import IncorrectParameterError, NoSuchLedgerExistsError
from tidelog.ledger.metadata import is_int
from tidelog.proto import ledger_pb2 as lpb

__all__ = [
    "COUNTER_KEY",
    "DEFAULT_ADD_TIMEOUT",
    "LEDGER_KEY_PREFIX",
    "MAX_ENTRY_BYTES",
    "MAX_LEDGER_ID",
    "LedgerEntry",
    "check_entry_data",
    "check_entry_range",
    "check_ledger_id_to_open",
    "check_password",
    "entry_of",
    "ledger_id_of_key",
    "ledger_key",
]

LEDGER_KEY_PREFIX = "ledger/"
COUNTER_KEY = "ledger-id-counter"  # value: decimal ASCII of the next ledger id
# One entry is one commit-log record on the broker, whose default cap (broker/config.py
# max_message_bytes) is 4 MiB including the record's own headers; the gRPC limit is 64 MiB.
MAX_ENTRY_BYTES = (4 << 20) - (64 << 10)
DEFAULT_ADD_TIMEOUT = 30.0
MAX_LEDGER_ID = 2**63 - 1


@dataclass(frozen=True)
class LedgerEntry:
    """One entry as read: its id, payload, the writer's LAC when it was sent, and the ledger's
    cumulative length through it."""

    entry_id: int
    data: bytes
    lac: int
    length: int


def ledger_key(ledger_id: int) -> str:
    """The metadata key of a ledger; zero-padded so that keys sort like ids."""
    return f"{LEDGER_KEY_PREFIX}{ledger_id:019d}"


def ledger_id_of_key(key: str) -> int | None:
    """The ledger id of a `ledger_key`, or None for any other key."""
    if not key.startswith(LEDGER_KEY_PREFIX):
        return None
    rest = key[len(LEDGER_KEY_PREFIX) :]
    return int(rest) if rest.isdigit() and rest.isascii() else None


def check_ledger_id_to_open(ledger_id: object) -> int:
    # docs/reference/bookkeeper-ledger.md §1.2: opening (or asking for the metadata of) a negative id is "no such ledger";
    # something that is not an id at all is a bad parameter
    if not is_int(ledger_id):
        raise IncorrectParameterError(f"a ledger id is an integer, got {ledger_id!r}")
    ledger_id = cast(int, ledger_id)  # is_int said so (its TypeGuard is not seen across packages)
    if not 0 <= ledger_id <= MAX_LEDGER_ID:
        raise NoSuchLedgerExistsError(
            f"no ledger {ledger_id} (ledger ids are never negative)", ledger_id=ledger_id
        )
    return ledger_id


def check_password(password: object) -> bytes:
    if not isinstance(password, bytes):
        raise IncorrectParameterError("a ledger password is bytes (empty is allowed)")
    return password


def check_entry_data(data: object, max_bytes: int = MAX_ENTRY_BYTES) -> bytes:
    """The entry payload as bytes, or IncorrectParameterError (not bytes, or larger than `max_bytes`)."""
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise IncorrectParameterError(f"entry data is bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise IncorrectParameterError(
            f"an entry holds at most {max_bytes} bytes, got {len(data)}", size=len(data), max_bytes=max_bytes
        )
    return data


def check_entry_range(first: object, last: object) -> tuple[int, int]:
    """(first, last) for a read, or IncorrectParameterError: ids are integers, 0 ≤ first ≤ last."""
    if not is_int(first) or not is_int(last):
        raise IncorrectParameterError(f"entry ids are integers, got first={first!r}, last={last!r}")
    first, last = cast(int, first), cast(int, last)  # as above
    if first < 0 or last < 0:
        raise IncorrectParameterError(f"entry ids are never negative, got first={first}, last={last}")
    if first > last:
        raise IncorrectParameterError(f"first ({first}) is after last ({last})")
    if last > MAX_LEDGER_ID:
        raise IncorrectParameterError(f"entry id {last} is out of range")
    return first, last


def entry_of(e: lpb.Entry) -> LedgerEntry:
    """A replica's entry as the caller sees it (its digest was checked by the reader)."""
    return LedgerEntry(int(e.entry_id), bytes(e.data), int(e.lac), int(e.length))
