"""Rows 3 and 5 of docs/SECURITY.md's probe table, on a broker of `tide cluster up`: clients that
announce large data-port frames and never finish them hold at most the broker's budget for
partial frames (`data_partial_frame_bytes`), and no memory at all once the frames are larger than
SPILL_BYTES (their bodies wait in a spill file); a frame header that does not complete closes its
connection within the header deadline (broker/dataport.py)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from bench.partial_frames import rss_bytes, unfinished_frames

from tests.brokers import BrokerClient
from tests.client.conftest import LOCAL_TOPOLOGY, LocalCluster, start_cluster, stop_cluster
from tests.procs import wait_until
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


def data_dir_of(c: LocalCluster) -> Path:
    """The broker's data directory, where its spill files live."""
    proc = next(p for p in c.state()["processes"] if p["kind"] == "broker")
    cfg = yaml.safe_load((c.data_dir / f"{proc['name']}.yaml").read_text())
    return Path(cfg["data_dir"]).resolve()


def settled(pid: int, data_dir: Path) -> None:
    """Wait until the broker holds no spill file: an earlier test's frames, closed as it ended,
    are no longer being read (they would be counted as this test's)."""
    wait_until(lambda: not spilled(pid, data_dir), 10, what="the earlier frames' spill files to close")


def spilled(pid: int, data_dir: Path) -> list[int]:
    """The sizes of the spill files broker `pid` holds open: the unlinked files in its data
    directory (/proc shows them as `<dir>/<name> (deleted)`)."""
    sizes = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
            if target.endswith(" (deleted)") and Path(target.removesuffix(" (deleted)")).parent == data_dir:
                sizes.append(os.stat(fd).st_size)
        except OSError:
            continue  # closed while we looked
    return sizes


def test_frames_announced_and_never_finished_hold_at_most_the_partial_budget(cluster: LocalCluster) -> None:
    pid, address = broker_of(cluster)
    spill_dir = data_dir_of(cluster)
    settled(pid, spill_dir)
    before = rss_bytes(pid)
    # the broker holds all it will once one frame's body has arrived but for its last byte (the
    # frames are over SPILL_BYTES: it waits in a spill file); the other frames then wait unread
    with unfinished_frames(
        address, CLIENTS, FRAME, wait_s=30, held=lambda: FRAME - 1 in spilled(pid, spill_dir)
    ):
        grown = rss_bytes(pid) - before
        reading = spilled(pid, spill_dir)
    # without the budget each connection held its whole body: CLIENTS x FRAME = 128 MiB
    assert grown <= BUDGET + CLIENTS * (1 << 20) + (16 << 20), f"RSS grew by {grown >> 20} MiB"
    # a frame larger than the budget is read alone: without the budget every frame is read at once
    assert reading == [FRAME - 1], f"frame bodies being read: {reading}"


def test_large_frames_never_finished_hold_no_memory_while_they_arrive(cluster: LocalCluster) -> None:
    """Probe 3's frames, scaled down: frames over SPILL_BYTES wait in a spill file, so the broker's
    RSS does not grow by the one frame the budget admits (it did by the whole frame before)."""
    frame = 2 * SPILL_BYTES  # larger than the budget too: read alone
    pid, address = broker_of(cluster)
    spill_dir = data_dir_of(cluster)
    settled(pid, spill_dir)
    before = rss_bytes(pid)
    grown = 0

    def sample() -> None:  # the peak while the frames are held, not after they are dropped
        nonlocal grown
        grown = max(grown, rss_bytes(pid) - before)

    watcher = threading.Event()

    def watch() -> None:
        while not watcher.wait(0.05):
            sample()

    def held() -> bool:
        # one body arrived but for its last byte, in a spill file; or, were it read in memory, the
        # growth the assertion below refuses
        sample()
        return frame - 1 in spilled(pid, spill_dir) or grown >= frame // 2

    t = threading.Thread(target=watch)
    t.start()
    try:
        with unfinished_frames(address, 4, frame, wait_s=30, held=held):
            sample()
            reading = spilled(pid, spill_dir)
    finally:
        watcher.set()
        t.join()
    # in memory, the frame being read would add `frame` (16 MiB); stream buffers add ~128 KiB each
    assert grown < frame // 2, f"RSS grew by {grown >> 20} MiB"
    assert reading == [frame - 1], f"frame bodies in spill files: {reading}"


def test_a_bare_length_closes_the_connection_at_the_header_deadline(cluster: LocalCluster) -> None:
    _, address = broker_of(cluster)
    with socket.create_connection(address, timeout=HEADER_TIMEOUT_S + 10) as s:
        s.sendall(struct.pack(">I", 1000))
        started = time.monotonic()
        assert s.recv(1) == b""  # closed by the broker; a timeout here raises
        assert time.monotonic() - started >= HEADER_TIMEOUT_S - 1  # a deadline, not a refusal
