"""Ledger metadata: docs/reference/bookkeeper-ledger.md §1.2 (create parameters), §1.3 (record, invariants, transitions),
§2.7 (the writer's close) as tables, plus encoding properties. Rule numbers are ledger/RULES.md's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.ledger import (
    TRANSITIONS,
    DigestType,
    IllegalOpError,
    IncorrectParameterError,
    LedgerEvent,
    LedgerFencedError,
    LedgerMetadata,
    LedgerState,
    MetadataVersionError,
    NotEnoughBookiesError,
    Outcome,
    apply_transition,
    check_create_params,
    check_update,
    decide_transition,
    hash_password,
    new_ledger_metadata,
)

OPEN, REC, CLOSED = LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED
WCLOSE, ROPEN, RCLOSE = LedgerEvent.WRITER_CLOSE, LedgerEvent.RECOVERY_OPEN, LedgerEvent.RECOVERY_CLOSE


def meta(**kw) -> LedgerMetadata:
    base = dict(
        ledger_id=7,
        broker_set="broker-a",
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        ensembles=((0, (1, 2, 3)),),
        password_hash=hash_password(b"pw"),
    )
    base.update(kw)
    return LedgerMetadata(**base)


# --- §1.2 create parameters (rules C1–C4) ---------------------------------------------------

OK = None


@pytest.mark.parametrize(
    ("name", "e", "wq", "aq", "available", "kw", "expected"),
    [
        ("§1.2 E3/WQ3/AQ2 on a set of 3", 3, 3, 2, 3, {}, OK),
        ("§1.2 AQ = WQ", 3, 3, 3, 3, {}, OK),
        ("§1.2 AQ 1", 2, 2, 1, 2, {"set_replicas": 2}, OK),
        ("§1.2 single replica", 1, 1, 1, 1, {"set_replicas": 1}, OK),
        ("§1.2 empty password is a password", 3, 3, 2, 3, {"password": b""}, OK),
        ("§1.2 E=0", 0, 0, 0, 3, {}, IncorrectParameterError),
        ("§1.2 WQ=0", 3, 0, 0, 3, {}, IncorrectParameterError),
        ("§1.2 AQ≤0", 3, 3, 0, 3, {}, IncorrectParameterError),
        ("§1.2 AQ negative", 3, 3, -1, 3, {}, IncorrectParameterError),
        ("§1.2 WQ>E", 2, 3, 2, 3, {}, IncorrectParameterError),
        ("§1.2 AQ>WQ (old API: IllegalArgument; typed here)", 3, 3, 4, 3, {}, IncorrectParameterError),
        ("§1.2 no password", 3, 3, 2, 3, {"password": None}, IncorrectParameterError),
        ("§1.2 null digest", 3, 3, 2, 3, {"digest_type": None}, IncorrectParameterError),
        ("§1.2 unknown digest", 3, 3, 2, 3, {"digest_type": "SHA1"}, IncorrectParameterError),
        ("§1.2 null custom metadata", 3, 3, 2, 3, {"custom_metadata": None}, IncorrectParameterError),
        (
            "§1.2 custom metadata values are bytes",
            3,
            3,
            2,
            3,
            {"custom_metadata": {"k": "v"}},
            IncorrectParameterError,
        ),
        ("§1.2 a bool is not a quorum", 3, 3, True, 3, {}, IncorrectParameterError),
        ("tidelog: E>WQ is striping, not offered", 3, 2, 2, 3, {}, IncorrectParameterError),
        (
            "tidelog: E must be the set's replica count",
            2,
            2,
            2,
            2,
            {"set_replicas": 3},
            IncorrectParameterError,
        ),
        ("tidelog: E above the set's replica count", 4, 4, 2, 4, {}, IncorrectParameterError),
        ("§1.4 -6: not enough replicas available now", 3, 3, 2, 2, {}, NotEnoughBookiesError),
        ("§1.4 -6: none available", 3, 3, 2, 0, {}, NotEnoughBookiesError),
    ],
)
def test_create_params_table(name, e, wq, aq, available, kw, expected):
    args = {"set_replicas": 3, "password": b"pw", "digest_type": DigestType.CRC32C, "custom_metadata": {}}
    args.update(kw)
    if expected is OK:
        check_create_params(e, wq, aq, available, **args)
        return
    with pytest.raises(expected) as info:
        check_create_params(e, wq, aq, available, **args)
    assert info.value.number == {IncorrectParameterError: -14, NotEnoughBookiesError: -6}[expected]
    if expected is NotEnoughBookiesError:
        assert info.value.retryable
    else:
        assert not info.value.retryable


def test_create_params_names_the_tidelog_rule():
    with pytest.raises(IncorrectParameterError, match="number of replicas of the broker set"):
        check_create_params(2, 2, 2, 2, set_replicas=3, password=b"", custom_metadata={})


def test_new_ledger_is_open_with_e_equal_wq_equal_replicas():
    m = new_ledger_metadata(1, "broker-a", [4, 5, 6], 2, password=b"pw", ctime_ms=1000)
    assert (m.state, m.ensemble_size, m.write_quorum, m.ack_quorum) == (OPEN, 3, 3, 2)
    assert (m.last_entry_id, m.length, m.replicas) == (-1, 0, (4, 5, 6))
    assert m.check_password(b"pw") and not m.check_password(b"other")
    assert b"pw" not in m.encode()  # only the hash is kept


# --- §1.3 invariants (rules M1–M4) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("M1 E ≥ WQ", {"ensemble_size": 2, "write_quorum": 3, "ensembles": ((0, (1, 2)),)}),
        ("M1 WQ ≥ AQ", {"ack_quorum": 4}),
        ("M1 AQ ≥ 1", {"ack_quorum": 0}),
        ("M1 tidelog E == WQ", {"write_quorum": 2}),
        ("M2 at least one ensemble", {"ensembles": ()}),
        ("M2 first ensemble at 0", {"ensembles": ((1, (1, 2, 3)),)}),
        ("M2 keys strictly increase", {"ensembles": ((0, (1, 2, 3)), (0, (1, 2, 4)))}),
        ("M2 every ensemble has E replicas", {"ensembles": ((0, (1, 2)),)}),
        ("M2 replicas are distinct", {"ensembles": ((0, (1, 1, 2)),)}),
        ("M3 OPEN has no last entry id", {"last_entry_id": 4}),
        ("M3 IN_RECOVERY has no length", {"state": REC, "length": 10}),
        ("M3 CLOSED empty has length 0", {"state": CLOSED, "last_entry_id": -1, "length": 3}),
        ("M3 CLOSED end is ≥ -1", {"state": CLOSED, "last_entry_id": -2}),
        ("M4 ledger id ≥ 0", {"ledger_id": -1}),
        ("M4 a broker set", {"broker_set": ""}),
        ("M4 known format", {"format_version": 99}),
    ],
)
def test_metadata_invariants_table(name, kw):
    with pytest.raises(IncorrectParameterError):
        meta(**kw)


def test_closed_metadata_with_end_is_valid():
    m = meta(state=CLOSED, last_entry_id=9, length=100)
    assert (m.last_entry_id, m.length) == (9, 100)
    assert meta(state=CLOSED).last_entry_id == -1  # an empty ledger closes at -1


def test_ensemble_for_is_a_floor_lookup():
    m = meta(ensembles=((0, (1, 2, 3)), (10, (1, 2, 4)), (25, (5, 2, 4))))
    assert m.ensemble_for(0) == (1, 2, 3)
    assert m.ensemble_for(9) == (1, 2, 3)
    assert m.ensemble_for(10) == (1, 2, 4)
    assert m.ensemble_for(24) == (1, 2, 4)
    assert m.ensemble_for(1000) == (5, 2, 4)
    assert (m.replicas, m.last_ensemble_first_entry) == ((5, 2, 4), 25)


# --- encoding -------------------------------------------------------------------------------


def test_encoding_is_deterministic_and_versioned():
    a = meta(custom_metadata={"b": b"\x00\xff", "a": b"x"}, ctime_ms=5)
    b = meta(custom_metadata={"a": b"x", "b": b"\x00\xff"}, ctime_ms=5)
    assert a.encode() == b.encode()
    doc = json.loads(a.encode())
    assert doc["format"] == 1
    assert doc["custom_metadata"] == {"a": "eA==", "b": "AP8="}
    assert "version" not in doc  # the store owns the CAS version
    assert a.encode() == a.encode().strip()  # compact: no whitespace to differ on


def test_decode_takes_the_store_version():
    a = meta()
    back = LedgerMetadata.decode(a.encode(), version=42)
    assert back == a and back.version == 42


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b"{",
        b'{"format": 2}',
        b"\xff",
        meta().encode().replace(b'"state":"OPEN"', b'"state":"GONE"'),
        meta().encode().replace(b'"ack_quorum":2', b'"ack_quorum":5'),
        meta().encode().replace(b'"password_hash":"', b'"password_hash":"!'),
    ],
)
def test_decode_refuses_bad_input(data):
    with pytest.raises(IncorrectParameterError):
        LedgerMetadata.decode(data)


@st.composite
def metadatas(draw) -> LedgerMetadata:
    e = draw(st.integers(1, 5))
    aq = draw(st.integers(1, e))
    n_ens = draw(st.integers(1, 3))
    keys = sorted(draw(st.sets(st.integers(1, 1000), min_size=n_ens - 1, max_size=n_ens - 1)))
    ensembles = tuple((k, tuple(draw(st.permutations(range(1, e + 3)))[:e])) for k in [0, *keys])
    state = draw(st.sampled_from(list(LedgerState)))
    last, length = -1, 0
    if state is CLOSED:
        last = draw(st.integers(-1, 10_000))
        length = 0 if last == -1 else draw(st.integers(0, 10**9))
    return LedgerMetadata(
        ledger_id=draw(st.integers(0, 2**63)),
        broker_set=draw(st.text(min_size=1, max_size=10)),
        ensemble_size=e,
        write_quorum=e,
        ack_quorum=aq,
        ensembles=ensembles,
        digest_type=draw(st.sampled_from(list(DigestType))),
        password_hash=draw(st.binary(max_size=32)),
        state=state,
        last_entry_id=last,
        length=length,
        custom_metadata=draw(st.dictionaries(st.text(max_size=5), st.binary(max_size=8), max_size=3)),
        ctime_ms=draw(st.integers(-1, 2**50)),
    )


@given(m=metadatas(), version=st.integers(0, 10**6))
def test_encoding_round_trips(m, version):
    data = m.encode()
    back = LedgerMetadata.decode(data, version=version)
    assert back == m and back.version == version
    assert back.encode() == data


# --- §1.3 transitions and §2.7 the writer's close (rules T1–T6) ------------------------------

APPLY_TO = {(OPEN, WCLOSE): CLOSED, (OPEN, ROPEN): REC, (REC, RCLOSE): CLOSED}


@pytest.mark.parametrize(
    ("name", "state", "event", "expected"),
    [
        ("T1 §1.3 OPEN → CLOSED: writer close", OPEN, WCLOSE, CLOSED),
        ("T1 §1.3 OPEN → IN_RECOVERY: recovery open", OPEN, ROPEN, REC),
        ("T1 §1.3 IN_RECOVERY → CLOSED: the recoverer closes", REC, RCLOSE, CLOSED),
        ("T2 §2.4 step 1: already IN_RECOVERY, the CAS is skipped", REC, ROPEN, Outcome.NOOP),
        ("T3 §2.4 step 0: recovery of a CLOSED ledger does nothing", CLOSED, ROPEN, Outcome.NOOP),
        ("T5 §2.4 step 6/8: another recoverer closed first, adopt", CLOSED, RCLOSE, Outcome.NOOP),
        ("T6 §2.7 writer close over CLOSED compares ends", CLOSED, WCLOSE, Outcome.SAME_END),
        (
            "T4 §2.7/§7 writer close over IN_RECOVERY fails (protocol.md, TLA+)",
            REC,
            WCLOSE,
            LedgerFencedError,
        ),
        ("T7 recovery never closes a ledger it did not mark", OPEN, RCLOSE, IllegalOpError),
    ],
)
def test_transition_table(name, state, event, expected):
    if isinstance(expected, type):
        with pytest.raises(expected):
            decide_transition(state, event)
    else:
        assert decide_transition(state, event) == expected


def test_every_pair_is_in_the_table_or_refused():
    for state in LedgerState:
        for event in LedgerEvent:
            if (state, event) not in TRANSITIONS:
                with pytest.raises(IllegalOpError):
                    decide_transition(state, event)
    # nothing ever goes back to OPEN, and CLOSED never goes anywhere
    assert OPEN not in TRANSITIONS.values()
    assert all(v in (Outcome.NOOP, Outcome.SAME_END) for (s, _), v in TRANSITIONS.items() if s is CLOSED)


@pytest.mark.parametrize(
    ("name", "start", "event", "end", "expected"),
    [
        (
            "§2.7 writer close of an OPEN ledger",
            meta(),
            WCLOSE,
            (4, 50),
            meta(state=CLOSED, last_entry_id=4, length=50),
        ),
        ("§2.7 writer close of an empty ledger", meta(), WCLOSE, (-1, 0), meta(state=CLOSED)),
        (
            "§2.7 writer close over the same end is a no-op",
            meta(state=CLOSED, last_entry_id=4, length=50),
            WCLOSE,
            (4, 50),
            None,
        ),
        (
            "§2.7 writer close over another end: MetadataVersion (-17)",
            meta(state=CLOSED, last_entry_id=5, length=60),
            WCLOSE,
            (4, 50),
            MetadataVersionError,
        ),
        (
            "§2.7 writer close over IN_RECOVERY: LedgerFenced (-101), we differ from BookKeeper's code",
            meta(state=REC),
            WCLOSE,
            (4, 50),
            LedgerFencedError,
        ),
        ("§2.4 recovery marks IN_RECOVERY", meta(), ROPEN, (-1, 0), meta(state=REC)),
        (
            "§2.4 recovery closes at the last recoverable entry",
            meta(state=REC),
            RCLOSE,
            (6, 70),
            meta(state=CLOSED, last_entry_id=6, length=70),
        ),
        (
            "§2.4 step 6: closed meanwhile by another recoverer, adopt",
            meta(state=CLOSED, last_entry_id=5, length=60),
            RCLOSE,
            (6, 70),
            None,
        ),
    ],
)
def test_apply_transition_table(name, start, event, end, expected):
    if isinstance(expected, type):
        with pytest.raises(expected) as info:
            apply_transition(start, event, last_entry_id=end[0], length=end[1])
        assert info.value.number in (-17, -101)
        return
    got = apply_transition(replace(start, version=3), event, last_entry_id=end[0], length=end[1])
    assert got == expected
    if got is not None:
        assert got.version == 3  # the CAS expects the version it read


# --- §1.3 metadata writes (rules M5–M7) ------------------------------------------------------

CLOSED_4 = meta(state=CLOSED, last_entry_id=4, length=40)
TWO_ENS = meta(ensembles=((0, (1, 2, 3)), (5, (1, 2, 4))))


@pytest.mark.parametrize(
    ("name", "old", "new", "ok"),
    [
        ("M5 §1.3 OPEN → IN_RECOVERY", meta(), meta(state=REC), True),
        ("M5 §1.3 OPEN → CLOSED", meta(), CLOSED_4, True),
        ("M5 §1.3 IN_RECOVERY → CLOSED", meta(state=REC), CLOSED_4, True),
        ("M5 §1.3 CLOSED is final: no recovery", CLOSED_4, meta(state=REC), False),
        ("M5 §1.3 CLOSED is final: never OPEN", CLOSED_4, meta(), False),
        ("M5 IN_RECOVERY never goes back to OPEN", meta(state=REC), meta(), False),
        ("M6 a CLOSED end never changes", CLOSED_4, meta(state=CLOSED, last_entry_id=5, length=50), False),
        ("M6 quorums never change", meta(), meta(ack_quorum=3), False),
        ("M6 the password never changes", meta(), meta(password_hash=hash_password(b"x")), False),
        ("M6 custom metadata never changes", meta(), meta(custom_metadata={"k": b"v"}), False),
        ("M7 §1.3 a new ensemble after the last key", meta(), TWO_ENS, True),
        (
            "M7 §1.3 replace the last ensemble at its key",
            TWO_ENS,
            meta(ensembles=((0, (1, 2, 3)), (5, (1, 2, 5)))),
            True,
        ),
        (
            "M7 §1.3 re-replication of a CLOSED ledger swaps replicas",
            CLOSED_4,
            meta(state=CLOSED, last_entry_id=4, length=40, ensembles=((0, (1, 2, 9)),)),
            True,
        ),
        (
            "M7 a CLOSED ledger gets no new ensemble",
            CLOSED_4,
            meta(state=CLOSED, last_entry_id=4, length=40, ensembles=((0, (1, 2, 3)), (5, (1, 2, 4)))),
            False,
        ),
        (
            "M7 §1.3 no key below the last (defect 2)",
            TWO_ENS,
            meta(ensembles=((0, (1, 2, 3)), (3, (1, 2, 4)), (5, (1, 2, 4)))),
            False,
        ),
        ("M7 keys are never dropped", TWO_ENS, meta(), False),
    ],
)
def test_metadata_update_table(name, old, new, ok):
    if ok:
        check_update(old, new)
    else:
        with pytest.raises(IllegalOpError):
            check_update(old, new)


# --- §1.4 error codes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "number"),
    [
        ("LedgerFencedError", -101),
        ("LedgerClosedError", -11),
        ("NoSuchEntryError", -13),
        ("NoSuchLedgerExistsError", -25),
        ("UnauthorizedAccessError", -102),
        ("DigestMatchError", -5),
        ("LedgerRecoveryError", -10),
        ("NotEnoughBookiesError", -6),
        ("IncorrectParameterError", -14),
        ("MetadataVersionError", -17),
        ("LedgerTimeoutError", -23),
        ("LedgerReadError", -1),
        ("IllegalOpError", -100),
    ],
)
def test_s1_4_errors_carry_bookkeepers_numbers(name, number):
    import grpc

    import tidelog.ledger
    from tidelog import errors

    cls = getattr(tidelog.ledger, name)
    assert cls is getattr(errors, name) and cls.number == number
    assert errors.by_code(cls.code) is cls  # registered: the wire gives back the same class
    assert grpc.StatusCode[cls.status] and cls.hint and cls.__doc__
    assert cls.retryable == (name in {"LedgerRecoveryError", "NotEnoughBookiesError", "LedgerTimeoutError"})
