"""controller/RULES.md L7 on a real controller node over gRPC: while an election of a set is in
flight its master's heartbeat replies renew no lease, and an operator's hand-over from a live
master is committed only once the last lease that master was granted has run out."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.controller.inproc import single_node
from tests.controller.simbroker import SimBroker
from tidelog.client.controllers import ControllerClient
from tidelog.controller.node import ControllerNode
from tidelog.errors import ControllerMasterStillExistError
from tidelog.ha.lease import handover_wait_ms

TIMEOUT_MS = 1500  # tests/controller/inproc.py's heartbeat_timeout_ms


async def _master_and_slave_in_sync(client: ControllerClient) -> tuple[SimBroker, SimBroker]:
    """Two registered brokers, 1 elected master and both in its SyncStateSet."""
    b1, b2 = SimBroker(client, "broker-a", 1), SimBroker(client, "broker-a", 2)
    for b in (b1, b2):
        await b.register()
        await b.beat_once()
    role = (await client.elect_master("broker-a", b1.broker_id)).role
    ids = {b1.broker_id, b2.broker_id}
    await client.alter_sync_state_set(
        "broker-a", b1.broker_id, role.master_epoch, ids, role.sync_state_set_epoch
    )
    return b1, b2


def test_a_hand_over_from_a_live_master_withholds_its_lease_and_waits_it_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (node, client):
            b1, b2 = await _master_and_slave_in_sync(client)
            b2.start()  # b2 keeps beating; b1 is driven by hand below
            granted = await b1.beat_once()
            assert granted.role.master_id == b1.broker_id and not granted.lease_withheld
            epoch = granted.role.master_epoch

            started = time.monotonic()
            hand_over = asyncio.ensure_future(client.elect_master("broker-a", b2.broker_id, designated=True))
            withheld_seen = False
            while not hand_over.done():
                reply = await b1.beat_once()
                if reply.role.master_epoch == epoch:  # the election has not committed yet
                    # once the controller has the request, no reply renews the old master's lease
                    assert reply.lease_withheld or not withheld_seen, "a lease renewed during the hand-over"
                    withheld_seen = withheld_seen or reply.lease_withheld
                await asyncio.sleep(0.05)
            elected = await hand_over
            took_ms = (time.monotonic() - started) * 1000
            assert withheld_seen
            assert elected.role.master_id == b2.broker_id and elected.role.master_epoch == epoch + 1
            # the last lease b1 got (sent before `started`) ended before another master existed
            assert took_ms >= handover_wait_ms(TIMEOUT_MS)
            assert not node.lease_fences.withholds("broker-a", epoch + 1)
            assert not (await b2.beat_once()).lease_withheld  # the new master's lease is renewed
            await b2.stop()

    asyncio.run(scenario())


def test_a_hand_over_to_the_master_itself_does_not_wait(tmp_path: Path) -> None:
    """Nothing to wait out: the lease stays with the broker it was granted to. (A silent master
    needs no wait either, but the controller fails it over by itself before an operator could.)"""

    async def scenario() -> None:
        async with single_node(tmp_path) as (node, client):
            b1, b2 = await _master_and_slave_in_sync(client)
            b1.start()
            b2.start()
            started = time.monotonic()
            with pytest.raises(ControllerMasterStillExistError):
                await client.elect_master("broker-a", b1.broker_id, designated=True)
            assert (time.monotonic() - started) * 1000 < handover_wait_ms(TIMEOUT_MS)
            assert not node.lease_fences.withholds("broker-a", 1)  # the fence is lifted again
            await b1.stop()
            await b2.stop()

    asyncio.run(scenario())


def test_a_term_starts_before_it_answers_so_its_first_tick_keeps_an_elections_fence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader answers requests once it has caught up, which may be before its leader loop first
    runs: the start of the term (grace, fences of earlier terms cleared) must already have happened,
    or that first run clears the fence of an election a request started meanwhile, and the old
    master's lease is renewed while the election is in flight."""

    async def idle(self: ControllerNode, stop: asyncio.Event) -> None:
        await stop.wait()

    monkeypatch.setattr(ControllerNode, "_leader_loop", idle)  # only requests start the term

    async def scenario() -> None:
        async with single_node(tmp_path) as (node, _client):
            await node.ensure_ready()  # what every request does first
            token = node.lease_fences.hold("broker-a", 1)  # an election a request started
            await node.leader_tick()  # the leader loop's first run in this term
            assert node.lease_fences.withholds("broker-a", 1)
            node.lease_fences.release(token)

    asyncio.run(scenario())
