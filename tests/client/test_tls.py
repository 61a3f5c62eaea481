"""Scenario: a cluster of deploy/secure.yaml started by `tide cluster up`, TLS on every port.

Produce and consume through the Python client and the CLI with the generated CA; a plain-text
client and a client that trusts another CA are refused on the gRPC ports, the data port and the
HA port; SIGHUP makes a broker and the controller serve a renewed certificate to new connections
(same pid, work in progress goes on); the kill -9 drill loses no acknowledged message.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.client.conftest import REPO, LocalCluster, runs_from, start_cluster, stop_cluster, tide
from tests.client.test_rocketmq_endpoint import drive
from tidelog import dataport_frames as df
from tidelog import tlsconfig
from tidelog.client import AsyncClient, Client
from tidelog.client.dataconn import DataConnection
from tidelog.errors import InvalidArgumentError, TidelogError, UnavailableError
from tidelog.ha.protocol import NONCE_BYTES, AuthHello, encode
from tidelog.localcluster import certs, client_options, client_tls
from tidelog.proto import broker_pb2 as bpb

pytestmark = pytest.mark.slow

SECURE = REPO / "deploy" / "secure.yaml"


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/secure.yaml with users' auth off: these tests are about TLS (auth: test_auth.py)."""
    topo = yaml.safe_load(SECURE.read_text())
    topo.pop("auth", None)
    path = tmp_path_factory.mktemp("topology") / "tls-only.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, tls_only: Path) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("secure"), tls_only)
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def stranger_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that signed nothing of the cluster's."""
    return certs.make_ca(tmp_path_factory.mktemp("stranger"), name="stranger").cert


def ca_of(c: LocalCluster) -> Path:
    return Path(c.up_doc["ca_file"])


def served_serial(address: str, ca: Path) -> int:
    """The serial of the certificate a new TLS connection to `address` is shown (verified by `ca`)."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])  # what a gRPC client offers
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(pem: Path) -> int:
    return x509.load_pem_x509_certificate(pem.read_bytes()).serial_number


def ports(c: LocalCluster, name: str) -> dict[str, str]:
    """The gRPC, HA, data and RocketMQ addresses of broker `name` (its config, and its Status for the
    data and RocketMQ ports)."""
    cfg = yaml.safe_load((c.data_dir / f"{name}.yaml").read_text())

    async def status() -> tuple[str, str]:
        # with the client pair as well, which a cluster with require_client_cert asks for, and the
        # admin's credentials of a cluster with auth on (deploy/secure.yaml itself: the drill)
        client = AsyncClient(c.controllers, **client_options(c.state()))
        client.tls = client_tls(c.state())
        async with client:
            reply = await client.call_broker(cfg["listen"], "Status", bpb.StatusRequest(), timeout=5)
            return str(reply.data_address), str(reply.rocketmq_address)

    data, rocketmq = asyncio.run(status())
    assert rocketmq, "the RocketMQ endpoint is on by default"
    return {"grpc": cfg["listen"], "ha": cfg["ha_listen"], "data": data, "rocketmq": rocketmq}


def test_up_prints_the_ca_and_every_port_serves_its_generated_certificate(secure: LocalCluster) -> None:
    doc = json.loads(secure.up_stdout)
    ca = Path(doc["ca_file"])
    assert ca.is_file() and ca.parent == secure.data_dir / "tls"
    ctrl = next(p for p in doc["processes"] if p["kind"] == "controller")
    assert served_serial(ctrl["address"], ca) == serial_of(secure.data_dir / "tls" / "controller.pem")
    for p in doc["processes"]:
        if p["kind"] == "broker":
            expected = serial_of(secure.data_dir / "tls" / f"{p['name']}.pem")
            for kind, address in ports(secure, p["name"]).items():
                assert served_serial(address, ca) == expected, (p["name"], kind)


def test_the_python_client_produces_and_consumes_over_tls(secure: LocalCluster) -> None:
    with Client(secure.controllers, ca_file=ca_of(secure), send_timeout=20.0) as client:
        client.admin().create_topic("tls-py", queues=1)
        producer = client.producer()
        sent = [f"m{i}".encode() for i in range(40)]
        for body in sent:
            producer.send("tls-py", body)
        consumer = client.consumer("g-py", "tls-py")
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            got.extend(m.body for m in consumer.poll(max_messages=100, timeout=0.5))
        assert got == sent
        # the reads went through the data port (over TLS): the plane holds an open connection
        assert any(not conn.closed for conn in client.aio.data._connections.values())


def test_the_cli_produces_and_consumes_with_the_ca_from_the_environment_or_the_option(
    secure: LocalCluster,
) -> None:
    env = {"TIDE_CONTROLLERS": secure.controllers, "TIDE_CA_FILE": str(ca_of(secure))}
    out = tide("topic", "create", "tls-cli", "--queues", "2", env=env)
    assert out.returncode == 0, out.stderr
    out = tide("produce", "tls-cli", "--count", "30", "--json", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["sent"] == 30, out.stderr
    # the run ends at the count (or after 3 idle seconds short of it): 30 distinct messages are all of them
    args = ("consume", "tls-cli", "--group", "g-cli", "--from-beginning", "--json", "--idle-timeout", "3")
    out = tide(*args, "--max-messages", "30", env=env)
    assert out.returncode == 0, out.stderr
    read = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert len({(m["queue"], m["offset"]) for m in read}) == len(read) == 30
    # the option instead of the variable
    option = ["--ca-file", str(ca_of(secure))]
    out = tide(
        *option, "topic", "describe", "tls-cli", "--json", env={"TIDE_CONTROLLERS": secure.controllers}
    )
    assert out.returncode == 0, out.stderr
    assert sum(q["max"] for q in json.loads(out.stdout)) == 30
    # and without either: refused (the controller speaks TLS only)
    out = tide(
        "topic",
        "describe",
        "tls-cli",
        env={"TIDE_CONTROLLERS": secure.controllers, "TIDE_CONTROLLER_TIMEOUT": "3"},
        timeout=60,
    )
    assert out.returncode != 0 and "requires TLS: pass --ca-file (or $TIDE_CA_FILE)" in out.stderr, out.stderr


def test_the_official_rocketmq_client_sends_and_receives_over_tls_trusting_the_ca(
    secure: LocalCluster, stranger_ca: Path
) -> None:
    """The official RocketMQ client with `tls_enable`, trusting what gRPC trusts by default,
    here the file GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names: the cluster's CA, then a stranger."""
    broker = next(p["name"] for p in secure.up_doc["processes"] if p["kind"] == "broker")
    endpoint = ports(secure, broker)["rocketmq"]
    with Client(secure.controllers, ca_file=ca_of(secure)) as client:
        client.admin().create_topic("tls-rmq", queues=2)
    trusted = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca_of(secure))}
    out = drive(endpoint, "tls", "tls-rmq", "g-rmq", "5", env=trusted)
    assert "error" not in out, out["error"]
    assert len(out["sent"]) == 5
    assert sorted(out["bodies"]) == [f"body-{i}" for i in range(5)]
    # a client that trusts another CA gets no connection: its first call (the route) fails
    stranger = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(stranger_ca)}
    refused = drive(endpoint, "tls", "tls-rmq", "g-rmq", "1", env=stranger)
    assert "error" in refused and "sent" not in refused, refused


async def _grpc_refused(c: LocalCluster, broker: str, ca_file: Path | None) -> None:
    """Both gRPC services refuse a client that speaks plain text (`ca_file` None) or trusts another CA."""
    env = {} if ca_file is None else {"TIDE_CA_FILE": str(ca_file)}
    saved = os.environ.pop("TIDE_CA_FILE", None)
    os.environ.update(env)
    try:
        # a refusal is retried until the send timeout, then raised: 1 s of retries shows it as well as 3
        async with AsyncClient(c.controllers, send_timeout=1.0, rpc_timeout=3.0) as client:
            # plain text is told what it lacks (the controller's port completes a TLS handshake)
            refusal = (InvalidArgumentError, "requires TLS") if ca_file is None else (UnavailableError, "")
            with pytest.raises(refusal[0], match=refusal[1]):
                await client.controller.describe_broker_sets([])
            with pytest.raises(UnavailableError):
                await client.call_broker(broker, "Status", bpb.StatusRequest(), timeout=3)
    finally:
        os.environ.pop("TIDE_CA_FILE", None)
        if saved is not None:
            os.environ["TIDE_CA_FILE"] = saved


async def _data_refused(address: str, tls: tlsconfig.ClientTls | None) -> None:
    conn = DataConnection(address, tls)
    try:
        call = df.PullCall("tls-py", 0, 0, 10, 0, 0)
        with pytest.raises(UnavailableError):
            await conn.call(df.OP_PULL, [df.pull_request(call)], 5.0)
    finally:
        await conn.close()


async def _ha_answer(address: str, tls: tlsconfig.ClientTls | None) -> bytes:
    """What the HA port answers to a slave's first frame (its hello); b"" when the connection is
    closed or its handshake fails."""
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await tlsconfig.open_connection(host, int(port), tls)
    except ssl.SSLError:
        assert tls is not None  # a plain connection always opens; a wrong CA fails its handshake
        return b""
    try:
        writer.write(encode(AuthHello("broker-a", 1, b"\0" * NONCE_BYTES)))
        await writer.drain()
        return await reader.read(1024)
    except (ConnectionError, ssl.SSLError):  # TLS 1.3: a refused certificate shows after the handshake
        return b""
    finally:
        writer.close()


def test_plain_text_and_a_wrong_ca_are_refused_on_every_port(secure: LocalCluster, stranger_ca: Path) -> None:
    addresses = ports(secure, "broker-a-0")

    async def go() -> None:
        for ca_file in (None, stranger_ca):
            await _grpc_refused(secure, addresses["grpc"], ca_file)
            tls = None if ca_file is None else tlsconfig.ClientTls(ca_file)
            await _data_refused(addresses["data"], tls)
            assert await _ha_answer(addresses["ha"], tls) == b""
        # the control: the same calls with the cluster's CA get through
        async with AsyncClient(secure.controllers, ca_file=ca_of(secure)) as client:
            await client.call_broker(addresses["grpc"], "Status", bpb.StatusRequest(), timeout=5)
        assert await _ha_answer(addresses["ha"], tlsconfig.ClientTls(ca_of(secure))) != b""

    asyncio.run(go())


def _renew(c: LocalCluster, name: str) -> int:
    """A new certificate for process `name`, signed by the cluster's CA, written over the old files."""
    tls_dir = c.data_dir / "tls"
    issued = certs.issue(
        certs.Authority(tls_dir / "ca.pem", tls_dir / "ca.key"), tls_dir, name, ["127.0.0.1"]
    )
    return issued.serial


def _wait_serial(address: str, ca: Path, serial: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := served_serial(address, ca)) != serial:
        assert time.monotonic() < deadline, f"{address} still serves {seen}, not {serial}"
        time.sleep(0.1)


def test_sighup_reloads_the_certificate_without_a_restart(secure: LocalCluster) -> None:
    ca = ca_of(secure)
    pids = secure.pids()
    addresses = ports(secure, "broker-a-0")
    ctrl_address = next(p["address"] for p in secure.up_doc["processes"] if p["kind"] == "controller")

    async def go() -> None:
        # a client whose connections were opened before the reload
        async with AsyncClient(secure.controllers, ca_file=ca) as client:
            await client.admin().create_topic("tls-reload", queues=2)
            producer = client.producer()
            for i in range(20):
                await producer.send("tls-reload", f"before-{i}".encode())
            old = {kind: served_serial(a, ca) for kind, a in addresses.items()}
            broker_serial = _renew(secure, "broker-a-0")
            ctrl_serial = _renew(secure, "controller")
            assert broker_serial not in old.values()
            os.kill(pids["broker-a-0"], signal.SIGHUP)
            os.kill(pids["controller-c1"], signal.SIGHUP)
            for address in addresses.values():
                await asyncio.to_thread(_wait_serial, address, ca, broker_serial)
            await asyncio.to_thread(_wait_serial, ctrl_address, ca, ctrl_serial)
            # the work in progress goes on, on connections opened before the reload and new ones
            for i in range(20):
                await producer.send("tls-reload", f"after-{i}".encode())
        async with AsyncClient(secure.controllers, ca_file=ca) as fresh:
            for i in range(5):
                await fresh.producer().send("tls-reload", f"fresh-{i}".encode())

    asyncio.run(go())
    assert secure.pids() == pids
    assert all(runs_from(pid, secure.data_dir) for pid in pids.values())
    # replication carries on over the reloaded HA port: the slave confirms everything
    env = {"TIDE_CONTROLLERS": secure.controllers, "TIDE_CA_FILE": str(ca)}
    deadline = time.monotonic() + 30
    while True:
        status = json.loads(tide("cluster", "status", "--json", env=env).stdout)
        members = status["broker_sets"][0]["members"]
        if len(members) == 2 and all(m["in_sync"] and m["lag"] == 0 and m["alive"] for m in members):
            break
        assert time.monotonic() < deadline, members
        time.sleep(0.5)
    logs = {name: (secure.data_dir / f"{name}.log").read_text() for name in ("broker-a-0", "controller-c1")}
    assert all("TLS certificate reloaded" in text for text in logs.values())


def test_drill_kill_master_with_tls_loses_no_acknowledged_message(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    c = cluster_factory(topology=SECURE, name="secure-drill")
    before = c.pids()
    # the drill finds the CA in the cluster's state: nothing in the environment
    out = tide(
        "drill",
        "kill-master",
        "broker-a",
        "--duration",
        "3s",  # the drill waits for the failover and the rejoin however long they take
        "--data-dir",
        str(c.data_dir),
        "--json",
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    assert report["acked"] > 0
    assert report["acked_lost"] == 0
    assert report["rejoin_s"] is not None and report["rejoin_s"] > 0, "the old master never rejoined"
    after = c.pids()
    (restarted,) = [name for name in before if before[name] != after[name]]
    # the restarted broker came back with TLS on every port, its certificate unchanged
    expected = serial_of(c.data_dir / "tls" / f"{restarted}.pem")
    for kind, address in ports(c, restarted).items():
        assert served_serial(address, ca_of(c)) == expected, kind


def test_a_tidelog_error_is_what_a_refused_client_sees(secure: LocalCluster, stranger_ca: Path) -> None:
    # the sync client with the wrong CA: one typed error, no traceback from ssl or grpc
    with Client(secure.controllers, ca_file=stranger_ca, send_timeout=1.0) as client:
        with pytest.raises(TidelogError) as err:
            client.admin().create_topic("never", queues=1)
        assert err.value.code == "UNAVAILABLE"


def test_mutual_tls_refuses_a_client_without_a_certificate(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    topo = yaml.safe_load(SECURE.read_text())
    topo["tls"] = {"require_client_cert": True}
    topo.pop("auth", None)  # clients below carry no user credentials: this is about mutual TLS
    path = tmp_path / "mutual.yaml"
    path.write_text(yaml.safe_dump(topo))
    c = cluster_factory(topology=path, name="mutual")  # the members reached each other: mTLS works
    doc = c.up_doc
    env = {
        "TIDE_CONTROLLERS": c.controllers,
        "TIDE_CA_FILE": doc["ca_file"],
        "TIDE_CERT_FILE": doc["cert_file"],
        "TIDE_KEY_FILE": doc["key_file"],
        "TIDE_CONTROLLER_TIMEOUT": "3",
    }
    out = tide("topic", "create", "mtls", "--queues", "1", env=env)
    assert out.returncode == 0, out.stderr
    out = tide("produce", "mtls", "--count", "10", "--json", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["sent"] == 10, out.stderr
    without = {k: v for k, v in env.items() if k not in ("TIDE_CERT_FILE", "TIDE_KEY_FILE")}
    without["TIDE_CONTROLLER_TIMEOUT"] = "1"  # refused at every try: a second of them is enough
    out = tide("topic", "describe", "mtls", env=without, timeout=60)
    assert out.returncode != 0 and "UNAVAILABLE" in out.stderr, out.stderr
    addresses = ports(c, "broker-a-0")  # (asks Status with the client pair from the state)

    async def go() -> None:
        await _data_refused(addresses["data"], tlsconfig.ClientTls(Path(doc["ca_file"])))
        assert await _ha_answer(addresses["ha"], tlsconfig.ClientTls(Path(doc["ca_file"]))) == b""

    asyncio.run(go())
