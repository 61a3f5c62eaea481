"""The signature scheme shared by every port (tidelog/access.py): a good signature, a wrong
secret, a stale date, malformed headers; and users' signing keys."""

from __future__ import annotations

import hashlib
import hmac
from hashlib import sha1

from hypothesis import given
from hypothesis import strategies as st

from tidelog import access

NOW = 1_795_000_000.0
KEY = access.signing_key("s3cret", "AKalice1", iterations=1000)


def headers_at(now_s: float, key: str = KEY, access_key: str = "AKalice1") -> dict[str, str]:
    return dict(access.headers(access_key, key, now_s))


def keys(access_key: str) -> str | None:
    return KEY if access_key == "AKalice1" else None


def test_the_signing_key_is_pbkdf2_of_the_secret_salted_with_the_access_key() -> None:
    expected = hashlib.pbkdf2_hmac("sha256", b"s3cret", b"tidelog-user:AKalice1", 1000).hex()
    assert expected == KEY
    assert access.signing_key("s3cret", "AKbob0001", iterations=1000) != KEY


def test_headers_are_the_rocketmq_scheme() -> None:
    h = headers_at(NOW)
    date_time = h["x-mq-date-time"]
    assert access.date_time_s(date_time) == int(NOW)
    sig = hmac.new(KEY.encode(), date_time.encode(), sha1).hexdigest()
    assert h["authorization"] == (
        f"MQv2-HMAC-SHA1 Credential=AKalice1, SignedHeaders=x-mq-date-time, Signature={sig}"
    )


def test_a_good_signature_names_its_access_key() -> None:
    verdict = access.check(headers_at(NOW), keys, NOW, 900)
    assert verdict.access_key == "AKalice1" and verdict.refusal is None and verdict.nonce == ""


def test_a_wrong_secret_an_unknown_key_and_no_signature_are_refused_alike() -> None:
    wrong = headers_at(NOW, key=access.signing_key("guess", "AKalice1", iterations=1000))
    unknown = headers_at(NOW, access_key="AKnobody")
    assert access.check(wrong, keys, NOW, 900).refusal == access.check(unknown, keys, NOW, 900).refusal
    assert access.check(wrong, keys, NOW, 900).access_key == ""
    assert access.check({}, keys, NOW, 900).refusal is not None


def test_a_stale_date_is_refused() -> None:
    assert access.check(headers_at(NOW - 901), keys, NOW, 900).refusal is not None
    assert access.check(headers_at(NOW + 901), keys, NOW, 900).refusal is not None
    assert access.check(headers_at(NOW - 899), keys, NOW, 900).refusal is None


@given(st.text(max_size=80), st.text(max_size=40))
def test_malformed_headers_are_refused_never_raise(authorization: str, date_time: str) -> None:
    verdict = access.check({"authorization": authorization, "x-mq-date-time": date_time}, keys, NOW, 900)
    assert verdict.refusal is not None and verdict.access_key == ""
