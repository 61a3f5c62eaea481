"""Which transport a client uses per broker (client/dataconn.py): the data port a broker's Status
names, gRPC when it names none, cannot be asked, or its data port just failed; a connection the
broker closed closes its socket too."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog import dataport_frames as df
from tidelog.client import dataconn
from tidelog.client.dataconn import DataPlane
from tidelog.errors import UnavailableError


def test_the_data_port_named_by_status_is_used_and_a_failure_falls_back_to_grpc_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []
    answers = {"b1:1": "b1:2", "b2:1": ""}

    async def status(address: str) -> str:
        asked.append(address)
        if address == "b3:1":
            raise UnavailableError("down")
        return answers[address]

    async def main() -> None:
        plane = DataPlane(status)
        conn = await plane.connection("b1:1")
        assert conn is not None and conn.address == "b1:2"
        assert await plane.connection("b1:1") is conn and asked == ["b1:1"]  # asked once
        assert await plane.connection("b2:1") is None  # no data port: gRPC
        assert await plane.connection("b3:1") is None  # Status failed: gRPC
        plane.failed("b1:1")
        assert await plane.connection("b1:1") is None  # just failed: gRPC for a while
        monkeypatch.setattr(dataconn, "RETRY_AFTER_S", 0.0)
        again = await plane.connection("b1:1")
        assert again is not None and asked.count("b1:1") == 2  # asked Status again
        assert await DataPlane(status, enabled=False).connection("b1:1") is None
        await plane.close()

    asyncio.run(main())


def test_a_data_port_nobody_listens_on_answers_unavailable() -> None:
    async def main() -> None:
        conn = dataconn.DataConnection("127.0.0.1:1")
        with pytest.raises(UnavailableError, match="cannot reach the data port"):
            await conn.call(1, [b""], timeout=2.0)
        assert conn.closed
        await conn.close()

    asyncio.run(main())


def test_a_connection_the_broker_closed_closes_its_socket_before_the_plane_replaces_it() -> None:
    async def main() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(df.HEAD_SIZE)  # a request arrived: go away without answering
            writer.close()

        server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

        async def status(_grpc_address: str) -> str:
            return address

        plane = DataPlane(status)
        try:
            conn = await plane.connection("b1:1")
            assert conn is not None
            with pytest.raises(UnavailableError, match="was lost"):
                await conn.call(df.OP_PULL, [b"x"], timeout=5.0)
            sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
            for _ in range(50):
                if sock.fileno() == -1:
                    break
                await asyncio.sleep(0.02)
            assert sock.fileno() == -1, "the lost connection's socket is still open"
            assert await plane.connection("b1:1") is not conn  # replaced, with nothing left open
        finally:
            await plane.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([df.OK, df.ERROR]), st.integers(0, 2**32 - 1), st.integers(0, 70_000)),
        max_size=6,
    ),
    st.lists(st.integers(1, 100_000), min_size=1, max_size=30),
)
def test_reply_frames_arrive_whole_and_in_order_however_the_socket_cuts_them(
    frames: list[tuple[int, int, int]], cuts: list[int]
) -> None:
    """Small frames through the scratch buffer, large bodies into buffers of their own, cut at
    any byte: each frame is handed over once, with exactly its bytes."""
    sent = [(status, rid, bytes([rid % 251]) * size) for status, rid, size in frames]
    stream = b"".join(b"".join(df.frame(status, rid, body)) for status, rid, body in sent)
    got: list[tuple[int, int, bytes]] = []
    lost: list[str] = []
    reader = dataconn.ReplyReader(lambda s, r, b: got.append((s, r, bytes(b))), lost.append)
    pos, turn = 0, 0
    while pos < len(stream):
        buf = reader.get_buffer(-1)
        n = min(len(buf), cuts[turn % len(cuts)], len(stream) - pos)
        assert n > 0
        buf[:n] = stream[pos : pos + n]
        reader.buffer_updated(n)
        pos, turn = pos + n, turn + 1
    assert got == sent and not lost
    reader.connection_lost(None)
    assert lost == ["closed by the broker"]


def test_a_frame_longer_than_the_limit_ends_the_connection() -> None:
    lost: list[str] = []
    reader = dataconn.ReplyReader(lambda s, r, b: None, lost.append)
    buf = reader.get_buffer(-1)
    head = df.HEAD.pack(df.MAX_FRAME + 1, df.OK, 1)
    buf[: len(head)] = head
    reader.buffer_updated(len(head))
    assert len(lost) == 1 and "frame length" in lost[0]
