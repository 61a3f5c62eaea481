"""Malformed input against a real listening master: its HA port and its data port (sockets on
127.0.0.1, an in-process master). Garbage and a lying length prefix close that connection
only, the claimed length is never allocated, and a good client is served afterwards.
"""

from __future__ import annotations

import asyncio
import os
import struct
import tracemalloc

from crc32c import crc32c

from tests.fuzz.replica import TOPIC, Master, master
from tidelog import dataport_frames as df
from tidelog.broker.dataport import DataPort
from tidelog.client.aio import OutMessage
from tidelog.client.dataconn import DataConnection
from tidelog.commitlog import batch
from tidelog.ha import protocol as p
from tidelog.tasks import within

#: Bytes the server may allocate while a client claims a frame of the largest length and sends
#: a little of it: far below the claim (64 MiB), room for asyncio's buffers and the log.
ALLOWED_BYTES = 4 << 20


async def _closed_by_server(host: str, port: int, payload: bytes) -> bool:
    """Send `payload` and report whether the server closed the connection (EOF) within 5 s."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(payload)
        await writer.drain()
        try:
            while await within(reader.read(1 << 16), 5.0):
                pass  # an error frame may come first
        except TimeoutError:
            return False
        return True
    finally:
        writer.close()


async def _held_bytes(host: str, port: int, length: int, sent: bytes) -> int:
    """How much the server allocates while a client claims `length` bytes and sends `sent`."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _, writer = await asyncio.open_connection(host, port)
        writer.write(struct.pack(">I", length) + sent)
        await writer.drain()
        await asyncio.sleep(0.5)  # the server reads what came and waits for the rest
        grown = tracemalloc.get_traced_memory()[0] - before
        writer.close()
        return grown
    finally:
        tracemalloc.stop()


async def _ha_port(m: Master) -> None:
    server = await asyncio.start_server(m.replica.handle_ha_connection, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        assert await _closed_by_server(host, port, os.urandom(256))
        assert await _closed_by_server(host, port, p._LEN.pack(2**31) + b"\x07")  # no body sent
        assert await _closed_by_server(host, port, p._LEN.pack(p.MAX_AUTH_FRAME + 1) + b"\x07")
        assert await _held_bytes(host, port, p.MAX_AUTH_FRAME, b"\x07" + b"x" * 100) < ALLOWED_BYTES
        # a good slave's hello is still answered with the master's challenge
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(p.encode(p.AuthHello("broker-a", 2, b"n" * 16)))
        reply = await within(p.read_frame(reader), 5.0)
        assert isinstance(reply, p.AuthChallenge) and reply.master_id == 1
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def _data_port(m: Master) -> None:
    port = DataPort(m.replica)
    host, _, number = (await port.start("127.0.0.1", 0)).rpartition(":")
    try:
        assert await _closed_by_server(host, int(number), b"\xff" * 64)  # a length over MAX_FRAME
        assert await _closed_by_server(host, int(number), struct.pack(">IBI", 2**31, 1, 1))
        assert await _closed_by_server(host, int(number), struct.pack(">IBI", 2, 1, 1))  # under 5
        # the largest frame claimed, a kilobyte of it sent: only what came is held
        assert await _held_bytes(host, int(number), df.MAX_FRAME, b"\x01" + b"x" * 1024) < ALLOWED_BYTES
        conn = DataConnection(port.address)
        try:
            records = batch.encode_batch(TOPIC.encode(), 0, [OutMessage(b"good")], 1)
            request = df.produce_request(TOPIC, 0, 1, crc32c(records))
            produced = df.parse_produced(await conn.call(df.OP_PRODUCE, [request, records], 5.0))
            assert produced[0] == "broker-a" and len(produced[2]) == 1
        finally:
            await conn.close()
    finally:
        await port.close()


def test_the_ha_port_survives_garbage_and_lying_lengths() -> None:
    with master() as m:
        m.run(_ha_port(m), 60)


def test_the_data_port_survives_garbage_and_lying_lengths() -> None:
    with master() as m:
        m.run(_data_port(m), 60)
