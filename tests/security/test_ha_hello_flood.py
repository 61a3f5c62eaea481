"""A stranger flooding a master's HA port with hellos (docs/SECURITY.md, probe 13): it opens
connections as fast as it can, each sending an AUTH_HELLO that claims a broker of the set, and
keeps reconnecting, while the real slave restarts. The slave must rejoin the SyncStateSet within a
bounded time and replicate.

Real processes: a controller and a broker set of two; the stranger runs in threads of this test
process, without the cluster secret."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import TOPIC, BrokerCluster, broker_cluster  # noqa: F401 (a fixture)
from tests.brokers import status_of
from tidelog.clusterauth import NONCE_BYTES
from tidelog.ha.protocol import AuthHello, encode

pytestmark = pytest.mark.slow

SLOTS = 8
REJOIN_BOUND_S = 15.0
CONCURRENT = 4 * 8  # the stranger's connections at once: four times the master's unproven slots
HELD = 4  # connections each keeps open
HANDSHAKE_S = 5.0
JOIN_AFTER_UP_S = 5.0  # from the slave's port answering to its place in the SyncStateSet
# refusal lines are at most 5 a second per peer host (tidelog/guard.py RefusalLog), plus the
# lines of the slave's own restart
MAX_LOG_LINES_PER_S = 20


# the stranger, a process of its own: connect, say a hello claiming broker 1 of broker-a, again and
# again from CONCURRENT connections at once, each kept open until HELD newer ones of its
# coroutine are (it holds an unproven slot of the master's until displaced); one line a second
# on stdout: the hellos sent so far. It runs at the lowest CPU priority: it floods with whatever
# the test host's cores leave, as a stranger on another machine would, rather than slowing the
# slave's process start by taking its CPU (which no broker could prevent)
STRANGER = """
import asyncio, os, sys, time
os.nice(19)  # on a network the stranger has a machine of its own: here it must not take the brokers' cores
host, port, concurrent, held_max, hello = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), bytes.fromhex(sys.argv[5])
sent = 0
async def one():
    global sent
    held = []
    while True:
        try:
            _, w = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        w.write(hello)
        sent += 1
        held.append(w)
        if len(held) > held_max:
            held.pop(0).close()
async def report():
    while True:
        await asyncio.sleep(0.5)
        print(sent, flush=True)
async def main():
    await asyncio.gather(report(), *(one() for _ in range(concurrent)))
asyncio.run(main())
"""


@contextlib.contextmanager
def flooding(address: str) -> Iterator[list[int]]:
    """A stranger flooding `address` with hellos while the block runs; yields a list that holds,
    after the block, the number of hellos it sent."""
    host, port = address.rsplit(":", 1)
    hello = encode(AuthHello("broker-a", 1, os.urandom(NONCE_BYTES))).hex()
    proc = subprocess.Popen(
        [sys.executable, "-c", STRANGER, host, port, str(CONCURRENT), str(HELD), hello],
        stdout=subprocess.PIPE,
        text=True,
    )
    sent: list[int] = []
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip(), "the stranger did not start"  # its first report
        yield sent
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        sent.append(max((int(n) for n in out.split()), default=0))


def _rejoin_s(cluster: BrokerCluster, master: int, slave: int) -> tuple[float, float]:
    """Restart the slave: seconds from its start until the master's SyncStateSet holds it again,
    and of those, from when its gRPC port answers (the process is up, it registers and connects
    to the master at once: what is left is the HA handshake and the catch-up)."""
    bs = cluster.bs
    bs.procs[slave].stop()
    bs.wait_in_sync(1, timeout=30)  # the master shrank its SyncStateSet to itself
    bs.clients[master].produce(TOPIC, [b"while-the-slave-is-away"])
    started = time.monotonic()
    bs.procs[slave].start()
    while status_of(bs, slave, timeout=0.5) is None:
        assert time.monotonic() - started < 60, "the slave's process never answered"
        time.sleep(0.05)
    up = time.monotonic()
    bs.wait_in_sync(2, timeout=REJOIN_BOUND_S + 30)  # measured below against the bound
    done = time.monotonic()
    return done - started, done - up


def _replicated(cluster: BrokerCluster, master: int, slave: int) -> None:
    """A write on the master reaches the slave's log (bounded wait)."""
    bs = cluster.bs
    bs.clients[master].produce(TOPIC, [b"after-the-rejoin"])
    want = status_of(bs, master)
    assert want is not None
    deadline = time.monotonic() + 10
    while True:
        got = status_of(bs, slave)
        if got is not None and got.max_offset >= want.max_offset:
            return
        assert time.monotonic() < deadline, f"the slave holds {got and got.max_offset} of {want.max_offset}"
        time.sleep(0.1)


def test_a_slave_rejoins_while_a_stranger_floods_the_ha_port_with_hellos(
    broker_cluster: Callable[..., BrokerCluster],  # noqa: F811
) -> None:
    cluster = broker_cluster(
        2,
        ha_max_connections=SLOTS,
        ha_handshake_timeout_ms=int(HANDSHAKE_S * 1000),
    )
    bs = cluster.bs
    master = bs.wait_in_sync(2)
    slave = 1 - master
    quiet, quiet_join = _rejoin_s(cluster, master, slave)
    log = bs.procs[master].log_path
    before, began = log.stat().st_size, time.monotonic()
    with flooding(bs.ha_addresses[master]) as hellos:
        flooded, flooded_join = _rejoin_s(cluster, master, slave)
        _replicated(cluster, master, slave)
    lines = _lines_from(log, before)
    per_s = len(lines) / (time.monotonic() - began)
    print(
        f"rejoin: {quiet:.1f} s quiet ({quiet_join:.2f} s after its port answered), {flooded:.1f} s "
        f"under a flood of {hellos[0]} hellos ({flooded_join:.2f} s after its port answered); "
        f"the master logged {len(lines)} lines meanwhile ({per_s:.0f}/s)"
    )
    assert hellos[0] > 10 * SLOTS, f"the flood sent only {hellos[0]} hellos: it tested nothing"
    # the bound: the slave's HA handshake is not what the flood delays (the process start is)
    assert flooded <= REJOIN_BOUND_S, (
        f"the slave rejoined {flooded:.1f} s after its start ({quiet:.1f} s quiet)"
    )
    assert flooded_join <= JOIN_AFTER_UP_S, f"the slave joined {flooded_join:.1f} s after its port answered"
    # a stranger's connections cost the log a few lines a second, not a line or two each
    assert per_s <= MAX_LOG_LINES_PER_S, f"{len(lines)} lines logged under the flood: {lines[-3:]}"


def _lines_from(log: Path, offset: int) -> list[str]:
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()
