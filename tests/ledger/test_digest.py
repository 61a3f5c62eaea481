"""Entry digests (ledger/digest.py): every field of the digest input counts, every single-bit
corruption of data or digest is caught (CRC32C, CRC32, MAC), MAC depends on the password."""

from __future__ import annotations

import zlib

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.ledger import DigestMatchError, DigestType, IncorrectParameterError
from tidelog.ledger.digest import DIGEST_SIZES, Digester, digest_input_header, mac_key, parse_digest_type

CHECKING = [DigestType.CRC32C, DigestType.CRC32, DigestType.MAC]

ids = st.integers(min_value=0, max_value=2**63 - 1)
lacs = st.integers(min_value=-1, max_value=2**63 - 1)
payloads = st.binary(max_size=2048)
passwords = st.binary(max_size=32)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("crc32c", DigestType.CRC32C),
        ("CRC32C", DigestType.CRC32C),
        ("crc32", DigestType.CRC32),
        ("mac", DigestType.MAC),
        ("hmac", DigestType.MAC),
        ("dummy", DigestType.DUMMY),
        (DigestType.MAC, DigestType.MAC),
    ],
)
def test_parse_digest_type(text, expected):
    assert parse_digest_type(text) is expected


@pytest.mark.parametrize("bad", ["sha1", "", None, 3, b"crc32c"])
def test_unknown_digest_type_is_incorrect_parameter(bad):
    with pytest.raises(IncorrectParameterError):
        parse_digest_type(bad)


def test_crc_values_are_the_standard_checksums_over_header_and_data():
    header = digest_input_header(7, 3, 2, 100)
    assert header == (7).to_bytes(8, "big") + (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + (
        100
    ).to_bytes(8, "big")
    assert digest_input_header(1, 0, -1, 0)[16:24] == b"\xff" * 8  # LAC -1 is signed
    data = b"hello ledger"
    assert Digester("crc32c").compute(7, 3, 2, 100, data) == crc32c.crc32c(header + data).to_bytes(4, "big")
    assert Digester("crc32").compute(7, 3, 2, 100, data) == zlib.crc32(header + data).to_bytes(4, "big")
    assert Digester("dummy").compute(7, 3, 2, 100, data) == b""


@pytest.mark.parametrize("kind", list(DigestType))
def test_sizes(kind):
    assert len(Digester(kind, b"pw").compute(1, 0, -1, 3, b"abc")) == DIGEST_SIZES[kind]


def test_out_of_range_fields_are_incorrect_parameter_and_never_match():
    d = Digester("crc32c")
    with pytest.raises(IncorrectParameterError):
        d.compute(-1, 0, -1, 0, b"")
    assert not d.matches(1, 2**63, -1, 0, b"", b"\0\0\0\0")


@given(
    kind=st.sampled_from(list(DigestType)),
    ledger=ids,
    entry=ids,
    lac=lacs,
    length=ids,
    data=payloads,
    password=passwords,
)
def test_round_trip(kind, ledger, entry, lac, length, data, password):
    d = Digester(kind, password)
    digest = d.compute(ledger, entry, lac, length, data)
    d.verify(ledger, entry, lac, length, data, digest)  # does not raise
    assert Digester(kind, password).compute(ledger, entry, lac, length, data) == digest  # deterministic


@given(
    kind=st.sampled_from(CHECKING),
    ledger=ids,
    entry=ids,
    lac=lacs,
    length=ids,
    data=st.binary(min_size=1, max_size=512),
    password=passwords,
    where=st.integers(min_value=0),
)
def test_any_single_bit_flip_in_the_data_is_detected(kind, ledger, entry, lac, length, data, password, where):
    d = Digester(kind, password)
    digest = d.compute(ledger, entry, lac, length, data)
    bit = where % (len(data) * 8)
    corrupt = bytearray(data)
    corrupt[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DigestMatchError) as info:
        d.verify(ledger, entry, lac, length, bytes(corrupt), digest)
    assert info.value.number == -5


@given(kind=st.sampled_from(CHECKING), data=payloads, password=passwords, where=st.integers(min_value=0))
def test_any_single_bit_flip_in_the_digest_is_detected(kind, data, password, where):
    d = Digester(kind, password)
    digest = d.compute(3, 4, 3, len(data), data)
    bit = where % (len(digest) * 8)
    corrupt = bytearray(digest)
    corrupt[bit // 8] ^= 1 << (bit % 8)
    assert not d.matches(3, 4, 3, len(data), data, bytes(corrupt))


@given(
    kind=st.sampled_from(CHECKING),
    ledger=ids,
    entry=ids,
    lac=lacs,
    length=ids,
    data=payloads,
    field=st.sampled_from(["ledger", "entry", "lac", "length"]),
    delta=st.integers(min_value=1, max_value=2**40),
)
def test_the_entry_position_is_covered_too(kind, ledger, entry, lac, length, data, field, delta):
    """The right bytes under another ledger, entry id, LAC or length fail the check."""
    d = Digester(kind, b"pw")
    digest = d.compute(ledger, entry, lac, length, data)
    fields = {"ledger": ledger, "entry": entry, "lac": lac, "length": length}
    fields[field] = (fields[field] + delta) % (2**63)
    assert not d.matches(fields["ledger"], fields["entry"], fields["lac"], fields["length"], data, digest)


@given(data=payloads, a=passwords, b=passwords)
def test_mac_depends_on_the_password(data, a, b):
    digest = Digester("mac", a).compute(1, 0, -1, len(data), data)
    assert Digester("mac", b).matches(1, 0, -1, len(data), data, digest) == (a == b)


def test_mac_key_is_not_the_password():
    assert mac_key(b"secret") != b"secret" and len(mac_key(b"secret")) == 32


def test_dummy_checks_nothing():
    assert Digester("dummy").matches(1, 0, -1, 1, b"x", b"")
