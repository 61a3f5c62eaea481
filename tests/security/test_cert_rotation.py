"""Certificate rotation under load (docs/SECURITY.md, probe 9), on a cluster of deploy/secure.yaml
(TLS on every port, users' auth on): while a producer sends, every process gets a new certificate
from the cluster's CA and reloads it (SIGHUP); then the master is killed, so that the producer
must reconnect, through the new certificates, to the slave that takes over. Every acknowledged
message is then read back, and every port of the live broker serves its new certificate."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.client.conftest import LocalCluster
from tests.client.test_tls import ca_of, ports, served_serial
from tests.security.conftest import secure  # noqa: F401 (a fixture)
from tidelog.client import AsyncClient
from tidelog.errors import TidelogError, UnauthenticatedError
from tidelog.localcluster import certs, client_options
from tidelog.proto import broker_pb2 as bpb
from tidelog.tasks import within

pytestmark = pytest.mark.slow

TOPIC = "rotate"
STEP = 100  # messages acknowledged between the steps


def _renew(c: LocalCluster, name: str) -> int:
    """A new certificate for process `name`, from the cluster's CA, written over its files."""
    tls = c.data_dir / "tls"
    return certs.issue(certs.Authority(tls / "ca.pem", tls / "ca.key"), tls, name, ["127.0.0.1"]).serial


def _wait_serial(address: str, c: LocalCluster, serial: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := served_serial(address, ca_of(c))) != serial:
        assert time.monotonic() < deadline, f"{address} still serves {seen}, not {serial}"
        time.sleep(0.1)


def _ports_once_known(c: LocalCluster, name: str) -> dict[str, str]:
    """`ports`, once the broker has learned the admin user (from a heartbeat reply after its start)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return ports(c, name)
        except UnauthenticatedError:
            assert time.monotonic() < deadline, f"{name} never learned the admin user"
        time.sleep(0.1)


def test_rotated_certificates_under_load_lose_nothing_acknowledged(secure: LocalCluster) -> None:  # noqa: F811
    pids = secure.pids()
    brokers = [n for n in pids if n.startswith("broker-")]
    addresses = {n: _ports_once_known(secure, n) for n in brokers}
    options = client_options(secure.state())

    async def go() -> tuple[list[bytes], set[str], str, dict[str, int]]:
        acked: list[bytes] = []
        codes: set[str] = set()
        stop = asyncio.Event()
        serials: dict[str, int] = {}
        async with AsyncClient(secure.controllers, send_timeout=30, **options) as client:
            await client.admin().create_topic(TOPIC, queues=2)

            async def produce() -> None:
                producer = client.producer()
                n = 0
                while not stop.is_set():
                    body = b"r-%06d" % n
                    n += 1
                    try:
                        await producer.send(TOPIC, body)
                    except TidelogError as exc:
                        codes.add(exc.code)
                        continue
                    acked.append(body)

            async def acked_more(count: int, what: str) -> None:
                want = len(acked) + count
                deadline = time.monotonic() + 60
                while len(acked) < want:
                    assert not task.done(), "the producer stopped"
                    assert time.monotonic() < deadline, f"no progress {what} (errors: {codes})"
                    await asyncio.sleep(0.05)

            task = asyncio.ensure_future(produce())
            try:
                await acked_more(STEP, "before the rotation")
                serials.update({n: _renew(secure, n) for n in brokers})
                serials["controller"] = _renew(secure, "controller")
                for pid in pids.values():
                    os.kill(pid, signal.SIGHUP)
                for n in brokers:
                    for address in addresses[n].values():
                        await asyncio.to_thread(_wait_serial, address, secure, serials[n])
                await acked_more(STEP, "after the rotation")
                master = ""
                for n in brokers:
                    reply = await client.call_broker(
                        addresses[n]["grpc"], "Status", bpb.StatusRequest(), timeout=5
                    )
                    if reply.role == "master":
                        master = n
                assert master, "no master"
                os.kill(pids[master], signal.SIGKILL)  # every client connection to it must be made again
                await acked_more(STEP, "after the master was killed")
            finally:
                stop.set()
                await within(task, 60)
        return acked, codes, master, serials

    acked, codes, master, serials = asyncio.run(go())
    survivor = next(n for n in brokers if n != master)
    for address in addresses[survivor].values():  # the new master serves the new certificate
        assert served_serial(address, ca_of(secure)) == serials[survivor]

    async def read_back() -> set[bytes]:
        got: set[bytes] = set()
        async with AsyncClient(secure.controllers, **options) as client:
            for queue in range(2):
                reader = client.reader(TOPIC, queue, 0)
                while batch := await reader.read(max_messages=500, timeout=2.0):
                    got.update(m.body for m in batch)
        return got

    stored = asyncio.run(read_back())
    lost = [b for b in acked if b not in stored]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost (errors seen: {codes})"
