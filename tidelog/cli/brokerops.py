"""`tide broker list` and `tide broker drain`: every broker at a glance, and handing a broker
set's master role to another in-sync replica before maintenance.

A drain is an operator-requested (designated) election, the same controller command as
`tide admin elect --broker-id` (controller/RULES.md §2): the controller elects only an alive
SyncStateSet member, so the new master holds every acknowledged write. What the drain adds is
the choice of that member and the checks an operator wants first: a typed refusal when no
other in-sync replica is alive, and a wait until the new master serves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import click

from tidelog.cli.common import (
    controller_call,
    controllers_option,
    describe_with_liveness,
    emit,
    json_option,
    require_controllers,
    secret_options,
)
from tidelog.client.aio import AsyncClient
from tidelog.client.controllers import ControllerClient
from tidelog.errors import (
    ControllerMasterNotAvailableError,
    NoOtherInSyncReplicaError,
    TidelogError,
    UnavailableError,
)
from tidelog.proto import broker_pb2 as bpb
from tidelog.proto import controller_pb2 as pb


def member_role(m: pb.MemberInfo) -> str:
    if m.is_master:
        return "master"
    return "slave (in sync)" if m.in_sync else "slave (catching up)"


def broker_rows(reply: pb.DescribeBrokerSetsReply) -> list[dict[str, Any]]:
    """One row per broker of every set; `alive` is None when no leader answered (unknown)."""
    rows = []
    for info in reply.broker_sets:
        for m in info.members:
            rows.append(
                {
                    "broker_set": info.role.broker_set,
                    "id": m.broker_id,
                    "address": m.address,
                    "role": member_role(m),
                    "datacenter": m.datacenter or None,
                    "alive": m.alive if reply.liveness_known else None,
                    "epoch": m.last_epoch,
                    "max_offset": m.last_max_offset,
                }
            )
    return rows


@dataclass(frozen=True)
class DrainPlan:
    broker_set: str
    old_master: int
    new_master: int
    new_address: str


def drain_plan(info: pb.BrokerSetInfo, liveness_known: bool, target: int | None) -> DrainPlan:
    """Who takes the master role over: `target` if it is an alive in-sync replica other than the
    master, else the alive in-sync replica with the newest log (lowest id on a tie). A `target`
    that is the master already gives a plan whose old and new master are the same: nothing to do,
    so a script that wants a given broker to lead may ask twice. Pure."""
    name, role = info.role.broker_set, info.role
    if not role.has_master:
        raise ControllerMasterNotAvailableError(f"broker set {name} has no master: nothing to drain")
    if target is not None and target == role.master_id:
        master = next((m for m in info.members if m.broker_id == target), None)
        return DrainPlan(name, target, target, master.address if master is not None else role.master_address)
    if not liveness_known:
        raise UnavailableError("no controller leader answered, so which replicas are alive is unknown")
    others = [m for m in info.members if m.broker_id != role.master_id and m.in_sync and m.alive]
    if target is not None:
        others = [m for m in others if m.broker_id == target]
        if not others:
            raise NoOtherInSyncReplicaError(
                f"broker {target} of {name} is not an alive in-sync replica other than "
                f"the master {role.master_id} (SyncStateSet {sorted(role.sync_state_set)})"
            )
    if not others:
        raise NoOtherInSyncReplicaError(
            f"broker set {name}: no alive in-sync replica besides the master {role.master_id} "
            f"(SyncStateSet {sorted(role.sync_state_set)})"
        )
    best = min(others, key=lambda m: (-m.last_epoch, -m.last_max_offset, m.broker_id))
    return DrainPlan(name, role.master_id, best.broker_id, best.address)


async def _serves_as_master(client: AsyncClient, address: str, epoch: int, deadline: float) -> bool:
    """Poll the new master's Status until it serves as master of `epoch` (or later)."""
    while time.monotonic() < deadline:
        try:
            st = await client.call_broker(address, "Status", bpb.StatusRequest(), timeout=2.0)
            if st.role == "master" and st.master_epoch >= epoch:
                return True
        except TidelogError:
            pass  # it may be restarting its listeners: ask again
        await asyncio.sleep(0.1)
    return False


async def drain(c: ControllerClient, broker_set: str, target: int | None, wait: float) -> dict[str, Any]:
    reply = await describe_with_liveness(c, [broker_set])
    plan = drain_plan(reply.broker_sets[0], reply.liveness_known, target)
    if plan.new_master == plan.old_master:
        click.echo(
            f"{broker_set}: broker {plan.new_master} is the master already; nothing to hand over", err=True
        )
        role = reply.broker_sets[0].role
        return {**asdict(plan), "master": role.master_id, "master_epoch": role.master_epoch, "serving": True}
    click.echo(
        f"{broker_set}: handing the master role from broker {plan.old_master} to {plan.new_master}",
        err=True,
    )
    elected = await c.elect_master(broker_set, plan.new_master, designated=True)
    role = elected.role
    async with AsyncClient(c.addresses) as client:
        serving = await _serves_as_master(
            client, plan.new_address, role.master_epoch, time.monotonic() + wait
        )
    return {
        **asdict(plan),
        "master": role.master_id,
        "master_epoch": role.master_epoch,
        "serving": serving,
    }


@click.command("list")
@controllers_option
@json_option
def broker_list(controllers: str, as_json: bool) -> None:
    """Every broker: its set, id, address, role, datacenter and whether it is alive."""
    reply = controller_call(require_controllers(controllers), lambda c: describe_with_liveness(c, ()))
    rows = broker_rows(reply)
    if not as_json:
        for r in rows:
            r["alive"] = {True: "yes", False: "no", None: "unknown"}[r["alive"]]
    emit(rows, as_json, title="brokers", columns=_LIST_COLUMNS)


_LIST_COLUMNS: Sequence[str] = (
    "broker_set",
    "id",
    "address",
    "role",
    "datacenter",
    "alive",
    "epoch",
    "max_offset",
)


@click.command("drain")
@click.argument("broker_set")
@click.option(
    "--broker",
    "target",
    type=click.IntRange(min=0),
    default=None,
    help="the in-sync replica to hand the role to (default: the one with the newest log)",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="seconds to wait for the new master to serve",
)
@controllers_option
@secret_options
@json_option
def broker_drain(
    broker_set: str,
    target: int | None,
    wait: float,
    controllers: str,
    secret_file: str | None,
    data_dir: str,
    as_json: bool,
) -> None:
    """Hand BROKER_SET's master role to another in-sync replica before maintenance.

    An operator-requested election: the controller elects only an alive SyncStateSet member, so
    no acknowledged write is lost; producers move to the new master on their next send. Refused
    (NO_OTHER_IN_SYNC_REPLICA) when no other in-sync replica is alive. Afterwards the old master
    is a slave and may be stopped."""
    result = controller_call(
        require_controllers(controllers),
        lambda c: drain(c, broker_set, target, wait),
        secret_file=secret_file,
        data_dir=data_dir,
    )
    if as_json:
        emit(result, True)
        return
    if result["new_master"] == result["old_master"]:
        return  # drain() said so: the named broker leads already
    state = "serves" if result["serving"] else f"did not serve within {wait:g} s (check `tide broker list`)"
    click.echo(
        f"{broker_set}: broker {result['new_master']} is master at epoch {result['master_epoch']} and "
        f"{state}; broker {result['old_master']} is now a slave"
    )


def register(group: click.Group) -> None:
    """Add these commands to `tide broker`."""
    group.add_command(broker_list)
    group.add_command(broker_drain)
