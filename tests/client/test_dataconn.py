"""Which transport a client uses per broker (client/dataconn.py): the data port a broker's Status
names, gRPC when it names none, cannot be asked, or its data port just failed; a connection the
broker closed closes its socket too."""

from __future__ import annotations

import asyncio

import pytest

from tidelog import dataframes as df
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
            sock = conn._writer.get_extra_info("socket")  # type: ignore[union-attr]
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
