"""A segmented log's names, positions and its one metadata record, with the record changes an
acquire and a roll make. Pure (no I/O); `SegmentedLogRecord`'s JSON is deterministic.

Ledger ids come from a counter and a ledger is only appended after reading a record that holds
every earlier one, so ids increase along the list; `SegmentedLogRecord` refuses a list that does
not, and positions order like the list.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from tidelog.errors import IncorrectParameterError, SegmentedLogOwnershipLostError, TidelogError
from tidelog.ledger.metadata import is_int

__all__ = [
    "KEY_PREFIX",
    "RECORD_FORMAT",
    "START",
    "LogEntry",
    "Position",
    "SegmentedLogRecord",
    "acquired_record",
    "cas_applied",
    "check_log_name",
    "check_position",
    "record_key",
    "rolled_record",
]

KEY_PREFIX = "seglog/"
RECORD_FORMAT = 1  # the JSON layout of SegmentedLogRecord; bump it (and keep reading the old one) on change

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_log_name(name: str) -> str:
    """A log name is 1–200 characters of letters, digits, '.', '_' and '-', starting with a letter or digit."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise IncorrectParameterError(
            f"a segmented log name is 1-200 characters of letters, digits, '.', '_' and '-', starting "
            f"with a letter or digit; got {name!r}"
        )
    return name


def record_key(name: str) -> str:
    """The metadata store key of log `name`'s record."""
    return KEY_PREFIX + check_log_name(name)


# --- positions -----------------------------------------------------------------------------


class Position(NamedTuple):
    """Where an entry of a segmented log is: its ledger and its entry id in that ledger.

    Positions order like the log (ledger ids increase along the list). `Position(0, 0)` is before
    every entry; `Position(l, e + 1)` right after entry e of ledger l, which is what a reader passes
    on to continue.
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """'LEDGER:ENTRY' (as `str` prints it) → Position; anything else is IncorrectParameterError."""
        parts = text.split(":") if isinstance(text, str) else []
        try:
            if len(parts) != 2:
                raise ValueError
            ledger_id, entry_id = int(parts[0]), int(parts[1])
        except ValueError:
            raise IncorrectParameterError(f"a position is LEDGER_ID:ENTRY_ID, got {text!r}") from None
        return check_position(cls(ledger_id, entry_id))


START = Position(0, 0)


def check_position(position: Any) -> Position:
    if (
        not isinstance(position, tuple)
        or len(position) != 2
        or not all(is_int(v) for v in position)
        or position[0] < 0
        or position[1] < 0
    ):
        raise IncorrectParameterError(f"a position is (ledger id ≥ 0, entry id ≥ 0), got {position!r}")
    return Position(*position)


class LogEntry(NamedTuple):
    position: Position
    data: bytes


# --- the record ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentedLogRecord:
    """The one metadata record of a segmented log: its ledgers in order, and who owns it."""

    name: str
    ledgers: tuple[int, ...] = ()
    owner: str = ""  # the token of the owner that last acquired the log ("" = never)
    generation: int = 0  # bumped by every acquire; a roll keeps it
    format_version: int = RECORD_FORMAT
    version: int = field(default=0, compare=False)  # the store's CAS version, not part of the value

    def __post_init__(self) -> None:
        object.__setattr__(self, "ledgers", tuple(self.ledgers))
        check_log_name(self.name)
        if self.format_version != RECORD_FORMAT:
            raise IncorrectParameterError(f"unknown segmented log record format {self.format_version!r}")
        if not all(is_int(lid) and lid >= 0 for lid in self.ledgers):
            raise IncorrectParameterError(f"ledger ids are non-negative integers, got {list(self.ledgers)}")
        if any(b <= a for a, b in zip(self.ledgers, self.ledgers[1:], strict=False)):
            raise IncorrectParameterError(
                f"the ledgers of a segmented log strictly increase, got {list(self.ledgers)}"
            )
        if not isinstance(self.owner, str):
            raise IncorrectParameterError(f"owner must be a string, got {self.owner!r}")
        if not is_int(self.generation) or self.generation < 0:
            raise IncorrectParameterError(
                f"generation must be a non-negative integer, got {self.generation!r}"
            )

    @property
    def key(self) -> str:
        return record_key(self.name)

    @property
    def last_ledger(self) -> int | None:
        return self.ledgers[-1] if self.ledgers else None

    def encode(self) -> bytes:
        """Deterministic JSON (sorted keys, compact); equal records, equal bytes."""
        doc = {
            "format": self.format_version,
            "name": self.name,
            "ledgers": list(self.ledgers),
            "owner": self.owner,
            "generation": self.generation,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, *, version: int = 0) -> SegmentedLogRecord:
        try:
            doc = json.loads(bytes(data).decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc["format"] != RECORD_FORMAT:
                raise IncorrectParameterError(f"unknown segmented log record format {doc['format']!r}")
            if not isinstance(doc["ledgers"], list):
                raise ValueError("ledgers is not a list")
            return cls(
                name=doc["name"],
                ledgers=tuple(doc["ledgers"]),
                owner=doc["owner"],
                generation=doc["generation"],
                format_version=doc["format"],
                version=version,
            )
        except TidelogError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise IncorrectParameterError(f"undecodable segmented log record: {exc}") from exc


def acquired_record(
    current: SegmentedLogRecord | None, name: str, new_ledger: int, owner: str
) -> SegmentedLogRecord:
    """The record an acquire CASes: `new_ledger` appended, `owner` named, the generation bumped.

    `current` is None when the log does not exist yet (the acquire creates it). The result keeps
    `current.version`: the CAS expects it and the store assigns the next.
    """
    if current is None:
        return SegmentedLogRecord(name=name, ledgers=(new_ledger,), owner=owner, generation=1)
    if current.name != name:
        raise IncorrectParameterError(f"record of log {current.name!r} read for log {name!r}")
    return replace(
        current, ledgers=current.ledgers + (new_ledger,), owner=owner, generation=current.generation + 1
    )


def rolled_record(
    current: SegmentedLogRecord, new_ledger: int, owner: str, generation: int
) -> SegmentedLogRecord:
    """The record a roll CASes: `new_ledger` appended by the owner that holds `generation`.

    If the record names another owner or generation, ownership was taken over in between:
    SegmentedLogOwnershipLostError (the caller must not append to the new ledger).
    """
    if (current.owner, current.generation) != (owner, generation):
        raise SegmentedLogOwnershipLostError(
            f"segmented log {current.name!r} is now owned by generation {current.generation} "
            f"({current.owner or 'nobody'}), not by this owner's generation {generation}",
            owner=current.owner,
            generation=current.generation,
        )
    return replace(current, ledgers=current.ledgers + (new_ledger,))


def cas_applied(after: SegmentedLogRecord | None, intended: SegmentedLogRecord) -> bool:
    """After a CAS whose answer was a version mismatch (or lost), whether it was applied anyway.

    The controller client retries a write whose answer was lost, and the retry then finds its own
    write in place. The owner token, generation and last ledger identify our write exactly: no
    other writer can produce that triple (nobody else holds our token; the ledger is ours).
    """
    return (
        after is not None
        and after.owner == intended.owner
        and after.generation == intended.generation
        and after.last_ledger == intended.last_ledger
    )
