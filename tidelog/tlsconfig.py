"""TLS on every tidelog port and every connection to one: the only place TLS contexts are built.

Owns three things, used by every server and client of the project (docs/ARCHITECTURE.md §12.1):

- `TlsSettings` and `parse_section`: the `tls:` section of a broker or controller config (`cert`,
  `key`, `ca`, `require_client_cert`), checked up front: a missing file, a key without a
  certificate, a key that does not match, an unreadable CA are each a ConfigError naming the key
  (`tls.cert`, `tls.key`, `tls.ca`, ...), raised before anything listens.
- `ServerTls`: the server side of one process. The asyncio servers (HA port, data port) share one
  `ssl.SSLContext`; the gRPC port gets dynamic credentials whose fetcher grpc calls before each
  new handshake. `reload()` (SIGHUP) re-reads the files: the SSLContext's chain is swapped in
  place and the fetcher hands grpc the new pair, so new connections see the new certificate and
  open ones keep theirs.
- `ClientTls`: what a connection is made with: the CA that must have signed the server's
  certificate, and for mutual TLS the connecting side's own certificate and key. Clients take it
  from `$TIDE_CA_FILE` (`$TIDE_CERT_FILE`, `$TIDE_KEY_FILE`) or an explicit `ca_file`
  (`client_from_env`); cluster members from their own `tls:` section (`member_client`).

`aio_channel`, `open_connection`, `start_server` and `add_grpc_port` are the thin shells: plain
text when no TLS is given, TLS when it is. `aio_channel` takes optional gRPC call credentials:
the hook where per-call authentication plugs in, composed with the channel's TLS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tidelog.errors import ConfigError

log = logging.getLogger(__name__)

CA_FILE_ENV = "TIDE_CA_FILE"
CERT_FILE_ENV = "TIDE_CERT_FILE"
KEY_FILE_ENV = "TIDE_KEY_FILE"
SECTION_KEYS = ("cert", "key", "ca", "require_client_cert")
# A peer that connects and says nothing holds a slot of the asyncio server until this runs out
# (asyncio's own default is 60 s).
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TlsSettings:
    """The `tls:` section of a broker or controller config (paths as given, checked readable)."""

    cert: Path
    key: Path
    ca: Path
    # the ports of this process ask every peer for a certificate signed by `ca`
    require_client_cert: bool = False


# --- the config section -------------------------------------------------------------------


def _path(raw: Mapping[str, Any], name: str, source: str) -> Path:
    key = f"tls.{name}"
    value = raw.get(name)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {key} must be the path of a PEM file", key=key)
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"{source}: {key} {value} is not a readable file", key=key)
    return path


def parse_section(raw: Any, source: str = "config") -> TlsSettings:
    """The `tls:` mapping, checked: every file exists and loads, the key matches the certificate."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: tls must be a mapping of {', '.join(SECTION_KEYS)}", key="tls")
    unknown = sorted(set(raw) - set(SECTION_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key tls.{unknown[0]}", key=f"tls.{unknown[0]}")
    if raw.get("key") and not raw.get("cert"):
        raise ConfigError(f"{source}: tls.key is set without tls.cert", key="tls.cert")
    if raw.get("cert") and not raw.get("key"):
        raise ConfigError(f"{source}: tls.cert is set without tls.key", key="tls.key")
    require = raw.get("require_client_cert", False)
    if not isinstance(require, bool):
        raise ConfigError(
            f"{source}: tls.require_client_cert must be true or false", key="tls.require_client_cert"
        )
    settings = TlsSettings(
        _path(raw, "cert", source), _path(raw, "key", source), _path(raw, "ca", source), require
    )
    _server_context(settings, source)  # a file that does not load is refused now, not at the first peer
    return settings


def _load_chain(ctx: ssl.SSLContext, settings: TlsSettings, source: str) -> None:
    try:
        ctx.load_cert_chain(settings.cert, settings.key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{source}: tls.key {settings.key} does not load with tls.cert {settings.cert} "
            f"(not PEM, or not the certificate's key): {exc}",
            key="tls.key",
        ) from None


def _load_ca(ctx: ssl.SSLContext, settings: TlsSettings, source: str) -> None:
    try:
        ctx.load_verify_locations(cafile=str(settings.ca))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"{source}: tls.ca {settings.ca} is not a PEM certificate: {exc}", key="tls.ca"
        ) from None


def _server_context(settings: TlsSettings, source: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, settings, source)
    _load_ca(ctx, settings, source)
    ctx.verify_mode = ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_NONE
    return ctx


# --- the server side ----------------------------------------------------------------------


class ServerTls:
    """One process's server certificate, shared by its ports and reloaded in place on SIGHUP."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self.context = _server_context(settings, "tls")
        self._lock = threading.Lock()  # grpc calls the fetcher from its own threads
        self._pem = self._read()
        self._version = 0  # one more per reload: each gRPC port picks up the versions it has not seen
        self.reloads = 0

    def _read(self) -> tuple[bytes, bytes, bytes]:
        s = self.settings
        return s.key.read_bytes(), s.cert.read_bytes(), s.ca.read_bytes()

    def _grpc_config(self) -> Any:
        key, cert, ca = self._pem
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials for a gRPC port that pick up a reload at the next handshake (each port its
        own: a process may have several, a broker's own and its RocketMQ endpoint)."""
        with self._lock:
            initial = self._grpc_config()
            seen = [self._version]

        def fetch() -> Any:
            # Called before every new gRPC handshake of this port: None keeps the current pair.
            with self._lock:
                if seen[0] == self._version:
                    return None
                seen[0] = self._version
                return self._grpc_config()

        return grpc.dynamic_ssl_server_credentials(
            initial, fetch, require_client_authentication=self.settings.require_client_cert
        )

    def reload(self) -> None:
        """Re-read cert, key and CA from the same paths. A pair that does not load is refused with
        a ConfigError and the current one stays. A new CA is added to the trusted ones of the
        asyncio ports (OpenSSL cannot drop a loaded CA: a removed CA stays trusted there until the
        process restarts); the gRPC port trusts exactly the new file."""
        _server_context(self.settings, "tls reload")  # all or nothing: a bad pair changes nothing
        pem = self._read()
        _load_chain(self.context, self.settings, "tls reload")
        _load_ca(self.context, self.settings, "tls reload")
        with self._lock:
            self._pem = pem
            self._version += 1
        self.reloads += 1
        log.warning("TLS certificate reloaded from %s (new connections use it)", self.settings.cert)


def reload_on_signal(tls: ServerTls | None) -> None:
    """What SIGHUP does in a broker or controller: reload the TLS files; a pair that does not load
    is logged and the current one kept (the process goes on either way)."""
    if tls is None:
        log.info("SIGHUP: no tls section, nothing to reload")
        return
    try:
        tls.reload()
    except ConfigError as exc:
        log.error("SIGHUP: the TLS certificate was not reloaded, the current one stays: %s", exc)


# --- the client side ----------------------------------------------------------------------


@dataclass(frozen=True)
class ClientTls:
    """How to connect with TLS: the CA to verify the server with, and an own certificate for mTLS."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """A fresh context per call, so a member's reloaded certificate is used by its next connection."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def channel_credentials(self) -> grpc.ChannelCredentials:
        key = self.key_file.read_bytes() if self.key_file else None
        cert = self.cert_file.read_bytes() if self.cert_file else None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes(), private_key=key, certificate_chain=cert
        )


def _env_file(name: str, value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"{name} {value} is not a readable file", key=name)
    return path


def client_from_env(
    ca_file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] = os.environ
) -> ClientTls | None:
    """The client TLS of a tool or an application: `ca_file`, else `$TIDE_CA_FILE` (None: plain
    text), with `$TIDE_CERT_FILE` and `$TIDE_KEY_FILE` as its own certificate for mutual TLS."""
    ca = _env_file(CA_FILE_ENV, str(ca_file) if ca_file else environ.get(CA_FILE_ENV))
    if ca is None:
        return None
    cert = _env_file(CERT_FILE_ENV, environ.get(CERT_FILE_ENV))
    key = _env_file(KEY_FILE_ENV, environ.get(KEY_FILE_ENV))
    if (cert is None) != (key is None):
        missing = KEY_FILE_ENV if key is None else CERT_FILE_ENV
        raise ConfigError(
            f"{CERT_FILE_ENV} and {KEY_FILE_ENV} go together: {missing} is not set", key=missing
        )
    return ClientTls(ca, cert, key)


class FromEnv:
    """The type of FROM_ENV: a client constructor's default, "whatever the environment says"."""


FROM_ENV = FromEnv()


def resolve_client(tls: ClientTls | None | FromEnv) -> ClientTls | None:
    """A constructor's `tls` argument: FROM_ENV reads `$TIDE_CA_FILE`; None is plain text."""
    return client_from_env() if isinstance(tls, FromEnv) else tls


def member_client(settings: TlsSettings | None) -> ClientTls | None:
    """A cluster member connecting to another: verifies it against its own CA and presents its own
    certificate (which a peer with `require_client_cert` checks)."""
    if settings is None:
        return None
    return ClientTls(settings.ca, settings.cert, settings.key)


# --- the shells ---------------------------------------------------------------------------


def aio_channel(
    address: str,
    tls: ClientTls | None,
    options: Sequence[tuple[str, Any]] = (),
    call_credentials: grpc.CallCredentials | None = None,
    interceptors: Sequence[Any] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: plain text without `tls`, else TLS verified against its CA.
    `call_credentials` (TLS only) are sent with every call; `interceptors` see every call and its
    request (tidelog/credentials.py's `Signer` signs each one there)."""
    if tls is None:
        if call_credentials is not None:
            raise ConfigError("call credentials need TLS: set a CA file", key=CA_FILE_ENV)
        return grpc.aio.insecure_channel(
            address, options=list(options), interceptors=list(interceptors) or None
        )
    creds = tls.channel_credentials()
    if call_credentials is not None:
        creds = grpc.composite_channel_credentials(creds, call_credentials)
    return grpc.aio.secure_channel(
        address, creds, options=list(options), interceptors=list(interceptors) or None
    )


def _client_tls(host: str, tls: ClientTls | None) -> dict[str, Any]:
    """The TLS arguments of a client connection to `host` (its server name), none without TLS."""
    if tls is None:
        return {}
    return {"ssl": tls.ssl_context(), "server_hostname": host, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}


async def open_connection(
    host: str, port: int, tls: ClientTls | None, **kw: Any
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """`asyncio.open_connection`, with TLS (server name: `host`) when `tls` is given."""
    return await asyncio.open_connection(host, port, **_client_tls(host, tls), **kw)


async def create_connection(
    protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int, tls: ClientTls | None
) -> tuple[asyncio.BaseTransport, asyncio.BaseProtocol]:
    """`loop.create_connection`, with TLS (server name: `host`) when `tls` is given."""
    loop = asyncio.get_running_loop()
    return await loop.create_connection(protocol_factory, host, port, **_client_tls(host, tls))


async def start_server(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any],
    host: str,
    port: int,
    tls: ServerTls | None,
    **kw: Any,
) -> asyncio.Server:
    """`asyncio.start_server`, with TLS when `tls` is given: a peer that does not complete the
    handshake never reaches `handler`."""
    if tls is None:
        return await asyncio.start_server(handler, host, port, **kw)
    return await asyncio.start_server(
        handler, host, port, ssl=tls.context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S, **kw
    )


def add_grpc_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> int:
    """Bind `address` on a gRPC server, with TLS when `tls` is given; the port bound (0: failed)."""
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, tls.grpc_credentials()))
