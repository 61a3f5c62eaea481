"""The data port (broker/dataport.py, tidelog/dataframes.py) on a real broker set.

- the Python client produces and reads through it; a client on gRPC only reads the same messages;
- a bad record batch, an unknown operation and a produce to the slave get typed error frames on a
  connection that stays usable;
- a frame with a lying length prefix, and garbage, close that connection only: the broker lives and
  another connection is served.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

import pytest
from crc32c import crc32c

from tests.broker.conftest import TOPIC, BrokerCluster
from tidelog import dataframes as df
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
