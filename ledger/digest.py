"""Per-entry digests of ledger entries: computed by the writer, stored by replicas, checked by readers.

Theory of operation
-------------------
A digest covers the entry's identity and position as well as its payload: the ledger id (u64),
the entry id, the writer's LAC when it sent the entry and the ledger's cumulative length through
the entry (each i64), all big-endian, followed by the data. So a replica that hands back the
right bytes under the wrong entry id, or an entry of another ledger, fails the check just like a
flipped bit does (docs/reference/bookkeeper-ledger.md §2.1: BookKeeper's header carries the same four fields).

- CRC32C (the default; `commitlog/crc.py`, hardware-accelerated) and CRC32 (zlib) are 4 bytes,
  big-endian. They detect corruption, not tampering.
- MAC is HMAC-SHA256 (32 bytes) keyed by SHA-256(b"tidelog-ledger-mac\\0" + password): only a
  holder of the password can produce a valid entry.
- DUMMY is empty and checks nothing.

A failed check is DigestMatchError (−5). The readers in `ledger.client` treat it as "this replica
cannot serve this entry" and try another one; recovery counts it as an error, never as "no such
entry" (RULES.md R6).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib

from tidelog.commitlog.crc import crc32c
from tidelog.errors import DigestMatchError, IncorrectParameterError
from tidelog.ledger.metadata import DigestType

__all__ = ["DIGEST_SIZES", "Digester", "digest_input_header", "mac_key", "parse_digest_type"]

_HEADER = struct.Struct(">Qqqq")  # ledger id, entry id, lac, length

DIGEST_SIZES: dict[DigestType, int] = {
    DigestType.CRC32C: 4,
    DigestType.CRC32: 4,
    DigestType.MAC: 32,
    DigestType.DUMMY: 0,
}

_MAC_KEY_PREFIX = b"tidelog-ledger-mac\x00"


def parse_digest_type(digest: DigestType | str) -> DigestType:
    """`"crc32c"`, `"CRC32C"` or `DigestType.CRC32C` → DigestType.CRC32C; anything else is
    IncorrectParameterError. ("hmac" is accepted for MAC, the name BookKeeper's docs also use.)"""
    if isinstance(digest, DigestType):
        return digest
    if not isinstance(digest, str):
        raise IncorrectParameterError(f"a digest type is a string such as 'crc32c', got {digest!r}")
    name = digest.strip().upper()
    if name == "HMAC":
        name = "MAC"
    try:
        return DigestType(name)
    except ValueError:
        raise IncorrectParameterError(
            f"unknown digest type {digest!r}; use one of {', '.join(t.value.lower() for t in DigestType)}"
        ) from None


def mac_key(password: bytes) -> bytes:
    """The HMAC key for a ledger's MAC digests: derived from the password, never the password."""
    return hashlib.sha256(_MAC_KEY_PREFIX + password).digest()


def digest_input_header(ledger_id: int, entry_id: int, lac: int, length: int) -> bytes:
    """The 32 bytes that precede the data in the digest's input."""
    try:
        return _HEADER.pack(ledger_id, entry_id, lac, length)
    except struct.error as exc:
        raise IncorrectParameterError(
            f"ledger {ledger_id} entry {entry_id} lac {lac} length {length} out of range for a digest: {exc}"
        ) from None


class Digester:
    """Computes and checks the digests of one ledger's entries (one digest type, one password)."""

    def __init__(self, digest_type: DigestType | str, password: bytes = b"") -> None:
        self.digest_type = parse_digest_type(digest_type)
        self._key = mac_key(password) if self.digest_type is DigestType.MAC else b""

    @property
    def size(self) -> int:
        return DIGEST_SIZES[self.digest_type]

    def compute(self, ledger_id: int, entry_id: int, lac: int, length: int, data: bytes) -> bytes:
        header = digest_input_header(ledger_id, entry_id, lac, length)
        kind = self.digest_type
        if kind is DigestType.CRC32C:
            return crc32c(data, crc32c(header)).to_bytes(4, "big")
        if kind is DigestType.CRC32:
            return zlib.crc32(data, zlib.crc32(header)).to_bytes(4, "big")
        if kind is DigestType.MAC:
            mac = hmac.new(self._key, header, hashlib.sha256)
            mac.update(data)
            return mac.digest()
        return b""

    def matches(
        self, ledger_id: int, entry_id: int, lac: int, length: int, data: bytes, digest: bytes
    ) -> bool:
        try:
            expected = self.compute(ledger_id, entry_id, lac, length, data)
        except IncorrectParameterError:
            return False  # fields no writer could have produced
        return hmac.compare_digest(expected, digest)

    def verify(
        self, ledger_id: int, entry_id: int, lac: int, length: int, data: bytes, digest: bytes
    ) -> None:
        """Raise DigestMatchError unless `digest` is this entry's digest."""
        if not self.matches(ledger_id, entry_id, lac, length, data, digest):
            raise DigestMatchError(
                f"ledger {ledger_id} entry {entry_id} failed its {self.digest_type} digest check",
                ledger_id=ledger_id,
                entry_id=entry_id,
            )
