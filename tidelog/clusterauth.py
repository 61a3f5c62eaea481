"""The cluster secret: proofs that a peer (broker, controller node) belongs to this cluster.

Theory of operation
-------------------
Every member of a cluster (controller nodes and brokers) is configured with one shared secret
(config key `secret`, or the environment variable `TIDE_CLUSTER_SECRET`). A member proves it
knows the secret without sending it: it answers an HMAC-SHA256 over a *purpose* string, the
identity it claims (broker set, broker id) and fresh nonces from both sides. Binding the
identity into the MAC means a proof for broker 1 cannot be replayed as broker 2; binding both
nonces means a recorded exchange cannot be replayed on a new connection; the purpose string
keeps a proof made for one protocol step from being accepted for another.

Fields are length-prefixed before they are MACed, so no two different field lists encode to
the same bytes ("ab" + "c" is not "a" + "bc").

Calls to the controller that change membership (register, heartbeat, SyncStateSet change,
election, cleaning) carry `sign_call`'s token in gRPC metadata (`CALL_KEY`): the claimed broker
set and broker id, the time, a fresh nonce and an HMAC over those, the method and the serialized
request. The controller accepts a token only within `CALL_WINDOW_MS` of its own clock and only
once (`ReplayCache`), so a recorded call cannot be replayed, and a token for one request, method
or broker is worthless for another. A gRPC call has no round trip to spare for a challenge;
time plus a remembered nonce gives the same freshness.

This module is pure (no I/O): the HA handshake and the controller service call it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
from collections import OrderedDict
from typing import NamedTuple

from tidelog.errors import ConfigError, UnauthenticatedError
from tidelog.private import require_private

__all__ = [
    "CALL_KEY",
    "CALL_WINDOW_MS",
    "NONCE_BYTES",
    "PROOF_BYTES",
    "SECRET_ENV",
    "CallIdentity",
    "ReplayCache",
    "check_call",
    "new_nonce",
    "new_secret",
    "prove",
    "secret_from_env",
    "sign_call",
    "token_problem",
    "verify",
]

SECRET_ENV = "TIDE_CLUSTER_SECRET"
NONCE_BYTES = 16
PROOF_BYTES = 32

_LEN = struct.Struct(">I")


def new_nonce() -> bytes:
    """A fresh random challenge."""
    return secrets.token_bytes(NONCE_BYTES)


def new_secret() -> str:
    """A random secret for a cluster that was given none (`tide cluster up`, a lone controller)."""
    return secrets.token_hex(16)


def secret_from_env() -> str | None:
    return os.environ.get(SECRET_ENV) or None


# The value the example configs in deploy/ carry: a cluster running with it is open to anyone
# who has read the examples, so no process starts with it.
PLACEHOLDER_SECRETS = frozenset({"change-me-to-a-long-random-string"})


def require_real_secret(secret: str) -> None:
    """Refuse the examples' placeholder secret at start-up."""
    if secret.strip() in PLACEHOLDER_SECRETS:
        raise ConfigError(
            "the cluster secret is still the example's placeholder",
            key="secret",
            hint="generate one (python -c 'import secrets; print(secrets.token_urlsafe(32))') "
            "and put the same value in every controller and broker config",
        )


def find_secret(secret_file: str | None = None, data_dir: str | None = None) -> str | None:
    """The cluster secret for an operator's command: `secret_file` (its first line; refused while
    group or others may read it), else
    `$TIDE_CLUSTER_SECRET`, else the `secret` of `<data_dir>/controller.yaml` as written by
    `tide cluster up`. None when there is none of these."""
    if secret_file:
        # a secret others can read is everyone's: refused, as OpenSSH refuses such a key
        require_private(secret_file, "secret file")
        try:
            with open(secret_file) as f:
                text = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the secret file {secret_file}: {exc.strerror}") from exc
        if not text:
            raise ConfigError(f"the secret file {secret_file} is empty")
        return text
    env = secret_from_env()
    if env:
        return env
    if data_dir:
        path = os.path.join(data_dir, "controller.yaml")
        if os.path.exists(path):
            import yaml

            try:
                with open(path) as f:
                    doc = yaml.safe_load(f) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"cannot read the cluster secret from {path}: {exc}") from exc
            secret = doc.get("secret") if isinstance(doc, dict) else None
            return str(secret) if secret else None
    return None


def _encode(fields: tuple[bytes | str | int, ...]) -> bytes:
    parts: list[bytes] = []
    for f in fields:
        if isinstance(f, bool):
            raise TypeError("booleans are not proof fields")
        if isinstance(f, int):
            raw = str(f).encode()
        elif isinstance(f, str):
            raw = f.encode("utf-8")
        elif isinstance(f, bytes | bytearray | memoryview):
            raw = bytes(f)
        else:
            raise TypeError(f"cannot put a {type(f).__name__} into a proof")
        parts.append(_LEN.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def prove(secret: str, purpose: str, *fields: bytes | str | int) -> bytes:
    """HMAC-SHA256 (32 bytes) of `purpose` and `fields` under the cluster secret."""
    if not secret:
        raise ValueError("no cluster secret configured")
    return hmac.new(secret.encode("utf-8"), _encode((purpose, *fields)), hashlib.sha256).digest()


def verify(secret: str, proof: bytes, purpose: str, *fields: bytes | str | int) -> bool:
    """Whether `proof` is `prove(secret, purpose, *fields)`; constant-time comparison."""
    if not secret or not isinstance(proof, bytes | bytearray) or len(proof) != PROOF_BYTES:
        return False
    return hmac.compare_digest(bytes(proof), prove(secret, purpose, *fields))


# --- signed controller calls ---------------------------------------------------------------

CALL_KEY = "tide-cluster-auth"
CALL_PURPOSE = "tidelog-controller-call-v1"
CALL_WINDOW_MS = 30_000
_MAX_TOKEN = 512


class CallIdentity(NamedTuple):
    """Who a verified call says it comes from (`broker_id` -1: an operator's command)."""

    broker_set: str
    broker_id: int


def sign_call(
    secret: str,
    method: str,
    request: bytes,
    broker_set: str,
    broker_id: int,
    now_ms: int,
    nonce: bytes | None = None,
) -> str:
    """The metadata value proving the secret for this one call."""
    nonce = nonce if nonce is not None else new_nonce()
    mac = prove(secret, CALL_PURPOSE, method, broker_set, broker_id, now_ms, nonce, request)
    return f"v1:{broker_set.encode().hex()}:{broker_id}:{now_ms}:{nonce.hex()}:{mac.hex()}"


class ReplayCache:
    """Nonces seen within the window, oldest first; bounded so a flood cannot grow it without end.

    An entry is dropped freely once its call could no longer pass the clock check (received more
    than two windows ago). Dropping one earlier, because the cache is full, would let that call be
    replayed; so the cache raises its *floor* to the dropped call's signed time, and every call
    signed at or before the floor is refused from then on (`admits`). Under a flood of valid
    calls the cost is that a broker whose clock lags must sign again, never a replay.
    """

    def __init__(self, window_ms: int = CALL_WINDOW_MS, limit: int = 200_000) -> None:
        self.window_ms = window_ms
        self.limit = limit
        self.floor_ms: int | None = None
        self._seen: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # nonce -> (received, signed)

    def admits(self, signed_ms: int) -> bool:
        """False for a call signed at or before a nonce the cache had to forget early."""
        return self.floor_ms is None or signed_ms > self.floor_ms

    def add(self, nonce: bytes, now_ms: int, signed_ms: int | None = None) -> bool:
        """Remember `nonce` of a call signed at `signed_ms` (default `now_ms`); False if it was
        already seen (a replay) or is not admitted."""
        signed = now_ms if signed_ms is None else signed_ms
        while self._seen:
            received, at = next(iter(self._seen.values()))
            if received >= now_ms - 2 * self.window_ms and len(self._seen) < self.limit:
                break
            self._seen.popitem(last=False)
            if received >= now_ms - 2 * self.window_ms:  # still replayable: nothing signed by then passes
                self.floor_ms = at if self.floor_ms is None else max(self.floor_ms, at)
        if nonce in self._seen or not self.admits(signed):
            return False
        self._seen[nonce] = (now_ms, signed)
        return True


def token_problem(token: str, now_ms: int, window_ms: int = CALL_WINDOW_MS) -> str | None:
    """Why a call token cannot verify whatever the request (its shape, its time), or None: what a
    server checks from the metadata alone, before it parses the request the MAC covers."""
    if len(token) > _MAX_TOKEN:
        return "malformed authentication token"
    parts = token.split(":")
    if len(parts) != 6 or parts[0] != "v1":
        return "malformed authentication token"
    try:
        bytes.fromhex(parts[1]).decode()
        int(parts[2])
        at = int(parts[3])
        nonce, mac = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except (ValueError, UnicodeDecodeError):
        return "malformed authentication token"
    if len(nonce) != NONCE_BYTES or len(mac) != PROOF_BYTES:
        return "malformed authentication token"
    if abs(now_ms - at) > window_ms:
        return f"the call was signed {abs(now_ms - at) / 1000:.0f}s away from this server's clock"
    return None


def check_call(
    secret: str, token: str | None, method: str, request: bytes, now_ms: int, seen: ReplayCache
) -> CallIdentity:
    """The identity a signed call proves, or UnauthenticatedError saying why not."""
    if not token:
        raise UnauthenticatedError(f"{method} changes cluster membership and must prove the cluster secret")
    if len(token) > _MAX_TOKEN:
        raise UnauthenticatedError("malformed authentication token")
    try:
        version, bset_hex, bid, ts, nonce_hex, mac_hex = token.split(":")
        broker_set = bytes.fromhex(bset_hex).decode()
        broker_id, at = int(bid), int(ts)
        nonce, mac = bytes.fromhex(nonce_hex), bytes.fromhex(mac_hex)
    except (ValueError, UnicodeDecodeError):
        raise UnauthenticatedError("malformed authentication token") from None
    if version != "v1" or len(nonce) != NONCE_BYTES:
        raise UnauthenticatedError("malformed authentication token")
    if abs(now_ms - at) > seen.window_ms:
        raise UnauthenticatedError(
            f"the call was signed {abs(now_ms - at) / 1000:.0f}s away from this controller's clock",
            hint="synchronise the clocks (NTP) of brokers and controllers",
        )
    if not verify(secret, mac, CALL_PURPOSE, method, broker_set, broker_id, at, nonce, request):
        raise UnauthenticatedError("the cluster secret was not proven")
    if not seen.admits(at):
        raise UnauthenticatedError(
            "the controller had to forget calls signed this early (a flood of calls); sign the call again"
        )
    if not seen.add(nonce, now_ms, at):
        raise UnauthenticatedError("this signed call was already used (a replay)")
    return CallIdentity(broker_set, broker_id)
