"""A client's credentials and the metadata that signs its calls (the client side of tidelog/guard.py).

Owns:
- `Credentials`: a user's access key and secret, from the arguments or `$TIDE_ACCESS_KEY` /
  `$TIDE_SECRET_KEY` (`from_env`, read like `$TIDE_CA_FILE` in tidelog/tlsconfig.py). The
  signing key is derived from the secret once (tidelog/access.py); the secret never leaves
  this process.
- `Signer`: the grpc.aio client interceptor every channel of a client is opened with
  (tlsconfig.aio_channel): it adds a fresh signature to every call, so the date is that of the
  call; a cluster member's signer adds the cluster secret's token instead (tidelog/clusterauth.py).
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog import access
from tidelog.clusterauth import CALL_KEY, sign_call
from tidelog.errors import ConfigError

ACCESS_KEY_ENV = "TIDE_ACCESS_KEY"
SECRET_KEY_ENV = "TIDE_SECRET_KEY"


@dataclass(frozen=True)
class Credentials:
    """A user's access key and secret key, as `tide user create` printed them."""

    access_key: str
    secret_key: str = ""

    @functools.cached_property
    def signing_key(self) -> str:
        return access.signing_key(self.secret_key, self.access_key)

    def metadata(self, now_s: float | None = None, method: str = "") -> tuple[tuple[str, str], ...]:
        """The metadata entries signing one call of `method` made now, with a fresh nonce: a
        server takes the signature once, and for that method only."""
        return access.headers(
            self.access_key,
            self.signing_key,
            time.time() if now_s is None else now_s,
            method=method,
            nonce=secrets.token_hex(16),
        )


def new_credentials() -> Credentials:
    """A new user's access key and secret key (the secret is shown once, then only its derived key is kept)."""
    return Credentials("TK" + secrets.token_hex(9).upper(), secrets.token_urlsafe(30))


def from_env(
    access_key: str | None = None, secret_key: str | None = None, environ: Mapping[str, str] = os.environ
) -> Credentials | None:
    """The credentials given, else those of `$TIDE_ACCESS_KEY`/`$TIDE_SECRET_KEY`; None: none."""
    ak = access_key or environ.get(ACCESS_KEY_ENV) or ""
    sk = secret_key or environ.get(SECRET_KEY_ENV) or ""
    if not ak and not sk:
        return None
    if not ak or not sk:
        missing = ACCESS_KEY_ENV if not ak else SECRET_KEY_ENV
        raise ConfigError(
            f"an access key and a secret key go together: {missing} (or its option) is not set", key=missing
        )
    return Credentials(ak, sk)


class FromEnv:
    """The type of FROM_ENV: a constructor's default, "the environment's credentials, if any"."""


FROM_ENV = FromEnv()


def resolve(credentials: Credentials | None | FromEnv) -> Credentials | None:
    return from_env() if isinstance(credentials, FromEnv) else credentials


def _with(details: Any, extra: tuple[tuple[str, str], ...]) -> Any:
    metadata = list(details.metadata or ())
    metadata.extend(extra)
    return details._replace(metadata=grpc.aio.Metadata(*metadata))


class Signer(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
):
    """Signs every call of a channel: with a user's credentials, or (a cluster member, `secret`)
    with the cluster secret's token over the method and the request."""

    def __init__(self, credentials: Credentials | None = None, secret: str | None = None) -> None:
        self.credentials = credentials
        self.secret = secret

    def extra(self, method: str, request: Any) -> tuple[tuple[str, str], ...]:
        """The metadata signing one call of `method` (a full name) with `request` (None: a data
        port connection's AUTH frame, which has none)."""
        if self.secret:
            token = sign_call(
                self.secret,
                method.rpartition("/")[2],
                request.SerializeToString(deterministic=True) if request is not None else b"",
                "",
                -1,
                int(time.time() * 1000),
            )
            return ((CALL_KEY, token),)
        if self.credentials is not None:
            return self.credentials.metadata(method=method)
        return ()

    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        return await continuation(_with(client_call_details, self.extra(method, request)), request)

    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        return await continuation(_with(client_call_details, self.extra(method, request)), request)


def signer(credentials: Credentials | None, secret: str | None = None) -> Signer | None:
    """The interceptor for a client's channels; None when there is nothing to sign with."""
    return Signer(credentials, secret) if credentials is not None or secret else None
