"""The controller checks every CAS of ledger metadata (`ledger/…` keys) against the ledger rules
(ledger/RULES.md M5–M7), and every CAS and delete against the ledger's password (M8): a refused
write answers the ledger error's code and changes nothing; other keys are not interpreted."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from tidelog.controller.state import ControllerState, MetaCompareAndSet, MetaCreate, MetaDelete, MetaEntry
from tidelog.ledger import (
    IllegalOpError,
    IncorrectParameterError,
    LedgerEvent,
    LedgerMetadata,
    LedgerState,
    UnauthorizedAccessError,
    apply_transition,
    new_ledger_metadata,
)
from tidelog.ledger.metadata import hash_password

KEY = "ledger/0000000000000000042"
PROOF = hash_password(b"pw")  # what the service puts in a command whose request carried the password


def opened() -> LedgerMetadata:
    return new_ledger_metadata(42, "broker-a", (1, 2, 3), 2, password=b"pw", ctime_ms=5)


def with_ledger(meta: LedgerMetadata) -> ControllerState:
    s = ControllerState()
    assert s.apply(MetaCreate(KEY, meta.encode(), now_ms=1)).ok
    return s


def cas(
    s: ControllerState,
    new: LedgerMetadata | bytes,
    version: int = 1,
    key: str = KEY,
    proof: bytes | None = PROOF,
):
    value = new if isinstance(new, bytes) else new.encode()
    return s.apply(MetaCompareAndSet(key, value, version, now_ms=2, ledger_password_hash=proof))


def test_allowed_moves_are_applied():
    s = with_ledger(opened())
    rec = apply_transition(opened(), LedgerEvent.RECOVERY_OPEN)
    assert cas(s, rec).ok
    closed = apply_transition(rec, LedgerEvent.RECOVERY_CLOSE, last_entry_id=9, length=100)
    r = cas(s, closed, version=2)
    assert r.ok and r.value.version == 3
    assert LedgerMetadata.decode(s.get_meta(KEY).value).state is LedgerState.CLOSED


CLOSED_AT_9 = dict(state=LedgerState.CLOSED, last_entry_id=9, length=100)


@pytest.mark.parametrize(
    ("name", "old", "new", "error"),
    [
        (
            "M5 CLOSED never goes back to OPEN",
            CLOSED_AT_9,
            {"state": LedgerState.OPEN, "last_entry_id": -1, "length": 0},
            IllegalOpError,
        ),
        (
            "M5 IN_RECOVERY never goes back to OPEN",
            {"state": LedgerState.IN_RECOVERY},
            {"state": LedgerState.OPEN},
            IllegalOpError,
        ),
        (
            "M6 a CLOSED ledger's end never changes",
            CLOSED_AT_9,
            dict(CLOSED_AT_9, last_entry_id=5, length=50),
            IllegalOpError,
        ),
        ("M6 the ack quorum never changes", {}, {"ack_quorum": 3}, IllegalOpError),
        ("M6 the password never changes", {}, {"password_hash": b"x" * 32}, IllegalOpError),
        ("M6 the ledger id never changes", {}, {"ledger_id": 43}, IllegalOpError),
        ("M7 ensembles keep their keys", {}, {"ensembles": ((0, (1, 2, 3)), (5, (1, 2, 4)))}, None),
        (
            "M7 a CLOSED ledger gets no new ensemble",
            CLOSED_AT_9,
            dict(CLOSED_AT_9, ensembles=((0, (1, 2, 3)), (5, (1, 2, 4)))),
            IllegalOpError,
        ),
    ],
)
def test_table(name, old, new, error):
    before = replace(opened(), **old)
    s = with_ledger(before)
    snapshot = copy.deepcopy(s.metadata)
    r = cas(s, replace(before, **new))
    if error is None:
        assert r.ok, name
        return
    assert not r.ok and r.code == error.code, name
    assert isinstance(r.error(), error) and r.error().number == error.number
    assert s.metadata == snapshot, "a refused CAS changes nothing"


def test_a_value_that_is_not_ledger_metadata_is_refused_with_incorrect_parameter():
    s = with_ledger(opened())
    r = cas(s, b"not json")
    assert r.code == IncorrectParameterError.code
    assert LedgerMetadata.decode(s.get_meta(KEY).value) == opened()


def test_a_stale_version_is_still_a_version_mismatch_first():
    s = with_ledger(opened())
    r = cas(s, replace(opened(), state=LedgerState.OPEN), version=7)
    assert r.code == "METADATA_VERSION_MISMATCH"


def test_other_keys_are_not_interpreted():
    s = ControllerState()
    for key in ("ledger-id-counter", "group/x", "ledgers"):
        assert s.apply(MetaCreate(key, b"1")).ok
        assert cas(s, b"anything", key=key).ok


def test_the_check_is_deterministic_across_replicas():
    """Two replicas applying the same commands end equal (refusals included)."""
    a, b = with_ledger(opened()), with_ledger(opened())
    closed = replace(opened(), **CLOSED_AT_9).encode()
    cmds = [
        MetaCompareAndSet(KEY, b"junk", 1, ledger_password_hash=PROOF),
        MetaCompareAndSet(KEY, closed, 1),
        MetaCompareAndSet(KEY, closed, 1, ledger_password_hash=PROOF),
        MetaCompareAndSet(
            KEY, replace(opened(), state=LedgerState.OPEN).encode(), 2, ledger_password_hash=PROOF
        ),
        MetaDelete(KEY, ledger_password_hash=hash_password(b"no")),
        MetaDelete(KEY, ledger_password_hash=PROOF),
    ]
    ra = [a.apply(c) for c in cmds]
    rb = [b.apply(c) for c in cmds]
    assert (
        [r.code for r in ra]
        == [r.code for r in rb]
        == [
            "LEDGER_INCORRECT_PARAMETER",
            "LEDGER_UNAUTHORIZED",
            "OK",
            "LEDGER_ILLEGAL_OP",
            "LEDGER_UNAUTHORIZED",
            "OK",
        ]
    )
    assert a == b


# --- M8: only a holder of the password changes or deletes a ledger's metadata ------------------


@pytest.mark.parametrize(
    "proof",
    [None, hash_password(b"wrong"), b"", hash_password(b"pw")[:-1]],
    ids=["none", "wrong", "empty", "truncated"],
)
def test_a_change_without_the_password_is_refused(proof):
    s = with_ledger(opened())
    snapshot = copy.deepcopy(s.metadata)
    # the attack seen in the wild: seal the ledger empty, so readers see no entry
    r = cas(s, replace(opened(), state=LedgerState.CLOSED, last_entry_id=-1, length=0), proof=proof)
    assert r.code == UnauthorizedAccessError.code and isinstance(r.error(), UnauthorizedAccessError)
    assert not s.apply(MetaDelete(KEY, ledger_password_hash=proof)).ok
    assert not s.apply(MetaDelete(KEY, 1, ledger_password_hash=proof)).ok
    assert s.metadata == snapshot, "a refused write changes nothing"


def test_the_password_allows_close_recovery_and_delete():
    s = with_ledger(opened())
    rec = apply_transition(opened(), LedgerEvent.RECOVERY_OPEN)
    assert cas(s, rec).ok
    assert cas(s, apply_transition(rec, LedgerEvent.RECOVERY_CLOSE, last_entry_id=-1, length=0), version=2).ok
    assert s.apply(MetaDelete(KEY, ledger_password_hash=PROOF)).ok and s.get_meta(KEY) is None


def test_an_empty_password_is_a_password():
    meta = new_ledger_metadata(42, "broker-a", (1, 2, 3), 2, password=b"", ctime_ms=5)
    s = with_ledger(meta)
    assert cas(s, replace(meta, state=LedgerState.IN_RECOVERY)).code == UnauthorizedAccessError.code
    assert cas(s, replace(meta, state=LedgerState.IN_RECOVERY), proof=hash_password(b"")).ok


def test_ledger_keys_hold_ledger_metadata_from_creation():
    s = ControllerState()
    r = s.apply(MetaCreate(KEY, b"junk"))
    assert r.code == IncorrectParameterError.code and s.get_meta(KEY) is None
    # a value stored before the check has no password to protect: it can be deleted
    s.metadata[KEY] = MetaEntry(KEY, b"junk", 1)
    assert s.apply(MetaDelete(KEY)).ok


def test_other_keys_need_no_password():
    s = ControllerState()
    assert s.apply(MetaCreate("ledger-id-counter", b"1")).ok
    assert s.apply(MetaCompareAndSet("ledger-id-counter", b"2", 1)).ok
    assert s.apply(MetaDelete("ledger-id-counter")).ok
