"""What strangers on the HA port cost the log (docs/SECURITY.md, probe 13), in process against a
real listening master (broker/replica.py `handle_ha_connection`): connections closed before the
proof, or displaced from their slot, are counted by reason and logged at most a few lines a second
per peer host, not a line or two each; and a connection whose task is cancelled (the broker
stopping) ends without asyncio logging a traceback."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest

from tests.fuzz.replica import Master, master
from tidelog.guard import HA_DISPLACED, HA_UNPROVEN, LOG_PER_PEER_PER_S
from tidelog.ha import protocol as p
from tidelog.tasks import within

STRANGERS = 60


async def _hello_and_go(port: int, proof: bool) -> None:
    """A stranger's connection: a hello claiming broker 2, then a forged proof or nothing; waits
    until the master closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(p.encode(p.AuthHello("broker-a", 2, os.urandom(16))))
        assert isinstance(await within(p.read_frame(reader), 5.0), p.AuthChallenge)
        if proof:
            writer.write(p.encode(p.AuthProof(os.urandom(32))))
        else:
            writer.write_eof()
        while await within(reader.read(1 << 16), 5.0):
            pass  # the error frame, then EOF
    finally:
        writer.close()


async def _strangers(m: Master) -> None:
    server = await asyncio.start_server(m.replica.handle_ha_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for i in range(0, STRANGERS, 6):  # fewer at once than the slots: none displaced here
            await asyncio.gather(*(_hello_and_go(port, proof=j % 2 == 0) for j in range(i, i + 6)))
        # more silent connections at once than slots: each beyond them displaces one
        slots = m.replica.ha_slots.max_unproven
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(slots + 5)]
        await asyncio.sleep(0)  # let the handlers admit them
        while m.replica.ha_slots.evicted < 5:
            await asyncio.sleep(0.01)
        for _, w in opened:
            w.close()
        while m.replica.refusals.refusals.counts.get(HA_UNPROVEN, 0) < STRANGERS + slots + 5:
            await asyncio.sleep(0.01)  # every connection's handler has ended
    finally:
        server.close()
        await server.wait_closed()


def test_strangers_on_the_ha_port_are_counted_and_logged_a_few_lines_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with master() as m, caplog.at_level(logging.INFO):
        m.run(_strangers(m), 60)
        counts = m.replica.refusals.refusals.counts
    assert counts[HA_DISPLACED] >= 5
    assert counts[HA_UNPROVEN] >= STRANGERS + 5
    lines = [r for r in caplog.records if "HA connection" in r.getMessage() or "refused" in r.getMessage()]
    # one peer host, a run of a few seconds at most: a handful of lines a second, not one each
    assert len(lines) <= 3 * LOG_PER_PEER_PER_S, [r.getMessage() for r in lines]
    assert any("did not prove the cluster secret" in r.getMessage() for r in lines)


async def _cancelled_connection(m: Master) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    server = await asyncio.start_server(m.replica.handle_ha_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        handler = None
        while handler is None:  # the connection's task, waiting for a hello
            await asyncio.sleep(0.01)
            handler = next(
                (t for t in asyncio.all_tasks() if "handle_ha_connection" in repr(t.get_coro())), None
            )
        handler.cancel()  # as when the broker stops
        while not handler.done():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # asyncio's done callback has run
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
        loop.set_exception_handler(None)
    return errors


def test_a_cancelled_ha_connection_ends_without_a_traceback() -> None:
    with master() as m:
        errors = m.run(_cancelled_connection(m), 30)
    assert not errors, errors
