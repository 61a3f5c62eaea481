"""tidelog/tlsconfig.py: the `tls:` section's checks (each a ConfigError naming its key), the
client side from the environment, and in-process servers: a peer without the right CA or, with
`require_client_cert`, without a certificate is refused; a reload changes the certificate the
next connection sees, on an asyncio port and on a gRPC port alike."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from tidelog import tlsconfig
from tidelog.broker.config import from_mapping as broker_config
from tidelog.controller.config import parse as controller_config
from tidelog.errors import ConfigError
from tidelog.localcluster import certs, load_topology
from tidelog.proto import broker_pb2, broker_pb2_grpc


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(d)
    other = certs.make_ca(d, name="other-ca")
    server = certs.issue(ca, d, "server", ["127.0.0.1"])
    client = certs.issue(ca, d, "client", [])
    stranger = certs.issue(other, d, "stranger", [])
    return {"dir": d, "ca": ca, "other": other, "server": server, "client": client, "stranger": stranger}


def section(pki: dict[str, Any], **over: Any) -> dict[str, Any]:
    doc = {"cert": str(pki["server"].cert), "key": str(pki["server"].key), "ca": str(pki["ca"].cert)}
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


# --- the config section -------------------------------------------------------------------


def test_a_complete_section_is_accepted_by_brokers_and_controllers(pki: dict[str, Any]) -> None:
    cfg = broker_config(
        {
            "broker_set": "b",
            "data_dir": "/x",
            "controllers": "127.0.0.1:1",
            "secret": "s",
            "tls": section(pki),
        }
    )
    assert cfg.tls is not None and cfg.tls.cert == pki["server"].cert and not cfg.tls.require_client_cert
    ctrl = controller_config(
        {
            "nodes": [{"id": "c1", "raft": "127.0.0.1:1", "grpc": "127.0.0.1:2"}],
            "data_dir": "/x",
            "secret": "s",
            "tls": section(pki, require_client_cert=True),
        }
    )
    assert ctrl.tls is not None and ctrl.tls.require_client_cert
    # without the section: plain text, as before
    assert (
        broker_config({"broker_set": "b", "data_dir": "/x", "controllers": "h:1", "secret": "s"}).tls is None
    )


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"cert": None}, "tls.cert"),  # a key without a certificate
        ({"key": None}, "tls.key"),  # a certificate without its key
        ({"ca": None}, "tls.ca"),
        ({"cert": "/nonexistent/cert.pem"}, "tls.cert"),
        ({"key": "/nonexistent/key.pem"}, "tls.key"),
        ({"ca": "/nonexistent/ca.pem"}, "tls.ca"),
        ({"require_client_cert": "yes"}, "tls.require_client_cert"),
        ({"password": "x"}, "tls.password"),
    ],
)
def test_each_mistake_is_a_config_error_naming_its_key(
    pki: dict[str, Any], over: dict[str, Any], key: str
) -> None:
    for parse in (
        lambda tls: broker_config(
            {"broker_set": "b", "data_dir": "/x", "controllers": "h:1", "secret": "s", "tls": tls}
        ),
        lambda tls: controller_config(
            {
                "nodes": [{"id": "c1", "raft": "h:1", "grpc": "h:2"}],
                "data_dir": "/x",
                "secret": "s",
                "tls": tls,
            }
        ),
    ):
        with pytest.raises(ConfigError) as err:
            parse(section(pki, **over))
        assert err.value.details.get("key") == key, err.value


def test_files_that_do_not_load_are_refused_at_start(pki: dict[str, Any], tmp_path: Path) -> None:
    # the client's key with the server's certificate: both load, they do not belong together
    with pytest.raises(ConfigError) as err:
        tlsconfig.parse_section(section(pki, key=str(pki["client"].key)))
    assert err.value.details["key"] == "tls.key"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError) as err:
        tlsconfig.parse_section(section(pki, ca=str(garbage)))
    assert err.value.details["key"] == "tls.ca"
    with pytest.raises(ConfigError) as err:
        tlsconfig.parse_section(section(pki, cert=str(garbage)))
    assert err.value.details["key"] == "tls.key"  # the pair does not load: named by its key
    with pytest.raises(ConfigError) as err:
        tlsconfig.parse_section("on")
    assert err.value.details["key"] == "tls"


def test_the_client_side_comes_from_the_environment_or_an_explicit_file(pki: dict[str, Any]) -> None:
    assert tlsconfig.client_from_env(environ={}) is None
    ca = str(pki["ca"].cert)
    assert tlsconfig.client_from_env(environ={"TIDE_CA_FILE": ca}) == tlsconfig.ClientTls(pki["ca"].cert)
    assert tlsconfig.client_from_env(ca, environ={}) == tlsconfig.ClientTls(pki["ca"].cert)
    with pytest.raises(ConfigError) as err:
        tlsconfig.client_from_env(environ={"TIDE_CA_FILE": "/nonexistent/ca.pem"})
    assert err.value.details["key"] == "TIDE_CA_FILE"
    with pytest.raises(ConfigError) as err:
        tlsconfig.client_from_env(environ={"TIDE_CA_FILE": ca, "TIDE_CERT_FILE": str(pki["client"].cert)})
    assert err.value.details["key"] == "TIDE_KEY_FILE"


def test_a_topology_tls_section_takes_require_client_cert_only(tmp_path: Path) -> None:
    topo = tmp_path / "t.yaml"
    topo.write_text("broker_sets: [{name: a, replicas: 1}]\ntls: {require_client_cert: true}\n")
    assert load_topology(topo).tls == {"require_client_cert": True}
    topo.write_text("broker_sets: [{name: a, replicas: 1}]\ntls: {cert: x.pem}\n")
    with pytest.raises(ConfigError) as err:
        load_topology(topo)
    assert err.value.details["key"] == "tls.cert"


def test_the_secure_topology_turns_tls_on() -> None:
    topo = load_topology(Path(__file__).resolve().parents[1] / "deploy" / "secure.yaml")
    assert topo.tls is not None


# --- servers ------------------------------------------------------------------------------


def served_serial(port: int, ca: Path) -> int:
    """The serial of the certificate a TLS port presents to a new connection (verified against `ca`)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])  # what a gRPC client offers
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.readexactly(4))
    await writer.drain()
    writer.close()


async def _exchange(port: int, tls: tlsconfig.ClientTls | None) -> bytes:
    reader, writer = await tlsconfig.open_connection("127.0.0.1", port, tls)
    try:
        writer.write(b"ping\n")  # 5 bytes: a whole record header, so a TLS port answers at once
        await writer.drain()
        return await reader.read(4)
    finally:
        writer.close()


def test_an_asyncio_port_refuses_plain_text_and_a_wrong_ca_and_reloads(
    pki: dict[str, Any], tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    # a copy of the server pair, so that the reload can replace it
    ca = pki["ca"]
    pair = certs.issue(ca, tmp_path, "srv", ["127.0.0.1"])
    server_tls = tlsconfig.ServerTls(
        tlsconfig.parse_section({"cert": str(pair.cert), "key": str(pair.key), "ca": str(ca.cert)})
    )

    async def go() -> None:
        server = await tlsconfig.start_server(_echo, "127.0.0.1", 0, server_tls)
        port = server.sockets[0].getsockname()[1]
        try:
            assert await _exchange(port, tlsconfig.ClientTls(ca.cert)) == b"ping"
            assert await _exchange(port, None) == b""  # plain text: closed without an answer
            with pytest.raises(ssl.SSLCertVerificationError):
                await _exchange(port, tlsconfig.ClientTls(pki["other"].cert))
            assert await asyncio.to_thread(served_serial, port, ca.cert) == pair.serial
            renewed = certs.issue(ca, tmp_path, "srv", ["127.0.0.1"])
            server_tls.reload()
            assert await asyncio.to_thread(served_serial, port, ca.cert) == renewed.serial != pair.serial
            assert await _exchange(port, tlsconfig.ClientTls(ca.cert)) == b"ping"
        finally:
            server.close()

    loop.run_until_complete(go())


def test_require_client_cert_refuses_a_client_without_one(
    pki: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> None:
    server_tls = tlsconfig.ServerTls(tlsconfig.parse_section(section(pki, require_client_cert=True)))
    ca = pki["ca"].cert

    async def go() -> None:
        server = await tlsconfig.start_server(_echo, "127.0.0.1", 0, server_tls)
        port = server.sockets[0].getsockname()[1]
        try:
            member = tlsconfig.ClientTls(ca, pki["client"].cert, pki["client"].key)
            assert await _exchange(port, member) == b"ping"
            for refused in (
                tlsconfig.ClientTls(ca),  # no certificate
                tlsconfig.ClientTls(ca, pki["stranger"].cert, pki["stranger"].key),  # another CA's
            ):
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    answer = await _exchange(port, refused)
                    # TLS 1.3: the server's refusal arrives after the client's handshake ends
                    assert answer == b"", answer
                    raise ConnectionError("closed without an answer")
        finally:
            server.close()

    loop.run_until_complete(go())


def test_a_grpc_port_speaks_tls_only_and_picks_up_a_reload(
    pki: dict[str, Any], tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    ca = pki["ca"]
    pair = certs.issue(ca, tmp_path, "grpc", ["127.0.0.1"])
    server_tls = tlsconfig.ServerTls(
        tlsconfig.parse_section({"cert": str(pair.cert), "key": str(pair.key), "ca": str(ca.cert)})
    )

    async def status(tls: tlsconfig.ClientTls | None, address: str) -> grpc.StatusCode:
        async with tlsconfig.aio_channel(address, tls) as channel:
            try:
                await broker_pb2_grpc.BrokerStub(channel).Status(broker_pb2.StatusRequest(), timeout=3)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    async def go() -> None:
        server = grpc.aio.server()  # no service: a call that gets through is UNIMPLEMENTED
        port = tlsconfig.add_grpc_port(server, "127.0.0.1:0", server_tls)
        await server.start()
        address = f"127.0.0.1:{port}"
        try:
            assert await status(tlsconfig.ClientTls(ca.cert), address) == grpc.StatusCode.UNIMPLEMENTED
            assert await status(None, address) == grpc.StatusCode.UNAVAILABLE
            assert (
                await status(tlsconfig.ClientTls(pki["other"].cert), address) == grpc.StatusCode.UNAVAILABLE
            )
            assert await asyncio.to_thread(served_serial, port, ca.cert) == pair.serial
            renewed = certs.issue(ca, tmp_path, "grpc", ["127.0.0.1"])
            server_tls.reload()
            assert await asyncio.to_thread(served_serial, port, ca.cert) == renewed.serial
            assert await status(tlsconfig.ClientTls(ca.cert), address) == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await server.stop(0)

    loop.run_until_complete(go())


def test_a_reload_that_does_not_load_keeps_the_current_certificate(
    pki: dict[str, Any], tmp_path: Path
) -> None:
    ca = pki["ca"]
    pair = certs.issue(ca, tmp_path, "keep", ["127.0.0.1"])
    server_tls = tlsconfig.ServerTls(
        tlsconfig.parse_section({"cert": str(pair.cert), "key": str(pair.key), "ca": str(ca.cert)})
    )
    good = pair.cert.read_bytes()
    pair.cert.write_text("half written\n")
    with pytest.raises(ConfigError):
        server_tls.reload()
    tlsconfig.reload_on_signal(server_tls)  # what SIGHUP does: logged, the process goes on
    assert server_tls.reloads == 0
    pair.cert.write_bytes(good)
    server_tls.reload()
    assert server_tls.reloads == 1
