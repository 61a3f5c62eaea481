"""How a command handler refuses: ``Reject`` and the input checks every handler shares (RULES.md V0).

A handler validates completely before it mutates anything (V1): each check raises ``Reject`` on
the first failure, and ``ControllerState.apply`` turns that into a non-OK ``Result``.
"""

from __future__ import annotations

from typing import TypeGuard

from .commands import Result
from .model import MAX_ADDRESS_CHARS, MAX_META_KEY_CHARS, NAME_PATTERN

#: What a handler answers: the result, and the broker-set event it performed (None: no change of
#: phase to check against the transition table in ``phases.py``).
Outcome = tuple[Result, str | None]


class Reject(Exception):
    """A refused command: its ``tidelog.errors`` code, message and the value the reply carries."""

    def __init__(self, code: str, message: str, value: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.value = value


def bad(message: str) -> Reject:
    return Reject("INVALID_ARGUMENT", message)


def is_int(v: object) -> TypeGuard[int]:
    return type(v) is int  # bool is an int subclass and never a valid id, epoch or offset


def need_nonneg(v: object, what: str) -> None:
    if not is_int(v) or v < 0:
        raise bad(f"{what} must be a non-negative integer, got {v!r}")


def need_name(v: object, what: str) -> None:
    if not isinstance(v, str) or not NAME_PATTERN.match(v):
        raise bad(f"{what} must match {NAME_PATTERN.pattern}, got {v!r}")


def need_address(v: object, what: str) -> None:
    ok = False
    if isinstance(v, str) and 0 < len(v) <= MAX_ADDRESS_CHARS and v.isprintable() and " " not in v:
        host, sep, port = v.rpartition(":")
        ok = bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
    if not ok:
        raise bad(f"{what} must be 'host:port' with a port in 1..65535, got {v!r}")


def need_ids(v: object, what: str) -> frozenset[int]:
    if not isinstance(v, (set, frozenset)) or not all(is_int(i) and i >= 0 for i in v):
        raise bad(f"{what} must be a set of non-negative broker ids, got {v!r}")
    return frozenset(v)


def need_meta_key(v: object) -> None:
    if not isinstance(v, str) or not 0 < len(v) <= MAX_META_KEY_CHARS or not v.isprintable():
        raise bad(f"metadata key must be 1..{MAX_META_KEY_CHARS} printable characters, got {v!r}")
