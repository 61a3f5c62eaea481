"""HA slot exhaustion (docs/SECURITY.md, probe 6): strangers holding connections to a master's HA
port do not lock the real slave out, and a connection that does not prove the cluster secret is
closed at the handshake deadline (ha/master.py `HaSlots`).

Real processes: a controller and a broker set of two. The idle timeout is made long (30 s), so
that what closes strangers within the tests' bounds is the slot handling, not the idle timeout:
before it, the first `ha_max_connections` strangers held every slot until that timeout."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable

import pytest

from tests.broker.conftest import TOPIC, BrokerCluster, broker_cluster  # noqa: F401 (a fixture)
from tidelog.clusterauth import NONCE_BYTES
from tidelog.ha.protocol import AuthHello, encode

pytestmark = pytest.mark.slow

SLOTS = 8
STRANGERS = 200
HANDSHAKE_S = 2.0


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the broker closes `sock` within `timeout` (reading and dropping what it sends)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True  # reset: closed too
    return False


def test_a_slave_joins_while_strangers_hold_the_ha_port(
    broker_cluster: Callable[..., BrokerCluster],  # noqa: F811
) -> None:
    cluster = broker_cluster(
        2,
        ha_max_connections=SLOTS,
        ha_idle_timeout_ms=30_000,
        ha_handshake_timeout_ms=30_000,  # eviction, not the deadline, must let the slave in
    )
    bs = cluster.bs
    master = bs.wait_in_sync(2)
    slave = 1 - master
    bs.procs[slave].stop()
    bs.wait_in_sync(1, timeout=30)  # the master shrank its SyncStateSet to itself
    strangers = []
    try:
        for _ in range(STRANGERS):
            with contextlib.suppress(OSError):  # one closed at once is as good for the attacker
                strangers.append(_connect(bs.ha_addresses[master]))
        bs.clients[master].produce(TOPIC, [b"while-strangers-wait"])
        bs.procs[slave].start()
        # before: every slot held by a stranger for the 30 s idle timeout, the slave refused
        bs.wait_in_sync(2, timeout=20)
        # the slots the slave's connection left to strangers are still held by them
        open_ = [s for s in strangers[-SLOTS:] if not _closed_by_peer(s, 0.2)]
        assert open_, "the newest strangers should still hold their unproven slots"
    finally:
        for s in strangers:
            s.close()


def test_an_unproven_connection_closes_at_the_handshake_deadline(
    broker_cluster: Callable[..., BrokerCluster],  # noqa: F811
) -> None:
    cluster = broker_cluster(
        2,
        ha_max_connections=SLOTS,
        ha_idle_timeout_ms=30_000,
        ha_handshake_timeout_ms=int(HANDSHAKE_S * 1000),
    )
    bs = cluster.bs
    master = bs.wait_in_sync(2)
    with _connect(bs.ha_addresses[master]) as s:
        # a hello claiming a broker of the set: the master answers with its challenge, then waits
        s.sendall(encode(AuthHello("broker-a", 99, os.urandom(NONCE_BYTES))))
        started = time.monotonic()
        assert _closed_by_peer(s, 20), "an unproven HA connection was still open after 20 s"
        assert time.monotonic() - started >= HANDSHAKE_S - 0.5  # the deadline, not a refusal
    # the real slave was never disturbed
    bs.clients[master].produce(TOPIC, [b"after-the-stranger"])
    bs.wait_in_sync(2, timeout=10)
