"""The data port (broker/dataport.py, tidelog/dataport_frames.py) on a real broker set.

- the Python client produces and reads through it; a client on gRPC only reads the same messages;
- a bad record batch, an unknown operation and a produce to the slave get typed error frames on a
  connection that stays usable;
- a frame with a lying length prefix, and garbage, close that connection only: the broker lives and
  another connection is served;
- a client that pipelines pulls of 16 MiB replies and never reads grows the broker by a bounded
  amount (its connection's budget), while other clients are served; a connection beyond
  `data_max_connections` is closed at once;
- a send_batch larger than one frame is stored whole and in order, on a connection that stays.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c

from tests.broker.conftest import TOPIC, BrokerCluster
from tidelog import dataport_frames as df
from tidelog.client.aio import AsyncClient, OutMessage
from tidelog.commitlog.batch import encode_batch

pytestmark = pytest.mark.slow


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _call(sock: socket.socket, op: int, rid: int, *parts: bytes) -> tuple[int, int, bytes]:
    """One request on a raw connection: (status, request id, body) of its reply."""
    sock.sendall(b"".join(df.frame(op, rid, *parts)))
    head = _read(sock, df.HEAD_SIZE)
    length, status, got = df.HEAD.unpack(head)
    return status, got, _read(sock, df.body_length(length))


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


async def _through_the_client(controllers: str) -> None:
    msgs = [OutMessage(b"m%d" % i, key=f"k{i % 7}", tags="t", properties={"p": str(i)}) for i in range(300)]
    async with AsyncClient(controllers) as fast, AsyncClient(controllers, data_port=False) as plain:
        receipts = await fast.producer().send_batch(TOPIC, msgs)
        assert fast.data.enabled and fast.data._connections, "the client did not use the data port"
        sent = {(r.queue, r.queue_offset): m for r, m in zip(receipts, msgs, strict=True)}
        for client in (fast, plain):
            got = {}
            for q in {r.queue for r in receipts}:
                reader = client.reader(TOPIC, q, 0)
                while batch := await reader.read(1000, timeout=0.5):
                    got.update({(q, m.offset): (m.body, m.key, m.tags, dict(m.properties)) for m in batch})
            assert got == {k: (m.body, m.key, m.tags, dict(m.properties or {})) for k, m in sent.items()}
        # a full batch starts the next pull early; moving the position discards what it brought
        q = receipts[0].queue
        reader = fast.reader(TOPIC, q, 0)
        first = [m.offset for m in await reader.read(5)]
        reader.position = 0
        assert [m.offset for m in await reader.read(5)] == first == list(range(5))
        assert [m.offset for m in await reader.read(5)] == list(range(5, 10))
        await reader.close()


def test_the_data_port_serves_produce_and_pull_and_survives_bad_frames(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    m = bs.wait_master()
    ports = [_address(bs.clients[i].status().data_address) for i in range(2)]
    asyncio.run(_through_the_client(cluster.controllers))
    before = bs.clients[m].status().max_offset
    good = encode_batch(TOPIC.encode(), 0, [OutMessage(b"x")], 1)
    bad = good[:12] + b"\x00\x07" + good[14:]  # a record kind only the broker may write
    with socket.create_connection(ports[m], timeout=5) as s:
        status, rid, body = _call(s, df.OP_PRODUCE, 41, df.produce_request(TOPIC, 0, 1, 0), good)
        assert (status, rid, df.parse_error(body)[0]) == (df.ERROR, 41, "INVALID_ARGUMENT")  # CRC 0
        status, _, body = _call(s, df.OP_PRODUCE, 42, df.produce_request(TOPIC, 0, 1, crc32c(bad)), bad)
        assert (status, df.parse_error(body)[0]) == (df.ERROR, "INVALID_ARGUMENT")
        status, _, body = _call(s, 99, 43, b"")
        assert (status, df.parse_error(body)[0]) == (df.ERROR, "INVALID_ARGUMENT")
        status, _, body = _call(s, df.OP_PRODUCE, 44, df.produce_request(TOPIC, 0, 1, crc32c(good)), good)
        assert status == df.OK and df.parse_produced(body)[0] == bs.name
    assert bs.clients[m].status().max_offset > before  # only the good batch was stored
    with socket.create_connection(ports[1 - m], timeout=5) as s:
        status, _, body = _call(s, df.OP_PRODUCE, 1, df.produce_request(TOPIC, 0, 1, crc32c(good)), good)
        assert status == df.ERROR and df.parse_error(body)[:2] == ("NOT_MASTER", bs.addresses[m])
    for junk in (struct.pack(">IBI", 2**31, df.OP_PULL, 1), b"\xde\xad\xbe\xef" * 8):
        with socket.create_connection(ports[m], timeout=5) as s:
            s.sendall(junk)
            assert _closed(s), "a lying length prefix did not close its connection"
    assert all(p.alive() for p in bs.procs)
    with socket.create_connection(ports[m], timeout=5) as s:
        pull = df.PullCall(TOPIC, 0, 0, 10, 1 << 20, 0)
        status, _, body = _call(s, df.OP_PULL, 7, df.pull_request(pull))
        assert status == df.OK and df.parse_pulled(body).count > 0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def _served_meanwhile(controllers: str) -> None:
    async with AsyncClient(controllers) as client:
        receipts = await client.producer().send_batch(TOPIC, [OutMessage(b"ok", key="k")] * 5)
        reader = client.reader(TOPIC, receipts[0].queue, receipts[0].queue_offset)
        assert [m.body for m in await reader.read(5, timeout=2.0)] == [b"ok"] * 5
        await reader.close()


def test_a_client_that_pipelines_large_pulls_and_never_reads_cannot_grow_the_broker(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(1, segment_bytes=64 << 20, data_max_connections=3)
    bs = cluster.bs
    port = _address(bs.clients[0].status().data_address)
    pid = bs.procs[0].pid
    chunk = encode_batch(TOPIC.encode(), 1, [OutMessage(b"v" * (256 << 10))] * 16, 1)  # 4 MiB
    with socket.create_connection(port, timeout=10) as s:
        for rid in range(5):  # 20 MiB in queue 1: every pull below gets a full 16 MiB reply
            req = df.produce_request(TOPIC, 1, 16, crc32c(chunk))
            assert _call(s, df.OP_PRODUCE, rid, req, chunk)[0] == df.OK
    before = _rss_mib(pid)
    flood = socket.socket()
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    flood.connect(port)
    try:
        pull = df.pull_request(df.PullCall(TOPIC, 1, 0, 10_000, 16 << 20, 0))
        flood.sendall(b"".join(b"".join(df.frame(df.OP_PULL, rid, pull)) for rid in range(64)))
        peak = before
        for _ in range(30):  # 3 s: unbounded, the 64 replies (1 GiB) are built well within it
            peak = max(peak, _rss_mib(pid))
            time.sleep(0.1)
        asyncio.run(_served_meanwhile(cluster.controllers))
        assert peak - before < 300, f"the broker grew by {peak - before:.0f} MiB for one connection"
        # data_max_connections 3: beside the flood, two more are served and the one after is closed
        time.sleep(0.5)  # the client's connection above has ended on the broker's side too
        others = [socket.create_connection(port, timeout=5) for _ in range(3)]
        try:
            time.sleep(0.3)
            assert not _closed_now(others[0]) and not _closed_now(others[1])
            assert _closed(others[2]), "a connection over data_max_connections was kept"
        finally:
            for o in others:
                o.close()
    finally:
        flood.close()
    assert bs.procs[0].alive()


def _closed_now(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


async def _one_batch_over_a_frame(controllers: str) -> None:
    bodies = [b"%04d" % i + b"b" * (512 << 10) for i in range(136)]  # 68 MiB: more than a frame
    async with AsyncClient(controllers) as client:
        receipts = await client.producer().send_batch(TOPIC, [OutMessage(b, key="one") for b in bodies])
        (conn,) = client.data._connections.values()
        assert not conn.closed, "the oversize batch cost the client its data connection"
        q, first = receipts[0].queue, receipts[0].queue_offset
        assert [(r.queue, r.queue_offset) for r in receipts] == [(q, first + i) for i in range(len(bodies))]
        reader = client.reader(TOPIC, q, first)
        got: list[bytes] = []
        while batch := await reader.read(64, timeout=1.0):
            got += [m.body for m in batch]
        await reader.close()
        assert got == bodies


def test_a_send_batch_larger_than_a_frame_is_stored_whole_and_in_order(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(1, segment_bytes=256 << 20)
    asyncio.run(_one_batch_over_a_frame(cluster.controllers))
