"""The data port's per-connection limits (broker/dataport.py), in process, on real sockets.

A stand-in replica answers every pull with a 4 MiB reply. A client that pipelines many pulls and
never reads:
- gets at most as many pulls served as the connection's budget has room for (the rest are not
  read from its socket), and at most one reply sits in the transport's buffer beyond the kernel's;
- does not hold up another connection, which is served meanwhile;
- has its connection closed once a reply could not be written for WRITE_TIMEOUT_S.
The budget itself: takers wait in arrival order, a cancelled taker hands back or gives way.
`data_max_connections`: connections beyond it are closed at once; the key's default and checks.
"""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tidelog import dataport_frames as df
from tidelog.broker import config, dataport
from tidelog.broker.dataport import ByteBudget, DataPort
from tidelog.commitlog import QueueOffsets
from tidelog.errors import ConfigError
from tidelog.tasks import within

REPLY = 4 << 20


def _replica(max_connections: int = 8) -> Any:
    cfg = SimpleNamespace(
        data_max_connections=max_connections,
        data_partial_frame_bytes=64 << 20,
        max_message_bytes=1 << 20,
        max_pull_bytes=REPLY,
        max_pull_messages=10_000,
    )
    return SimpleNamespace(cfg=cfg, ctx="[test]", observe_traffic=None)


def _pull_frame(rid: int) -> bytes:
    return b"".join(df.frame(df.OP_PULL, rid, df.pull_request(df.PullCall("t", 0, 0, 100, REPLY, 0))))


async def _one_pull(address: str) -> int:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(_pull_frame(1))
        length, status, _ = df.HEAD.unpack(await reader.readexactly(df.HEAD_SIZE))
        body = await reader.readexactly(df.body_length(length))
        assert status == df.OK
        return df.parse_pulled(body).count
    finally:
        writer.close()
        await writer.wait_closed()


async def _until(check: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        await asyncio.sleep(0.05)
    return bool(check())


def test_a_client_that_never_reads_holds_one_budget_and_is_closed_after_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dataport, "CONNECTION_BYTES", 32 << 20)
    monkeypatch.setattr(dataport, "WRITE_TIMEOUT_S", 1.5)
    served: list[int] = []

    async def pull_encoded(replica: Any, call: df.PullCall) -> tuple[bytes, int, QueueOffsets]:
        served.append(call.offset)
        return b"r" * REPLY, 1, QueueOffsets(0, 1, 1)

    monkeypatch.setattr(dataport, "pull_encoded", pull_encoded)

    async def main() -> None:
        port = DataPort(_replica())
        address = await port.start("127.0.0.1", 0)
        host, _, p = address.rpartition(":")
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.setblocking(False)
        try:
            loop = asyncio.get_running_loop()
            await loop.sock_connect(stalled, (host, int(p)))
            await loop.sock_sendall(stalled, b"".join(_pull_frame(i) for i in range(100)))
            await asyncio.sleep(0.5)
            # 32 MiB of budget, each pull taking room for a 4 MiB reply: at most 7 are answered
            # (one written, the others waiting their turn); the other pulls stay unread.
            assert 0 < len(served) <= (32 << 20) // REPLY, served
            (writer,) = port._writers
            assert writer.transport.get_write_buffer_size() <= REPLY + df.HEAD_SIZE + 64 + (64 << 10)
            assert await _one_pull(address) == 1  # another connection is served meanwhile
            closed = await _until(lambda: not port._writers, dataport.WRITE_TIMEOUT_S + 3.0)
            assert closed, "a connection whose client never reads stayed open"
            assert len(served) <= (32 << 20) // REPLY + 1
        finally:
            stalled.close()
            await port.close()

    asyncio.run(main())


def test_connections_beyond_data_max_connections_are_closed_at_once() -> None:
    async def main() -> None:
        port = DataPort(_replica(max_connections=2))
        address = await port.start("127.0.0.1", 0)
        host, _, p = address.rpartition(":")
        held = [await asyncio.open_connection(host, int(p)) for _ in range(2)]
        try:
            assert await _until(lambda: len(port._writers) == 2, 2.0)
            reader, writer = await asyncio.open_connection(host, int(p))
            assert await within(reader.read(1), 2.0) == b"", "a connection over the limit stayed open"
            writer.close()
        finally:
            for _, w in held:
                w.close()
            await port.close()

    asyncio.run(main())


def test_a_trickled_frame_closes_its_connection_and_frees_the_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slowloris: a client that starts frames and never finishes them is closed after
    FRAME_TIMEOUT_S (a header: HEADER_TIMEOUT_S), so it cannot keep `data_max_connections` slots;
    an idle one is left alone."""
    monkeypatch.setattr(dataport, "FRAME_TIMEOUT_S", 0.5)
    monkeypatch.setattr(dataport, "HEADER_TIMEOUT_S", 0.5)

    async def pull_encoded(replica: Any, call: df.PullCall) -> tuple[bytes, int, QueueOffsets]:
        return b"r" * 100, 1, QueueOffsets(0, 1, 1)

    monkeypatch.setattr(dataport, "pull_encoded", pull_encoded)

    async def main() -> None:
        port = DataPort(_replica(max_connections=2))
        address = await port.start("127.0.0.1", 0)
        host, _, p = address.rpartition(":")
        idle = await asyncio.open_connection(host, int(p))
        slow_head = await asyncio.open_connection(host, int(p))
        try:
            slow_head[1].write(_pull_frame(0)[:3])  # a head begun, never finished
            await slow_head[1].drain()
            assert await within(slow_head[0].read(1), 3.0) == b"", "a half-sent head kept its slot"
            slow_body = await asyncio.open_connection(host, int(p))
            frame = _pull_frame(0)
            slow_body[1].write(frame[: df.HEAD_SIZE + 2])  # the head, then part of the body
            await slow_body[1].drain()
            assert await within(slow_body[0].read(1), 3.0) == b"", "a half-sent body kept its slot"
            slow_body[1].close()
            await asyncio.sleep(0.8)
            assert not idle[1].is_closing() and len(port._writers) == 1, "the idle connection stays"
            assert await _one_pull(address) == 1, "the freed slots serve again"
        finally:
            for _, w in (idle, slow_head):
                w.close()
            await port.close()

    asyncio.run(main())


def test_the_budget_serves_takers_in_order_and_a_cancelled_one_gives_way() -> None:
    async def main() -> None:
        budget = ByteBudget(10)
        await budget.take(8)
        order: list[str] = []

        async def take(name: str, n: int) -> None:
            await budget.take(n)
            order.append(name)

        big = asyncio.ensure_future(take("big", 6))
        small = asyncio.ensure_future(take("small", 1))
        await asyncio.sleep(0.01)
        assert order == []  # the small one would fit, but waits behind the big one
        big.cancel()
        await asyncio.sleep(0.01)
        assert order == ["small"] and budget.used == 9  # the cancelled one gave way
        await small
        budget.give(9)
        await budget.take(20)  # larger than the whole budget: goes once nothing else is held
        assert budget.used == 20
        budget.charge(-20)
        assert budget.used == 0

    asyncio.run(main())


def test_data_max_connections_is_a_positive_broker_key_with_a_default() -> None:
    base = {"broker_set": "a", "data_dir": "/tmp/x", "controllers": "127.0.0.1:1", "secret": "s"}
    assert config.from_mapping(base).data_max_connections == 64
    assert config.from_mapping({**base, "data_max_connections": 2}).data_max_connections == 2
    with pytest.raises(ConfigError) as err:
        config.from_mapping({**base, "data_max_connections": 0})
    assert err.value.details.get("key") == "data_max_connections"
