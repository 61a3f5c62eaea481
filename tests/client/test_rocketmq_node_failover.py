"""The official RocketMQ Node.js client (rocketmq-client-nodejs, unmodified) given one DNS name that
resolves to several brokers' RocketMQ endpoints: when the endpoint it is connected to dies, it
goes on sending and receiving through another, losing no acknowledged message.

This client cannot take several addresses (it joins `a;b` into one gRPC target that grpc-js cannot
resolve), so a name with several records is how it gets failover: grpc-js resolves the name to
every address (`dns.lookup(name, {all: true})`, the system's resolver), connects to the first that
answers (pick_first) and, once that connection drops, to the next. The routes name the same name,
since the endpoint answers QueryRoute with the access point the client asked through.

Several records for one name without a DNS server: the endpoints share one port on two loopback
addresses (127.0.0.2 and 127.0.0.3: both broker sets' slaves, moved there after `cluster up`),
and the Node process runs in a mount namespace of its own (`unshare --mount`, root only) in which
a hosts file naming both is bind-mounted over /etc/hosts for that process alone. The client and
grpc-js resolve the name as in production, through getaddrinfo; the machine's /etc/hosts is never
touched, and the mount goes away with the process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster
from tests.client.test_rocketmq_node import DRIVER, INSTALLED, NODE_DIR
from tidelog import localcluster
from tidelog.localcluster import wait_until

#: A name in the reserved `.test` domain (RFC 2606): no DNS server knows it.
NAME = "rocketmq.tidelog.test"
#: The loopback addresses the two endpoints behind NAME listen on, by broker set.
ADDRESSES = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("node") is None or not INSTALLED,
        reason="needs node and `npm ci` in tests/client/node (make test does both)",
    ),
]


def _in_own_hosts(hosts: Path, command: list[str]) -> list[str]:
    """`command` run with `hosts` as its /etc/hosts: a bind mount in a mount namespace of its own
    (private, so nothing reaches the machine's). `exec` keeps the command's pid the one started."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts), *command]


def _shared_port() -> int:
    """A port free on every address of ADDRESSES (each bound, then let go)."""
    addresses = list(ADDRESSES.values())
    for _ in range(20):
        socks = [socket.socket()]
        try:
            socks[0].bind((addresses[0], 0))
            port = int(socks[0].getsockname()[1])
            for address in addresses[1:]:
                socks.append(socket.socket())
                socks[-1].bind((address, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no port free on all of {addresses}")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The machine's hosts file with NAME on every address of ADDRESSES, once a process can be
    given it as its own and those addresses can be listened on (else the module is skipped)."""
    path = tmp_path_factory.mktemp("hosts") / "hosts"
    lines = [f"{address} {NAME}" for address in ADDRESSES.values()]
    path.write_text(Path("/etc/hosts").read_text() + "\n" + "\n".join(lines) + "\n")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to give the client a hosts file of its own")
    probe = subprocess.run(
        _in_own_hosts(path, ["getent", "ahostsv4", NAME]), capture_output=True, text=True, timeout=20
    )
    found = {line.split()[0] for line in probe.stdout.splitlines() if line.strip()}
    if probe.returncode != 0 or found != set(ADDRESSES.values()):
        pytest.skip(f"no mount namespace of its own for the client (needs root): {probe.stderr.strip()}")
    try:
        _shared_port()
    except (OSError, AssertionError) as exc:  # a system whose loopback is 127.0.0.1 alone
        pytest.skip(f"cannot listen on {sorted(ADDRESSES.values())}: {exc}")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, hosts: Path) -> Iterator[tuple[LocalCluster, int]]:
    """Two broker sets whose slaves serve RocketMQ on ADDRESSES at one port (returned with the
    cluster): each is killed, given its address, and started again, after `cluster up` (the
    topology's broker keys are every broker's, and these two need an address each)."""
    with rc.two_sets(tmp_path_factory.mktemp("rmqnodefail")) as c:
        port = _shared_port()
        slaves = {s: rc.member(c, s, "slave")["name"] for s in ADDRESSES}
        for broker_set, name in slaves.items():
            localcluster.kill(c.data_dir, name, signal.SIGKILL)  # a slave: its master serves on
            config = c.data_dir / f"{name}.yaml"
            doc = yaml.safe_load(config.read_text())
            doc["rocketmq_listen"] = doc["rocketmq_advertise_address"] = f"{ADDRESSES[broker_set]}:{port}"
            localcluster.write_config(config, doc)
        for name in slaves.values():
            localcluster.restart(c.data_dir, name)
        wanted = {(name, f"{ADDRESSES[s]}:{port}") for s, name in slaves.items()}

        def back() -> bool:
            return wanted <= {
                (m["name"], m["rocketmq_endpoint"]) for m in rc.members(c) if m["role"] == "slave"
            }

        wait_until(back, 30, 0.2, what=f"the slaves back with their RocketMQ endpoints {sorted(wanted)}")
        yield c, port


def _connected_to(pid: int, port: int) -> set[str]:
    """The remote IPv4 addresses of process `pid`'s established TCP connections to `port` (its
    sockets in /proc/PID/fd, looked up in /proc/PID/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        address_hex, port_hex = remote.split(":")
        if state == "01" and inode in inodes and int(port_hex, 16) == port:  # 01: ESTABLISHED
            out.add(socket.inet_ntoa(struct.pack("<I", int(address_hex, 16))))
    return out


def _receipts_so_far(progress: Path) -> int:
    """How many sends the driver has had receipted (its progress file; 0 before the first)."""
    try:
        return int(progress.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0  # not written yet, or read while being written


def test_a_name_of_several_endpoints_fails_over_when_the_connected_one_is_killed(
    cluster: tuple[LocalCluster, int], hosts: Path, tmp_path: Path
) -> None:
    c, port = cluster
    rc.create_topic(c, "node-failover")
    env = {**os.environ, "HOME": str(tmp_path)}  # the client logs into files under $HOME
    ready, stop, progress = tmp_path / "ready", tmp_path / "stop", tmp_path / "progress"
    args = {
        "topic": "node-failover",
        "group": "g-node-failover",
        "seconds": 120,  # a bound: the test ends the run through stopFile once it has what it needs
        "readyFile": str(ready),
        "stopFile": str(stop),
        "progressFile": str(progress),
        "readyDelivered": 20,  # sent and received through the name before the kill
    }
    command = _in_own_hosts(
        hosts, ["node", str(DRIVER), f"{NAME}:{port}", "produce-consume", json.dumps(args)]
    )
    with rc.driver_run(command, cwd=NODE_DIR, env=env) as driver:
        wait_until(lambda: ready.exists() or driver.poll() is not None, 60, 0.1, what="messages flowing")
        assert ready.exists(), driver.communicate()[1][-3000:]

        # pick_first: one connection, to one of the name's addresses
        def one_connection() -> set[str] | bool:
            if driver.poll() is not None:
                return True  # over: said below
            found = _connected_to(driver.pid, port)
            return found if len(found) == 1 else set()

        connected = wait_until(one_connection, 20, 0.1, what="one connection")
        assert driver.poll() is None, (
            f"the client ended (exit {driver.returncode}): {driver.communicate()[1][-3000:]}"
        )
        (used,) = connected
        (other,) = set(ADDRESSES.values()) - {used}
        victim = next(m["name"] for m in rc.members(c) if m["rocketmq_endpoint"] == f"{used}:{port}")
        localcluster.kill(c.data_dir, victim, signal.SIGKILL)
        killed_ms = time.time() * 1000
        at_kill = _receipts_so_far(progress)
        wait_until(
            lambda: driver.poll() is not None or _connected_to(driver.pid, port) == {other},
            30,
            0.1,
            what=f"a connection to {other}",
        )
        assert driver.poll() is None, (
            f"the client ended (exit {driver.returncode}): {driver.communicate()[1][-3000:]}"
        )
        # sending on through the other address: 20 more receipts, then the run ends
        wait_until(
            lambda: driver.poll() is not None or _receipts_so_far(progress) >= at_kill + 20,
            60,
            0.1,
            what=f"20 sends receipted through {other}",
        )
        stop.touch()
        out = rc.driver_output(driver)
    receipts, deliveries = out["receipts"], out["deliveries"]
    delivered = {d[0] for d in deliveries}
    lost = [r for r in receipts if r["id"] not in delivered]
    after = {r["id"] for r in receipts if r["epochMs"] > killed_ms}
    print(
        f"endpoint {used} killed under the Node client: {len(receipts)} receipted "
        f"({len(after)} after the kill), {len(lost)} lost, {len(out['send_failures'])} failed sends"
    )
    assert len(after) >= 20, f"the client did not go on sending through {other}: {out['send_failures'][-5:]}"
    assert after & delivered, "nothing sent after the kill was received"
    assert lost == [], f"{len(lost)} receipted messages never consumed: {lost[:5]}"
