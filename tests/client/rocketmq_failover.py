"""What the failover tests of the official RocketMQ clients share: two RocketMQ endpoints of one
cluster behind one DNS name (or two addresses), a client process that gets its own hosts file
naming them, and ways to see which endpoint a client is connected to and how far it got.

Several records for one name without a DNS server: the endpoints share one port on two loopback
addresses (127.0.0.2 and 127.0.0.3: both broker sets' slaves, moved there after `cluster up`),
and the client runs in a mount namespace of its own (`unshare --mount`, root only) in which a
hosts file naming both is bind-mounted over /etc/hosts for that process alone. The client
resolves the name as in production, through getaddrinfo; the machine's /etc/hosts is never
touched, and the mount goes away with the process. Under TLS each moved slave is given a
certificate of the cluster's CA naming the name and its address, as an operator's would."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster
from tidelog import localcluster
from tidelog.localcluster import certs, wait_until

#: A name in the reserved `.test` domain (RFC 2606): no DNS server knows it.
NAME = "rocketmq.tidelog.test"
#: The loopback addresses the two endpoints behind NAME listen on, by broker set.
ADDRESSES = {"broker-a": "127.0.0.2", "broker-b": "127.0.0.3"}
#: The failover clusters' `rocketmq_invisible_ms`: the messages of a push consumer's receive
#: whose answer died with the killed endpoint come back after this, not after the default 30 s.
INVISIBLE_MS = 5_000


def in_own_hosts(hosts: Path, command: list[str]) -> list[str]:
    """`command` run with `hosts` as its /etc/hosts: a bind mount in a mount namespace of its own
    (private, so nothing reaches the machine's). `exec` keeps the command's pid the one started."""
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts), *command]


def shared_port() -> int:
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


def hosts_file(where: Path) -> Path:
    """The machine's hosts file with NAME on every address of ADDRESSES, once a process can be
    given it as its own and those addresses can be listened on (else the caller is skipped)."""
    path = where / "hosts"
    lines = [f"{address} {NAME}" for address in ADDRESSES.values()]
    path.write_text(Path("/etc/hosts").read_text() + "\n" + "\n".join(lines) + "\n")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to give the client a hosts file of its own")
    probe = subprocess.run(
        in_own_hosts(path, ["getent", "ahostsv4", NAME]), capture_output=True, text=True, timeout=20
    )
    found = {line.split()[0] for line in probe.stdout.splitlines() if line.strip()}
    if probe.returncode != 0 or found != set(ADDRESSES.values()):
        pytest.skip(f"no mount namespace of its own for the client (needs root): {probe.stderr.strip()}")
    try:
        shared_port()
    except (OSError, AssertionError) as exc:  # a system whose loopback is 127.0.0.1 alone
        pytest.skip(f"cannot listen on {sorted(ADDRESSES.values())}: {exc}")
    return path


def move_slaves(c: LocalCluster) -> int:
    """Both broker sets' slaves serving RocketMQ on ADDRESSES at one port (returned): each is
    killed, given its address (and under TLS a certificate of the cluster's CA that names NAME and
    that address), and started again. After `cluster up`, because the topology's broker keys are
    every broker's, and these two need an address each."""
    port = shared_port()
    slaves = {s: rc.member(c, s, "slave")["name"] for s in ADDRESSES}
    for broker_set, name in slaves.items():
        localcluster.kill(c.data_dir, name, signal.SIGKILL)  # a slave: its master serves on
        config = c.data_dir / f"{name}.yaml"
        doc = yaml.safe_load(config.read_text())
        doc["rocketmq_listen"] = doc["rocketmq_advertise_address"] = f"{ADDRESSES[broker_set]}:{port}"
        localcluster.write_config(config, doc)
        if doc.get("tls"):
            cert = Path(doc["tls"]["cert"])  # replaced in place: the same name the config gives
            ca = certs.Authority(Path(doc["tls"]["ca"]), Path(doc["tls"]["ca"]).with_suffix(".key"))
            # its other ports stay on the host it was issued for; issue() adds 127.0.0.1 and localhost
            certs.issue(ca, cert.parent, cert.stem, [NAME, ADDRESSES[broker_set]])
    for name in slaves.values():
        localcluster.restart(c.data_dir, name)
    wanted = {(name, f"{ADDRESSES[s]}:{port}") for s, name in slaves.items()}

    def back() -> bool:
        return wanted <= {(m["name"], m["rocketmq_endpoint"]) for m in rc.members(c) if m["role"] == "slave"}

    wait_until(back, 30, 0.2, what=f"the slaves back with their RocketMQ endpoints {sorted(wanted)}")
    return port


def connected_to(pid: int, port: int) -> set[str]:
    """The remote IPv4 addresses of process `pid`'s established TCP connections to `port` (its
    sockets in /proc/PID/fd, looked up in /proc/PID/net/tcp, and in tcp6 as IPv4-mapped addresses:
    gRPC C-core's sockets are dual-stack)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            address_hex, port_hex = remote.split(":")
            if state != "01" or inode not in inodes or int(port_hex, 16) != port:  # 01: ESTABLISHED
                continue
            # the address is in 32-bit words, each in the host's (little-endian) order
            raw = b"".join(
                struct.pack("<I", int(address_hex[i : i + 8], 16)) for i in range(0, len(address_hex), 8)
            )
            address = ipaddress.ip_address(raw)
            if isinstance(address, ipaddress.IPv6Address):
                if address.ipv4_mapped is None:
                    continue
                address = address.ipv4_mapped
            out.add(str(address))
    return out


def kill_the_connected_endpoint(
    c: LocalCluster, driver: subprocess.Popen[str], port: int, progress: Path, more: int = 20
) -> tuple[str, str, float]:
    """Once `driver` holds one connection to one of ADDRESSES (gRPC's pick_first), kill -9 the
    broker serving it, and wait until the driver is connected to the other address and has had
    `more` further sends receipted (its progress file). The address used, the one failed over to,
    and when the kill was (ms since the epoch, as the drivers' receipts say)."""

    def ended() -> str:
        return f"the client ended (exit {driver.returncode}): {driver.communicate()[1][-3000:]}"

    def one_connection() -> set[str] | bool:
        if driver.poll() is not None:
            return True  # over: said below
        found = connected_to(driver.pid, port)
        return found if len(found) == 1 else set()

    connected = wait_until(one_connection, 20, 0.1, what="one connection")
    assert driver.poll() is None, ended()
    (used,) = connected
    (other,) = set(ADDRESSES.values()) - {used}
    victim = next(m["name"] for m in rc.members(c) if m["rocketmq_endpoint"] == f"{used}:{port}")
    localcluster.kill(c.data_dir, victim, signal.SIGKILL)
    killed_ms = time.time() * 1000
    at_kill = rc.receipts_now(progress)
    wait_until(
        lambda: driver.poll() is not None or connected_to(driver.pid, port) == {other},
        30,
        0.1,
        what=f"a connection to {other}",
    )
    assert driver.poll() is None, ended()
    wait_until(
        lambda: driver.poll() is not None or rc.receipts_so_far(progress) >= at_kill + more,
        60,
        0.1,
        what=f"{more} sends receipted through {other}",
    )
    return used, other, killed_ms


def fails_over(c: LocalCluster, port: int, command: list[str], where: Path, label: str, **popen: Any) -> None:
    """Run a client driver (`command`: its produce-consume through both endpoints, writing
    where/ready, where/progress, and ending once where/stop exists); once messages flow, kill -9
    the endpoint it is connected to; it must go on sending through the other and receive every
    message it had receipted."""
    ready, stop, progress = where / "ready", where / "stop", where / "progress"
    with rc.driver_run(command, **popen) as driver:
        rc.wait_for_flow(driver, ready, progress, 60)
        used, other, killed_ms = kill_the_connected_endpoint(c, driver, port, progress)
        stop.touch()
        out = rc.driver_output(driver)
    receipts, deliveries = out["receipts"], out["deliveries"]
    delivered = {d[0] for d in deliveries}
    lost = [r for r in receipts if r["id"] not in delivered]
    after = {r["id"] for r in receipts if r["epochMs"] > killed_ms}
    print(
        f"endpoint {used} killed under {label}: {len(receipts)} receipted ({len(after)} after the "
        f"kill), {len(lost)} lost, {len(out['send_failures'])} failed sends"
    )
    assert len(after) >= 20, f"the client did not go on sending through {other}: {out['send_failures'][-5:]}"
    assert after & delivered, "nothing sent after the kill was received"
    assert lost == [], f"{len(lost)} receipted messages never consumed: {lost[:5]}"
