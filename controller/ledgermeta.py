"""Versioned metadata in the controller state (RULES.md §6): create, compare-and-set, delete,
and the ledger rules that guard every key under ``ledger/``.

Versioned metadata is opaque bytes, except under ``ledger/``: such a value must decode as ledger
metadata when it is created; a CAS of it must obey the ledger rules (``ledger.metadata.check_update``),
so no client can move a ledger backwards or change where a closed ledger ends; and a CAS or delete
must carry the hash of the ledger's password (``ledger_password_hash``, computed by the service
from the password the request carried), compared here with the hash the metadata stores, so only a
holder of the password can close, recover or delete a ledger. The comparison happens at apply
time against the value being replaced: no race with another write between a check and the
change, and the command holds only the hash, which the metadata value already shows.
"""

from __future__ import annotations

from tidelog.errors import TidelogError
from tidelog.ledger.metadata import LedgerMetadata, check_change_proof, check_update

from .commands import MetaCompareAndSet, MetaCreate, MetaDelete, Result
from .model import LEDGER_KEY_PREFIX, MetaEntry, StateData
from .validation import Outcome, Reject, bad, need_meta_key, need_nonneg


def check_ledger_update(key: str, old: bytes, new: bytes) -> None:
    """Ledger metadata moves only along the ledger rules (ledger/RULES.md M5–M7), whoever writes it.

    Both values are decoded here, so a client cannot move a ledger backwards (CLOSED → OPEN), change
    where a CLOSED ledger ends, or store a value that is not ledger metadata. The check is a pure
    function of the two values: ``apply`` stays deterministic.
    """
    try:
        before = LedgerMetadata.decode(old)
        after = LedgerMetadata.decode(new)
        check_update(before, after)
    except TidelogError as err:
        raise Reject(err.code, f"metadata {key}: {err.message}") from None


def check_ledger_proof(key: str, stored: bytes, presented_hash: bytes | None, what: str) -> None:
    """Only a holder of the ledger's password changes or deletes its metadata (ledger/RULES.md M8)."""
    try:
        before = LedgerMetadata.decode(stored)
    except TidelogError:
        # Not ledger metadata (stored before values under ledger/ were checked): nothing to
        # protect; a CAS of it is refused by the rules check, a delete may clean it up.
        return
    if presented_hash is not None and not isinstance(presented_hash, bytes):
        raise bad("ledger_password_hash must be bytes")
    try:
        check_change_proof(before, presented_hash, what=what)
    except TidelogError as err:
        raise Reject(err.code, f"metadata {key}: {err.message}") from None


def _check_ledger_create(key: str, value: bytes) -> None:
    try:
        LedgerMetadata.decode(value)
    except TidelogError as err:
        raise Reject(err.code, f"metadata {key}: {err.message}") from None


def _need_value(s: StateData, v: object) -> bytes:
    if not isinstance(v, (bytes, bytearray)):
        raise bad("metadata value must be bytes")
    if len(v) > s.max_meta_value_bytes:
        raise Reject(
            "METADATA_TOO_LARGE", f"metadata value of {len(v)} bytes exceeds {s.max_meta_value_bytes}"
        )
    return bytes(v)


def _current(s: StateData, key: str, expected_version: int | None) -> MetaEntry:
    """The entry a CAS or delete replaces, at the version it expects (None: any version)."""
    cur = s.metadata.get(key)
    if cur is None:
        raise Reject("METADATA_NOT_FOUND", f"no metadata {key}")
    if expected_version is not None and cur.version != expected_version:
        raise Reject(
            "METADATA_VERSION_MISMATCH",
            f"metadata {key} is at version {cur.version}, not {expected_version}",
            cur,
        )
    return cur


def meta_create(s: StateData, c: MetaCreate) -> Outcome:
    need_meta_key(c.key)
    value = _need_value(s, c.value)
    need_nonneg(c.now_ms, "now_ms")
    if c.key in s.metadata:
        raise Reject("METADATA_EXISTS", f"metadata {c.key} already exists", s.metadata[c.key])
    if c.key.startswith(LEDGER_KEY_PREFIX):
        _check_ledger_create(c.key, value)
    e = MetaEntry(key=c.key, value=value, version=1, modified_ms=c.now_ms)
    s.metadata[c.key] = e
    s.meta_changes.note(c.key)
    return Result(value=e, changed=True), None


def meta_cas(s: StateData, c: MetaCompareAndSet) -> Outcome:
    need_meta_key(c.key)
    value = _need_value(s, c.value)
    need_nonneg(c.expected_version, "expected_version")
    need_nonneg(c.now_ms, "now_ms")
    cur = _current(s, c.key, c.expected_version)
    if c.key.startswith(LEDGER_KEY_PREFIX):
        check_ledger_proof(c.key, cur.value, c.ledger_password_hash, "change")
        check_ledger_update(c.key, cur.value, value)
    e = MetaEntry(key=c.key, value=value, version=cur.version + 1, modified_ms=c.now_ms)
    s.metadata[c.key] = e
    s.meta_changes.note(c.key)
    return Result(value=e, changed=True), None


def meta_delete(s: StateData, c: MetaDelete) -> Outcome:
    need_meta_key(c.key)
    if c.expected_version is not None:
        need_nonneg(c.expected_version, "expected_version")
    need_nonneg(c.now_ms, "now_ms")
    cur = _current(s, c.key, c.expected_version)
    if c.key.startswith(LEDGER_KEY_PREFIX):
        check_ledger_proof(c.key, cur.value, c.ledger_password_hash, "delete")
    del s.metadata[c.key]
    s.meta_changes.note(c.key)
    return Result(changed=True), None
