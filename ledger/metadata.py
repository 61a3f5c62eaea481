"""Ledger metadata: the record, its JSON encoding, creation checks and the state table. Pure.

Theory of operation
-------------------
A ledger's metadata is controller state, written only by compare-and-set (CAS) on its version
(docs/reference/bookkeeper-ledger.md §1.3). Everything that decides what a metadata write may do lives in this file; the
code that performs the CAS does not know the rules, and this file does not know who performs it.

- `LedgerMetadata` is a frozen record, validated on construction, so an invalid record cannot
  exist in memory: E ≥ WQ ≥ AQ ≥ 1, and tidelog's own rule E == WQ (a ledger's ensemble is its
  broker set's replicas and every entry goes to all of them); ensembles keyed by first entry id,
  strictly increasing from 0, each of exactly E distinct replicas; `last_entry_id`/`length` are
  −1/0 unless the ledger is CLOSED (rules M1–M4 in RULES.md).
- `encode`/`decode` give a versioned, deterministic JSON form: sorted keys, no whitespace,
  bytes as base64. The CAS `version` is *not* encoded: the controller's store owns it and hands
  it back with the value, so a writer never has to predict the version its write will get.
- `check_create_params` answers a create request the way BookKeeper's builder does
  (IncorrectParameter for a request that can never succeed, NotEnoughBookies for one that may
  succeed once replicas come back), plus tidelog's E == WQ == replicas of the broker set.
- `TRANSITIONS` is the state table, (state, event) → outcome, and `decide_transition` /
  `apply_transition` are the only way to move along it. States only move forward:
  OPEN → IN_RECOVERY → CLOSED, or OPEN → CLOSED by the writer. CLOSED is final (BookKeeper's
  `forceRecovery`, the one way back, is not offered).
- `check_update(old, new)` is the controller's side of the same rules: it refuses any metadata
  CAS that would move the state backwards, change what never changes, or rewrite ensemble
  history (rules M5–M7), whoever sent it.
- `check_change_proof(stored, presented_hash)` is who may write at all (rule M8): every CAS
  and delete of a ledger's metadata must present the ledger's password. The controller hashes
  the password the request carries (`hash_password`) and compares it with the hash stored at
  creation. This is BookKeeper's check (its client compares the password digest against the
  metadata) moved to the metadata's owner, so a client that skips it is refused all the same.
  Why the password itself and not a signature of the change: the stored hash is readable by
  anyone (MetaGet), so it cannot be the proof, and the controller holds nothing secret per
  ledger to check an HMAC with; every broker call already carries the password the same way.
  Only the hash enters the controller's replicated log, never the password.

Where we follow BookKeeper's protocol document and TLA+ spec rather than its code (RULES.md §D):
a writer's close over IN_RECOVERY fails with LedgerFencedError instead of overwriting the
recovery, and a writer's close over a ledger CLOSED with other values fails with
MetadataVersionError.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard, cast

from tidelog.errors import (
    IllegalOpError,
    IncorrectParameterError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    TidelogError,
    UnauthorizedAccessError,
)
from tidelog.invariants import require

__all__ = [
    "FORMAT_VERSION",
    "TRANSITIONS",
    "DigestType",
    "LedgerEvent",
    "LedgerMetadata",
    "LedgerState",
    "Outcome",
    "STATE_CHANGES",
    "apply_transition",
    "check_change_proof",
    "check_create_params",
    "check_update",
    "decide_transition",
    "hash_password",
    "is_int",
    "new_ledger_metadata",
]

FORMAT_VERSION = 1  # the JSON layout below; bump it (and keep reading the old one) on any change


class LedgerState(enum.StrEnum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class DigestType(enum.StrEnum):
    CRC32 = "CRC32"
    CRC32C = "CRC32C"
    MAC = "MAC"
    DUMMY = "DUMMY"


def hash_password(password: bytes) -> bytes:
    """What the metadata keeps of a ledger password: its SHA-256, never the password itself."""
    return hashlib.sha256(b"tidelog-ledger-password\x00" + password).digest()


def is_int(value: Any) -> TypeGuard[int]:
    """Whether `value` is an integer; bool is an int in Python, but `ack_quorum=True` is a bug, not 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(message: str, **details: Any) -> IncorrectParameterError:
    return IncorrectParameterError(message, **details)


@dataclass(frozen=True)
class LedgerMetadata:
    """One ledger's metadata. Construct it only with valid values; `__post_init__` refuses others."""

    ledger_id: int
    broker_set: str
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    # first entry id → the replicas (broker ids) holding entries from there on; a floor lookup
    # finds an entry's ensemble (docs/reference/bookkeeper-ledger.md §1.3)
    ensembles: tuple[tuple[int, tuple[int, ...]], ...]
    digest_type: DigestType = DigestType.CRC32C
    password_hash: bytes = b""
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    custom_metadata: tuple[tuple[str, bytes], ...] = ()
    ctime_ms: int = -1
    format_version: int = FORMAT_VERSION
    version: int = field(default=0, compare=False)  # the store's CAS version, not part of the value

    def __post_init__(self) -> None:
        # normalise containers so equal metadata compares and encodes equal, whatever was passed
        object.__setattr__(
            self, "ensembles", tuple((int(first), tuple(members)) for first, members in self.ensembles)
        )
        custom = self.custom_metadata
        pairs = custom.items() if isinstance(custom, Mapping) else custom
        object.__setattr__(self, "custom_metadata", tuple(sorted((str(k), bytes(v)) for k, v in pairs)))
        object.__setattr__(self, "state", LedgerState(self.state))
        object.__setattr__(self, "digest_type", DigestType(self.digest_type))
        self._validate()

    def _validate(self) -> None:
        self._validate_fields()
        _check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if self.format_version != FORMAT_VERSION:
            raise _bad(f"unknown ledger metadata format version {self.format_version}")
        self._validate_ensembles()
        self._validate_end()
        if not isinstance(self.password_hash, bytes):
            raise _bad("password_hash must be bytes")

    def _validate_fields(self) -> None:
        for name in (
            "ledger_id",
            "ensemble_size",
            "write_quorum",
            "ack_quorum",
            "last_entry_id",
            "length",
            "ctime_ms",
            "format_version",
            "version",
        ):
            if not is_int(getattr(self, name)):
                raise _bad(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.ledger_id < 0:
            raise _bad(f"ledger_id must not be negative, got {self.ledger_id}")
        if not self.broker_set:
            raise _bad("a ledger lives in a broker set; broker_set is empty")

    def _validate_ensembles(self) -> None:
        # M2: at least one ensemble, keys strictly increasing from 0, each of E distinct replicas
        if not self.ensembles:
            raise _bad("a ledger has at least one ensemble")
        if self.ensembles[0][0] != 0:
            raise _bad(f"the first ensemble starts at entry 0, not {self.ensembles[0][0]}")
        previous = -1
        for first, members in self.ensembles:
            if first <= previous:
                raise _bad(f"ensemble keys must strictly increase: {first} after {previous}")
            previous = first
            if len(members) != self.ensemble_size or len(set(members)) != len(members):
                raise _bad(
                    f"the ensemble at {first} must have {self.ensemble_size} distinct replicas, "
                    f"got {list(members)}"
                )
            if not all(is_int(m) and m >= 0 for m in members):
                raise _bad(f"replicas are broker ids (non-negative integers), got {list(members)}")

    def _validate_end(self) -> None:
        # M3: last entry id and length describe the end only once the ledger is CLOSED
        if self.state is LedgerState.CLOSED:
            if self.last_entry_id < -1 or self.length < 0:
                raise _bad(
                    f"a CLOSED ledger ends at an entry id ≥ -1 with a length ≥ 0, got "
                    f"{self.last_entry_id}/{self.length}"
                )
            if self.last_entry_id == -1 and self.length != 0:
                raise _bad("an empty CLOSED ledger has length 0")
        elif self.last_entry_id != -1 or self.length != 0:
            raise _bad(
                f"a {self.state} ledger has no last entry id or length yet (-1/0), got "
                f"{self.last_entry_id}/{self.length}"
            )

    # --- lookups -----------------------------------------------------------------------------

    @property
    def replicas(self) -> tuple[int, ...]:
        """The current (last) ensemble: the replicas new entries and recovery go to."""
        return self.ensembles[-1][1]

    @property
    def last_ensemble_first_entry(self) -> int:
        return self.ensembles[-1][0]

    def ensemble_for(self, entry_id: int) -> tuple[int, ...]:
        """The ensemble holding `entry_id`: the one with the greatest first entry id ≤ it."""
        if not is_int(entry_id) or entry_id < 0:
            raise _bad(f"entry ids are non-negative integers, got {entry_id!r}")
        chosen = self.ensembles[0][1]
        for first, members in self.ensembles:
            if first > entry_id:
                break
            chosen = members
        return chosen

    def with_replicas_replaced(self, replacements: Mapping[int, int]) -> LedgerMetadata:
        """The same ledger with broker ``old`` replaced by ``new`` in every ensemble, for each
        pair (re-replication after a replica was replaced: every replica of the set holds the
        whole log, so the new one holds these entries once it is in sync). A pair whose new id is
        already in an ensemble leaves that ensemble unchanged (replicas stay distinct, M2)."""
        ensembles = []
        for first, members in self.ensembles:
            out: list[int] = []
            for m in members:  # one substitution per member: pairs never chain (a→b, b→c)
                new = replacements.get(m)
                out.append(new if new is not None and new not in members and new not in out else m)
            ensembles.append((first, tuple(out)))
        return dataclasses.replace(self, ensembles=tuple(ensembles))

    def custom(self) -> dict[str, bytes]:
        return dict(self.custom_metadata)

    def check_password(self, password: bytes) -> bool:
        return hash_password(password) == self.password_hash

    # --- encoding ----------------------------------------------------------------------------

    def encode(self) -> bytes:
        """Deterministic JSON (sorted keys, compact, bytes as base64); equal records, equal bytes."""
        doc = {
            "format": self.format_version,
            "ledger_id": self.ledger_id,
            "broker_set": self.broker_set,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "ensembles": [[first, list(members)] for first, members in self.ensembles],
            "digest_type": self.digest_type.value,
            "password_hash": base64.b64encode(self.password_hash).decode("ascii"),
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "custom_metadata": {k: base64.b64encode(v).decode("ascii") for k, v in self.custom_metadata},
            "ctime_ms": self.ctime_ms,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, *, version: int = 0) -> LedgerMetadata:
        """Parse `encode`'s output; `version` is the store's CAS version of the value."""
        try:
            doc = json.loads(data.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            fmt = doc["format"]
            if fmt != FORMAT_VERSION:
                raise _bad(f"unknown ledger metadata format version {fmt!r}")
            return cls(
                ledger_id=doc["ledger_id"],
                broker_set=doc["broker_set"],
                ensemble_size=doc["ensemble_size"],
                write_quorum=doc["write_quorum"],
                ack_quorum=doc["ack_quorum"],
                ensembles=tuple((first, tuple(members)) for first, members in doc["ensembles"]),
                digest_type=DigestType(doc["digest_type"]),
                password_hash=base64.b64decode(doc["password_hash"], validate=True),
                state=LedgerState(doc["state"]),
                last_entry_id=doc["last_entry_id"],
                length=doc["length"],
                custom_metadata=tuple(
                    (k, base64.b64decode(v, validate=True)) for k, v in doc["custom_metadata"].items()
                ),
                ctime_ms=doc["ctime_ms"],
                format_version=fmt,
                version=version,
            )
        except TidelogError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # binascii.Error and JSONDecodeError are ValueErrors
            raise _bad(f"undecodable ledger metadata: {exc}") from exc


# --- creation -----------------------------------------------------------------------------


def _check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    # docs/reference/bookkeeper-ledger.md §1.2: E=0, WQ=0, AQ≤0, WQ>E, AQ>WQ are IncorrectParameter; BookKeeper's old API
    # throws IllegalArgumentException for WQ<AQ, we answer the typed error for both APIs
    for name, value in (
        ("ensemble_size", ensemble_size),
        ("write_quorum", write_quorum),
        ("ack_quorum", ack_quorum),
    ):
        if not is_int(value) or value <= 0:
            raise _bad(f"{name} must be a positive integer, got {value!r}")
    if write_quorum > ensemble_size:
        raise _bad(f"write_quorum ({write_quorum}) must not exceed ensemble_size ({ensemble_size})")
    if ack_quorum > write_quorum:
        raise _bad(f"ack_quorum ({ack_quorum}) must not exceed write_quorum ({write_quorum})")
    if ensemble_size != write_quorum:
        raise _bad(
            f"tidelog requires ensemble_size == write_quorum (every entry goes to every replica of "
            f"the broker set), got E={ensemble_size}, WQ={write_quorum}"
        )


def check_create_params(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    available_replicas: int,
    *,
    set_replicas: int,
    password: bytes | None,
    digest_type: DigestType | str | None = DigestType.CRC32C,
    custom_metadata: Mapping[str, bytes] | None = None,
) -> None:
    """Refuse a create request that breaks the reference's parameter rules (rules C1–C4).

    `set_replicas` is how many replicas the broker set has; `available_replicas` how many of them
    can take writes now. A request that can never succeed is IncorrectParameterError (also when
    E or WQ differs from `set_replicas`: tidelog's ensemble *is* the broker set); one that may
    succeed once replicas return is NotEnoughBookiesError (retryable).
    """
    _check_quorums(ensemble_size, write_quorum, ack_quorum)
    # §1.2: the password has no default; None is IncorrectParameter (b"" is a valid password)
    if password is None or not isinstance(password, bytes):
        raise _bad("a ledger needs a password (bytes; empty is allowed)")
    if digest_type is None:
        raise _bad("a ledger needs a digest type")
    try:
        DigestType(digest_type)
    except ValueError:
        raise _bad(f"unknown digest type {digest_type!r}") from None
    if custom_metadata is None:
        raise _bad("custom_metadata must be a mapping (use {} for none)")
    if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in custom_metadata.items()):
        raise _bad("custom_metadata maps strings to bytes")
    if not is_int(set_replicas) or set_replicas <= 0:
        raise _bad(f"set_replicas must be a positive integer, got {set_replicas!r}")
    if ensemble_size != set_replicas:
        raise _bad(
            f"tidelog requires ensemble_size == write_quorum == the number of replicas of the broker "
            f"set ({set_replicas}), got E=WQ={ensemble_size}",
            set_replicas=set_replicas,
        )
    if not is_int(available_replicas) or available_replicas < 0:
        raise _bad(f"available_replicas must be a non-negative integer, got {available_replicas!r}")
    if available_replicas < ensemble_size:
        raise NotEnoughBookiesError(
            f"the ledger needs {ensemble_size} replicas, {available_replicas} of the broker set's "
            f"{set_replicas} are available",
            available=available_replicas,
            needed=ensemble_size,
        )


# --- the state table ----------------------------------------------------------------------


class LedgerEvent(enum.StrEnum):
    WRITER_CLOSE = "WRITER_CLOSE"  # the writer seals its ledger at its LAC
    RECOVERY_OPEN = "RECOVERY_OPEN"  # another client starts recovery
    RECOVERY_CLOSE = "RECOVERY_CLOSE"  # the recoverer seals at the last recoverable entry


class Outcome(enum.StrEnum):
    APPLY = "APPLY"  # write the new state by CAS
    NOOP = "NOOP"  # nothing to write; the caller adopts the current metadata
    SAME_END = "SAME_END"  # a CLOSED ledger: no-op if it ends where the caller would close it, else an error


# (state, event) → the state to write, an Outcome, or the error the caller gets. A pair that is
# missing is a violation (IllegalOpError): states never move backwards.
TRANSITIONS: dict[tuple[LedgerState, LedgerEvent], LedgerState | Outcome | type[TidelogError]] = {
    (LedgerState.OPEN, LedgerEvent.WRITER_CLOSE): LedgerState.CLOSED,
    # T4: protocol.md / TLA+ ClientClosesLedgerFail; BookKeeper's code overwrites the recovery
    (LedgerState.IN_RECOVERY, LedgerEvent.WRITER_CLOSE): LedgerFencedError,
    (LedgerState.CLOSED, LedgerEvent.WRITER_CLOSE): Outcome.SAME_END,
    (LedgerState.OPEN, LedgerEvent.RECOVERY_OPEN): LedgerState.IN_RECOVERY,
    # T2: a second (or retried) recovery continues without another CAS; concurrent recoveries converge
    (LedgerState.IN_RECOVERY, LedgerEvent.RECOVERY_OPEN): Outcome.NOOP,
    # T3: recovery of a CLOSED ledger does nothing and fences nothing
    (LedgerState.CLOSED, LedgerEvent.RECOVERY_OPEN): Outcome.NOOP,
    (LedgerState.IN_RECOVERY, LedgerEvent.RECOVERY_CLOSE): LedgerState.CLOSED,
    # T5: another recoverer (or nobody else: CLOSED is final) closed first; adopt its end
    (LedgerState.CLOSED, LedgerEvent.RECOVERY_CLOSE): Outcome.NOOP,
}


def decide_transition(state: LedgerState, event: LedgerEvent) -> LedgerState | Outcome:
    """Look `(state, event)` up in TRANSITIONS; raise the table's error, or IllegalOpError if absent."""
    try:
        result = TRANSITIONS[(LedgerState(state), LedgerEvent(event))]
    except KeyError:
        raise IllegalOpError(
            f"{event} is not allowed on a {state} ledger (states only move forward)",
            state=str(state),
            event=str(event),
        ) from None
    if isinstance(result, type):
        if result is LedgerFencedError:
            raise LedgerFencedError(
                "the ledger is being recovered by another client; the writer's close fails",
                state=str(state),
                event=str(event),
            )
        raise result(f"{event} on a {state} ledger", state=str(state), event=str(event))
    return result


def apply_transition(
    meta: LedgerMetadata, event: LedgerEvent, *, last_entry_id: int = -1, length: int = 0
) -> LedgerMetadata | None:
    """The metadata to CAS for `event`, or None when nothing must be written (adopt `meta`).

    Closing events pass the end (`last_entry_id`, `length`). The result keeps `meta.version`:
    the CAS expects that version and the store assigns the next one.
    """
    decision = decide_transition(meta.state, event)
    if decision is Outcome.NOOP:
        return None
    if decision is Outcome.SAME_END:
        # the writer's own close, retried after a lost answer, looks exactly like this: harmless
        if (meta.last_entry_id, meta.length) == (last_entry_id, length):
            return None
        raise MetadataVersionError(
            f"the ledger was closed by someone else at {meta.last_entry_id} (length {meta.length}), "
            f"not at {last_entry_id} (length {length})",
            last_entry_id=meta.last_entry_id,
            length=meta.length,
        )
    require(isinstance(decision, LedgerState), f"a close decision must be a ledger state, not {decision!r}")
    if decision is LedgerState.CLOSED:
        return replace(meta, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)
    return replace(meta, state=cast(LedgerState, decision))  # checked just above


# Which state a CAS may write over which, whoever writes it (the controller checks every ledger
# metadata CAS with `check_update`, so a buggy or hostile client cannot move a ledger backwards).
STATE_CHANGES: frozenset[tuple[LedgerState, LedgerState]] = frozenset(
    {
        (LedgerState.OPEN, LedgerState.OPEN),  # ensemble change while writing
        (LedgerState.OPEN, LedgerState.IN_RECOVERY),
        (LedgerState.OPEN, LedgerState.CLOSED),
        (LedgerState.IN_RECOVERY, LedgerState.IN_RECOVERY),  # nothing but ensembles may change
        (LedgerState.IN_RECOVERY, LedgerState.CLOSED),
        (LedgerState.CLOSED, LedgerState.CLOSED),  # re-replication swaps replicas only
    }
)

_IMMUTABLE = (
    "ledger_id",
    "broker_set",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "digest_type",
    "password_hash",
    "custom_metadata",
    "ctime_ms",
)


def check_update(old: LedgerMetadata, new: LedgerMetadata) -> None:
    """Refuse a metadata write of `new` over `old` that breaks rules M5–M7 (IllegalOpError).

    M5: the state moves along STATE_CHANGES only. M6: identity, quorums, digest, password,
    custom metadata and creation time never change; a CLOSED ledger's end never changes.
    M7: ensembles keep every existing key (the replicas at a key may be replaced); a new key
    comes after the last one, and a CLOSED ledger gets no new key.
    """
    if (old.state, new.state) not in STATE_CHANGES:
        raise IllegalOpError(
            f"ledger {old.ledger_id}: {old.state} may not become {new.state}",
            old_state=str(old.state),
            new_state=str(new.state),
        )
    for name in _IMMUTABLE:
        if getattr(old, name) != getattr(new, name):
            raise IllegalOpError(f"ledger {old.ledger_id}: {name} never changes", field=name)
    if old.state is LedgerState.CLOSED and (old.last_entry_id, old.length) != (new.last_entry_id, new.length):
        raise IllegalOpError(
            f"ledger {old.ledger_id} is CLOSED at {old.last_entry_id}; its end never changes"
        )
    old_keys = [first for first, _ in old.ensembles]
    new_keys = [first for first, _ in new.ensembles]
    if new_keys[: len(old_keys)] != old_keys:
        raise IllegalOpError(
            f"ledger {old.ledger_id}: ensembles may only be replaced at existing keys or "
            f"appended after the last one ({old_keys} → {new_keys})"
        )
    if old.state is LedgerState.CLOSED and len(new_keys) != len(old_keys):
        raise IllegalOpError(f"ledger {old.ledger_id} is CLOSED: no new ensemble")


def check_change_proof(stored: LedgerMetadata, presented_hash: bytes | None, *, what: str = "change") -> None:
    """Refuse a metadata CAS or delete (`what`) of `stored` unless `presented_hash` — the
    `hash_password` of the password the request carried — is the ledger's (rule M8)."""
    if presented_hash is None:
        raise UnauthorizedAccessError(
            f"ledger {stored.ledger_id}: a metadata {what} needs the ledger's password",
            ledger_id=stored.ledger_id,
            hint="send the ledger's password with the request (ledger_password)",
        )
    if not hmac.compare_digest(presented_hash, stored.password_hash):
        raise UnauthorizedAccessError(
            f"ledger {stored.ledger_id}: wrong password for a metadata {what}", ledger_id=stored.ledger_id
        )


def new_ledger_metadata(
    ledger_id: int,
    broker_set: str,
    replicas: Sequence[int],
    ack_quorum: int,
    *,
    password: bytes,
    digest_type: DigestType | str = DigestType.CRC32C,
    custom_metadata: Mapping[str, bytes] | None = None,
    ctime_ms: int = -1,
) -> LedgerMetadata:
    """A fresh OPEN ledger on `replicas` (the broker set's members), E = WQ = len(replicas)."""
    n = len(replicas)
    check_create_params(
        n,
        n,
        ack_quorum,
        n,
        set_replicas=n,
        password=password,
        digest_type=digest_type,
        custom_metadata={} if custom_metadata is None else custom_metadata,
    )
    return LedgerMetadata(
        ledger_id=ledger_id,
        broker_set=broker_set,
        ensemble_size=n,
        write_quorum=n,
        ack_quorum=ack_quorum,
        ensembles=((0, tuple(replicas)),),
        digest_type=DigestType(digest_type),
        password_hash=hash_password(password),
        custom_metadata=tuple((custom_metadata or {}).items()),
        ctime_ms=ctime_ms,
    )
