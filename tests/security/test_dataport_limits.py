"""Rows 3 and 5 of docs/SECURITY.md's probe table, on a broker of `tide cluster up`: clients that
announce large data-port frames and never finish them hold at most the broker's budget for
partial frames (`data_partial_frame_bytes`), and no memory at all once the frames are larger than
SPILL_BYTES (their bodies wait in a spill file); a frame header that does not complete closes its
connection within the header deadline (broker/dataport.py)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
import yaml
from bench.partial_frames import rss_bytes, unfinished_frames

from tests.brokers import BrokerClient
from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster, start_cluster, stop_cluster
from tidelog.broker.dataport import HEADER_TIMEOUT_S, SPILL_BYTES
from tidelog.proto import broker_pb2 as bpb

pytestmark = pytest.mark.slow

BUDGET = 8 << 20
FRAME = 16 << 20
CLIENTS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    topo = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    topo["broker_sets"] = [{"name": "broker-a", "replicas": 1}]
    topo["broker"].update(in_sync_replicas=1, data_partial_frame_bytes=BUDGET)
    path = tmp_path_factory.mktemp("topology") / "partial.yaml"
    path.write_text(yaml.safe_dump(topo))
    c = start_cluster(tmp_path_factory.mktemp("partial") / "tide-data", path)
    try:
        yield c
    finally:
        stop_cluster(c)


def broker_of(c: LocalCluster) -> tuple[int, tuple[str, int]]:
    """The broker's pid and its data port."""
    proc = next(p for p in c.state()["processes"] if p["kind"] == "broker")
    cfg = yaml.safe_load((c.data_dir / f"{proc['name']}.yaml").read_text())
    client = BrokerClient(cfg["listen"])
    try:
        address = client._call("Status", bpb.StatusRequest()).data_address
    finally:
        client.channel.close()
    host, _, port = address.rpartition(":")
    return proc["pid"], (host, int(port))


def test_frames_announced_and_never_finished_hold_at_most_the_partial_budget(cluster: LocalCluster) -> None:
    pid, address = broker_of(cluster)
    before = rss_bytes(pid)
    with unfinished_frames(address, CLIENTS, FRAME, wait_s=30):
        grown = rss_bytes(pid) - before
    # without the budget each connection held its whole body: CLIENTS x FRAME = 128 MiB
    assert grown <= BUDGET + CLIENTS * (1 << 20) + (16 << 20), f"RSS grew by {grown >> 20} MiB"


def test_large_frames_never_finished_hold_no_memory_while_they_arrive(cluster: LocalCluster) -> None:
    """Probe 3's frames, scaled down: frames over SPILL_BYTES wait in a spill file, so the broker's
    RSS does not grow by the one frame the budget admits (it did by the whole frame before)."""
    frame = 2 * SPILL_BYTES  # larger than the budget too: read alone
    pid, address = broker_of(cluster)
    before = rss_bytes(pid)
    grown = 0

    def sample() -> None:  # the peak while the frames are held, not after they are dropped
        nonlocal grown
        grown = max(grown, rss_bytes(pid) - before)

    watcher = threading.Event()

    def watch() -> None:
        while not watcher.wait(0.05):
            sample()

    t = threading.Thread(target=watch)
    t.start()
    try:
        with unfinished_frames(address, 4, frame, wait_s=30):
            pass
        sample()
    finally:
        watcher.set()
        t.join()
    # in memory, the frame being read would add `frame` (16 MiB); stream buffers add ~128 KiB each
    assert grown < frame // 2, f"RSS grew by {grown >> 20} MiB"


def test_a_bare_length_closes_the_connection_at_the_header_deadline(cluster: LocalCluster) -> None:
    _, address = broker_of(cluster)
    with socket.create_connection(address, timeout=HEADER_TIMEOUT_S + 10) as s:
        s.sendall(struct.pack(">I", 1000))
        started = time.monotonic()
        assert s.recv(1) == b""  # closed by the broker; a timeout here raises
        assert time.monotonic() - started >= HEADER_TIMEOUT_S - 1  # a deadline, not a refusal
