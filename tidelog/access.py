"""Signed requests: RocketMQ 5's `MQv2-HMAC-SHA1` header scheme and users' signing keys (pure).

Owns the one parser and checker of the scheme, used by every port that takes users' calls (the
broker's and the controller's gRPC ports, the broker's data port, the RocketMQ endpoint):

    x-mq-date-time: 20261126T171138Z                                 (yyyyMMdd'T'HHmmss'Z')
    authorization:  MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
                    Signature=<hex of HMAC-SHA1(signing key, the x-mq-date-time value)>

The official RocketMQ clients sign with their configured secret key as it is; the Java client
writes the hex in upper case, the Python client in lower case, so the signature is compared as
the 20 bytes it encodes. RocketMQ's clients sign only the date-time, so a captured signature can
be replayed: the clock check bounds for how long, and TLS keeps it from being captured. tidelog's
own clients sign more (`SignedHeaders=x-mq-date-time;x-tide-method;x-tide-nonce`, the values one
a line): the call's method and a fresh nonce, which a server accepts once (tidelog/guard.py), so
their signatures cannot be replayed at all, on the same method or another.

tidelog's users never hand their secret to a server: the controller keeps a *signing key*
derived from it, `signing_key(secret, access_key)` (PBKDF2-HMAC-SHA256, salted with the access
key), and a client derives the same key locally and signs with it. A stolen user table then
does not reveal a secret that may be used elsewhere. The signing key is written as 64 hex
characters, so an official RocketMQ client configured with it as its secret key signs correctly.

The signing key signs on its own, so it is never stored in clear: the controller *wraps* it
with a key derived from the cluster secret before it enters the Raft log (`wrap_signing_key`),
and the controllers and brokers, who hold the secret, unwrap it in memory (`unwrap_signing_key`).
A copy of the journal, a snapshot or a heartbeat reply then signs nothing without the secret.
Wrapped: ``w1:<nonce hex>:<key XOR HMAC-SHA256(kek, nonce, access key) hex>:<tag hex>``, with
``kek = HMAC-SHA256(secret, "tidelog-user-key-wrap-v1")`` and a 16-byte tag (HMAC-SHA256 under
kek of the nonce, the access key and the ciphertext): a wrong secret or a changed byte is
detected, not silently turned into another key. The stdlib has no AES; a pad from HMAC over a
fresh nonce is a stream cipher of the same strength for one 32-byte key. Keys in clear (64 hex
digits, written by an older version) are still read as they are.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha1

__all__ = [
    "ALGORITHM",
    "AUTHORIZATION",
    "DATE_TIME",
    "DEFAULT_MAX_SKEW_S",
    "PBKDF2_ITERATIONS",
    "Verdict",
    "check",
    "date_time_s",
    "format_date_time",
    "METHOD",
    "NONCE",
    "headers",
    "string_to_sign",
    "is_stored_key",
    "parse_authorization",
    "sign",
    "signing_key",
    "unwrap_signing_key",
    "wrap_signing_key",
]

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
# How far a signature's date may be from the server's clock. Clocks kept by NTP differ by far
# less; the date has whole seconds. A date-only signature (RocketMQ's clients) can be replayed
# within this window, so it is no wider than clock skew needs.
DEFAULT_MAX_SKEW_S = 60
#: tidelog's clients also sign the call's method and a fresh nonce, which servers accept once
METHOD = "x-tide-method"
NONCE = "x-tide-nonce"
TIDE_SIGNED = (DATE_TIME, METHOD, NONCE)
NONCE_HEX = 32
# Enough that guessing secrets from a stolen table is slow, few enough that a client deriving its
# key once at start-up does not notice (about 0.1 s).
PBKDF2_ITERATIONS = 100_000
SALT_PREFIX = b"tidelog-user:"
_DATE_TIME = re.compile(r"\d{8}T\d{6}Z")
_SIGNATURE = re.compile(r"[0-9A-Fa-f]{40}")
_CLEAR_KEY = re.compile(r"[0-9a-f]{64}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_WRAPPED_KEY = re.compile(r"w1:([0-9a-f]{32}):([0-9a-f]{64}):([0-9a-f]{32})")
_WRAP_PURPOSE = b"tidelog-user-key-wrap-v1"


def signing_key(secret_key: str, access_key: str, iterations: int = PBKDF2_ITERATIONS) -> str:
    """The key a user signs with (hex): PBKDF2-HMAC-SHA256 of the secret, salted with the access key."""
    raw = hashlib.pbkdf2_hmac("sha256", secret_key.encode(), SALT_PREFIX + access_key.encode(), iterations)
    return raw.hex()


def _kek(cluster_secret: str) -> bytes:
    return hmac.new(cluster_secret.encode(), _WRAP_PURPOSE, hashlib.sha256).digest()


def _pad_and_tag(kek: bytes, nonce: bytes, access_key: str, body: bytes) -> tuple[bytes, bytes]:
    ak = access_key.encode()
    pad = hmac.new(kek, b"pad" + nonce + len(ak).to_bytes(4, "big") + ak, hashlib.sha256).digest()
    tag = hmac.new(kek, b"tag" + nonce + len(ak).to_bytes(4, "big") + ak + body, hashlib.sha256).digest()
    return pad, tag[:16]


def wrap_signing_key(cluster_secret: str, access_key: str, key: str, nonce: bytes) -> str:
    """`key` (64 hex digits) wrapped under the cluster secret for storage; `nonce`: 16 fresh random
    bytes (passed in: this module draws none)."""
    if not _CLEAR_KEY.fullmatch(key) or len(nonce) != 16:
        raise ValueError("a signing key is 64 lower-case hex digits and a wrap nonce 16 bytes")
    kek = _kek(cluster_secret)
    pad, _ = _pad_and_tag(kek, nonce, access_key, b"")
    body = bytes(a ^ b for a, b in zip(bytes.fromhex(key), pad, strict=True))
    _, tag = _pad_and_tag(kek, nonce, access_key, body)
    return f"w1:{nonce.hex()}:{body.hex()}:{tag.hex()}"


def is_stored_key(stored: str) -> bool:
    """Whether `stored` is a signing key as the controller state may hold one (wrapped, or in
    clear from an older version)."""
    return bool(_WRAPPED_KEY.fullmatch(stored) or _CLEAR_KEY.fullmatch(stored))


def unwrap_signing_key(cluster_secret: str, access_key: str, stored: str) -> str | None:
    """The signing key (hex) a stored value holds; None when it does not unwrap under this secret
    (another cluster's, or changed). A key stored in clear is returned as it is."""
    if _CLEAR_KEY.fullmatch(stored):
        return stored
    m = _WRAPPED_KEY.fullmatch(stored)
    if m is None:
        return None
    nonce, body, tag = (bytes.fromhex(g) for g in m.groups())
    pad, expected = _pad_and_tag(_kek(cluster_secret), nonce, access_key, body)
    if not hmac.compare_digest(tag, expected):
        return None
    return bytes(a ^ b for a, b in zip(body, pad, strict=True)).hex()


def sign(key: str, date_time: str) -> str:
    """The signature of `date_time` by `key`, as the clients write it (lower-case hex)."""
    return hmac.new(key.encode(), date_time.encode(), sha1).hexdigest()


def format_date_time(now_s: float) -> str:
    """`now_s` (seconds since the epoch) as the scheme's `yyyyMMdd'T'HHmmss'Z'` (UTC)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))


def headers(
    access_key: str, key: str, now_s: float, *, method: str = "", nonce: str = ""
) -> tuple[tuple[str, str], ...]:
    """The metadata entries of a call signed by `key` at `now_s`: RocketMQ's two (the date alone
    signed), or with `method` and `nonce` (tidelog's clients) four, all three values signed."""
    date_time = format_date_time(now_s)
    if not nonce:
        value = f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={sign(key, date_time)}"
        return ((AUTHORIZATION, value), (DATE_TIME, date_time))
    values = {DATE_TIME: date_time, METHOD: method, NONCE: nonce}
    signature = sign(key, string_to_sign(values, TIDE_SIGNED))
    value = (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={';'.join(TIDE_SIGNED)}, Signature={signature}"
    )
    return ((AUTHORIZATION, value), (DATE_TIME, date_time), (METHOD, method), (NONCE, nonce))


def string_to_sign(metadata: Mapping[str, str], signed: Sequence[str]) -> str:
    """What the signature covers: the signed headers' values, one a line, in the order named
    (the date-time alone for RocketMQ's clients, as they sign it)."""
    return "\n".join(metadata.get(name, "") for name in signed)


def parse_authorization(value: str) -> tuple[str, list[str], str] | None:
    """(access key, signed headers, signature) of an `authorization` value, or None if it is not
    an `MQv2-HMAC-SHA1` one. A credential `ak/scope...` names access key `ak`, as RocketMQ reads it."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, field_value = part.strip().partition("=")
        if not eq or name in fields:
            return None
        fields[name] = field_value.strip()
    if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
        return None
    access_key = fields["Credential"].split("/", 1)[0]
    signed = [h.strip().lower() for h in fields["SignedHeaders"].split(";") if h.strip()]
    return access_key, signed, fields["Signature"]


def date_time_s(text: str) -> int | None:
    """The seconds since the epoch of a `yyyyMMdd'T'HHmmss'Z'` date-time (UTC), None if it is not one."""
    if not _DATE_TIME.fullmatch(text):
        return None
    try:
        return calendar.timegm(time.strptime(text, "%Y%m%dT%H%M%SZ"))
    except ValueError:  # a month 13, a day 32
        return None


#: Why a call was refused, as a metric label (`tidelog_auth_refused_total{reason}`).
UNSIGNED = "unsigned"
MALFORMED_SIGNATURE = "malformed_signature"
STALE = "stale"
BAD_SIGNATURE = "bad_signature"
REPLAYED = "replayed"


@dataclass(frozen=True)
class Verdict:
    """Who signed a call (`access_key`), or why it is refused (`refusal`, then no access key,
    and `reason`: one of the labels above)."""

    access_key: str = ""
    refusal: str | None = None
    reason: str = ""
    #: what a tidelog client signed besides the date ("" for a date-only signature), and when
    method: str = ""
    nonce: str = ""
    signed_at_s: int = 0


NO_MATCH = "the signature does not match a known access key"


def check(
    metadata: Mapping[str, str], key_of: Callable[[str], str | None], now_s: float, max_skew_s: int
) -> Verdict:
    """Whether a call with these metadata entries (lower-case names) is signed by the key
    `key_of(access_key)` gives, with a date-time at most `max_skew_s` from `now_s` (0: the time is
    not checked).

    An unknown access key and a wrong signature get the same answer: a caller learns nothing of
    which access keys exist."""
    value = metadata.get(AUTHORIZATION)
    if value is None:
        return Verdict(
            refusal=f"the call is not signed: give the client credentials ({ALGORITHM})", reason=UNSIGNED
        )
    parsed = parse_authorization(value)
    if parsed is None:
        return Verdict(
            refusal=f"the authorization is not {ALGORITHM} Credential=..., SignedHeaders=..., Signature=...",
            reason=MALFORMED_SIGNATURE,
        )
    access_key, signed, signature = parsed
    if DATE_TIME not in signed:
        return Verdict(refusal=f"the signature must cover {DATE_TIME}", reason=MALFORMED_SIGNATURE)
    if signed != [DATE_TIME] and signed != list(TIDE_SIGNED):
        return Verdict(
            refusal=f"SignedHeaders must be {DATE_TIME} or {';'.join(TIDE_SIGNED)}",
            reason=MALFORMED_SIGNATURE,
        )
    nonce = metadata.get(NONCE, "") if signed != [DATE_TIME] else ""
    if signed != [DATE_TIME] and not _NONCE.fullmatch(nonce):
        return Verdict(refusal=f"{NONCE} must be {NONCE_HEX} hex digits", reason=MALFORMED_SIGNATURE)
    date_time = metadata.get(DATE_TIME, "")
    at = date_time_s(date_time)
    if at is None:
        return Verdict(
            refusal=f"{DATE_TIME} {date_time[:40]!r} is not a yyyyMMddTHHmmssZ date-time",
            reason=MALFORMED_SIGNATURE,
        )
    if max_skew_s and abs(at - now_s) > max_skew_s:
        return Verdict(
            refusal=f"{DATE_TIME} {date_time} is more than {max_skew_s} s from the server's time "
            "(clients write their local time: run them with a correct clock, in UTC)",
            reason=STALE,
        )
    key = key_of(access_key)
    expected = sign(key if key is not None else "", string_to_sign(metadata, signed))
    # compared in constant time, and for an unknown key too, so timing tells nothing either
    given = bytes.fromhex(signature) if _SIGNATURE.fullmatch(signature) else b""
    if not hmac.compare_digest(bytes.fromhex(expected), given) or key is None:
        return Verdict(refusal=NO_MATCH, reason=BAD_SIGNATURE)
    method = metadata.get(METHOD, "") if nonce else ""
    return Verdict(access_key=access_key, method=method, nonce=nonce, signed_at_s=at)
