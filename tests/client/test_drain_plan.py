"""`tide broker drain`'s choice of the new master (pure): only an alive in-sync replica other
than the master, typed refusals otherwise."""

from __future__ import annotations

import pytest

from tidelog.cli.brokerops import broker_rows, drain_plan
from tidelog.errors import ControllerMasterNotAvailableError, NoOtherInSyncReplicaError, UnavailableError
from tidelog.proto import controller_pb2 as pb


def member(i: int, *, in_sync: bool = True, alive: bool = True, offset: int = 100) -> pb.MemberInfo:
    return pb.MemberInfo(
        broker_id=i, address=f"h:{i}", in_sync=in_sync, alive=alive, last_epoch=3, last_max_offset=offset
    )


def info(*members: pb.MemberInfo, master: int | None = 1) -> pb.BrokerSetInfo:
    role = pb.RoleAssignment(
        broker_set="a",
        has_master=master is not None,
        master_id=master or 0,
        sync_state_set=[m.broker_id for m in members if m.in_sync],
    )
    for m in members:
        m.is_master = m.broker_id == master
    return pb.BrokerSetInfo(role=role, members=members)


def test_the_newest_alive_in_sync_replica_takes_over() -> None:
    plan = drain_plan(info(member(1), member(2, offset=90), member(3, offset=120)), True, None)
    assert (plan.old_master, plan.new_master, plan.new_address) == (1, 3, "h:3")


def test_a_named_replica_is_taken_when_it_qualifies() -> None:
    assert drain_plan(info(member(1), member(2, offset=90), member(3)), True, 2).new_master == 2


@pytest.mark.parametrize(
    "members",
    [
        (member(1),),
        (member(1), member(2, in_sync=False)),
        (member(1), member(2, alive=False)),
    ],
)
def test_no_other_in_sync_replica_is_a_typed_refusal(members: tuple[pb.MemberInfo, ...]) -> None:
    with pytest.raises(NoOtherInSyncReplicaError, match="no alive in-sync replica besides the master 1"):
        drain_plan(info(*members), True, None)


def test_a_named_replica_that_does_not_qualify_is_refused() -> None:
    for target in (2, 9):
        with pytest.raises(NoOtherInSyncReplicaError, match=f"broker {target} of a"):
            drain_plan(info(member(1), member(2, in_sync=False), member(3)), True, target)


def test_no_master_or_unknown_liveness_is_refused() -> None:
    with pytest.raises(ControllerMasterNotAvailableError):
        drain_plan(info(member(1), member(2), master=None), True, None)
    with pytest.raises(UnavailableError):
        drain_plan(info(member(1), member(2)), False, None)


def test_broker_rows_say_role_datacenter_and_liveness() -> None:
    reply = pb.DescribeBrokerSetsReply(
        broker_sets=[info(member(1), member(2, in_sync=False))], liveness_known=False
    )
    reply.broker_sets[0].members[0].datacenter = "dc1"
    rows = broker_rows(reply)
    assert [(r["id"], r["role"], r["datacenter"], r["alive"]) for r in rows] == [
        (1, "master", "dc1", None),
        (2, "slave (catching up)", None, None),
    ]


def test_naming_the_master_itself_is_a_plan_with_nothing_to_do() -> None:
    plan = drain_plan(info(member(1), member(2, in_sync=False), member(3)), True, 1)
    assert (plan.old_master, plan.new_master, plan.new_address) == (1, 1, "h:1")
