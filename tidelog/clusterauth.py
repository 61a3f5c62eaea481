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

This module is pure (no I/O): the HA handshake and the controller service call it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct

__all__ = ["NONCE_BYTES", "PROOF_BYTES", "SECRET_ENV", "new_nonce", "new_secret", "prove", "secret_from_env",
           "verify"]

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
