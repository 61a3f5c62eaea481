"""`tide placement status` (cli/placement.py) shows the replicas as the leader sees them.

Route reads are hedged over the controllers (client/controllers.py): when the leader is slow, a
follower's answer wins, and a follower does not know who is alive (`liveness_known` false, every
member `alive` false). The status must then ask the leader, as `tide cluster status` does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from click.testing import CliRunner

from tidelog.cli import placement
from tidelog.proto import controller_pb2 as pb

LEADER = "127.0.0.1:7102"
FOLLOWER = "127.0.0.1:7101"


def _sets(*, leader: bool) -> pb.DescribeBrokerSetsReply:
    """broker-a with two in-sync replicas, as the leader (both alive) or a follower (liveness unknown)."""
    members = [
        pb.MemberInfo(broker_id=i, datacenter=dc, in_sync=True, alive=leader, is_master=i == 1)
        for i, dc in ((1, "dc-a"), (2, "dc-b"))
    ]
    info = pb.BrokerSetInfo(role=pb.RoleAssignment(broker_set="broker-a"), members=members)
    return pb.DescribeBrokerSetsReply(liveness_known=leader, broker_sets=[info])


class FollowerFirst:
    """A controller client whose hedged route reads are answered by a follower."""

    addresses = [FOLLOWER, LEADER]

    async def placement_audit(self) -> pb.PlacementAuditReply:
        return pb.PlacementAuditReply()

    async def describe_broker_sets(self, names: Any = ()) -> pb.DescribeBrokerSetsReply:
        return _sets(leader=False)

    async def cluster_status(self, address: str | None = None) -> pb.ClusterStatusReply:
        return pb.ClusterStatusReply(leader_address=LEADER)

    async def call(self, service: str, method: str, request: Any, *, address: str | None = None) -> Any:
        assert (service, method) == ("route", "DescribeBrokerSets")
        return _sets(leader=address == LEADER)


def test_status_shows_the_leaders_liveness_when_a_follower_answers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def call(controllers: str, fn: Callable[[Any], Awaitable[Any]], **_: Any) -> Any:
        return asyncio.run(fn(FollowerFirst()))

    monkeypatch.setattr(placement, "controller_call", call)
    result = CliRunner().invoke(
        placement.placement, ["status", "--controllers", f"{FOLLOWER},{LEADER}", "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [(r["broker_id"], r["alive"], r["in_sync"]) for r in doc["replicas"]] == [
        (1, True, True),
        (2, True, True),
    ]
