"""`tide admin ...`: operator commands against a running controller cluster.

Every command takes `--controllers host:port[,...]` (default `$TIDE_CONTROLLERS`), prints a
readable table, or the raw reply as JSON with `--json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.table import Table

from tidelog.cli.common import console, controller_call, describe_with_liveness
from tidelog.client.controllers import CONTROLLERS_ENV, ControllerClient
from tidelog.client.unclean import unclean_rpo

T = TypeVar("T")


def _run(ctx: click.Context, fn: Callable[[ControllerClient], Awaitable[T]]) -> T:
    return controller_call(
        ctx.obj["controllers"],
        fn,
        timeout=ctx.obj["timeout"],
        secret_file=ctx.obj["secret_file"],
        data_dir=ctx.obj["data_dir"],
    )


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Message):
        return json_format.MessageToDict(
            value,
            always_print_fields_with_no_presence=True,
            unquote_int64_if_possible=True,
            preserving_proto_field_name=True,
        )
    if isinstance(value, list | tuple):
        return [_to_jsonable(v) for v in value]
    return value


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(_to_jsonable(value), indent=2, sort_keys=True))


def _ids(ids: Any) -> str:
    return "{" + ", ".join(str(i) for i in ids) + "}"


json_option = click.option("--json", "as_json", is_flag=True, help="print the reply as JSON")


@click.group("admin")
@click.option(
    "--controllers",
    default=lambda: os.environ.get(CONTROLLERS_ENV, "127.0.0.1:9701"),
    show_default=f"${CONTROLLERS_ENV} or 127.0.0.1:9701",
    help="controller addresses host:port[,...]",
)
@click.option("--timeout", default=15.0, show_default=True, help="total seconds to find the leader")
@click.option(
    "--secret-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="file holding the cluster secret (elect and clean are signed with it)",
)
@click.option(
    "--data-dir",
    default=lambda: os.environ.get("TIDE_DATA_DIR", "tide-data"),
    show_default="$TIDE_DATA_DIR or ./tide-data",
    help="a cluster started by `tide cluster up`: its controller.yaml holds the secret",
)
@click.pass_context
def admin(
    ctx: click.Context, controllers: str, timeout: float, secret_file: str | None, data_dir: str
) -> None:
    """Operate a controller cluster: broker sets, elections, topics.

    `elect` and `clean` are membership calls, signed with the cluster secret: from --secret-file,
    else $TIDE_CLUSTER_SECRET, else the controller.yaml that `tide cluster up` wrote in --data-dir."""
    ctx.obj = {
        "controllers": controllers,
        "timeout": timeout,
        "secret_file": secret_file,
        "data_dir": data_dir,
    }


@admin.command("status")
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Raft status of every controller node."""

    async def go(client: ControllerClient) -> list[Any]:
        out = []
        for addr in client.addresses:
            try:
                out.append(await client.cluster_status(address=addr))
            except Exception as exc:  # an unreachable node is a row, not a failure
                out.append({"address": addr, "error": str(exc)})
        return out

    rows = _run(ctx, go)
    if as_json:
        _emit_json(rows)
        return
    table = Table(title="controller nodes")
    columns = (
        "node",
        "state",
        "leader",
        "term",
        "commit",
        "applied",
        "ready",
        "brokers heard",
        "cluster epoch",
    )
    for col in (*columns, "members"):
        table.add_column(col)
    for r in rows:
        if isinstance(r, dict):
            table.add_row(r["address"], f"[red]{r['error']}[/red]", *[""] * len(columns))
        else:
            table.add_row(
                r.node_id,
                r.raft_state,
                r.leader_address or "-",
                str(r.term),
                str(r.commit_index),
                str(r.last_applied),
                "yes" if r.ready else "no",
                str(r.brokers_heard),
                str(r.cluster_epoch),  # raised by each forced recovery (docs/RUNBOOK-quorum.md)
                ",".join(r.members),
            )
    console().print(table)


@admin.command("broker-sets")
@click.argument("names", nargs=-1)
@json_option
@click.pass_context
def broker_sets(ctx: click.Context, names: tuple[str, ...], as_json: bool) -> None:
    """Describe broker sets: master, epochs, SyncStateSet and members."""
    reply = _run(ctx, lambda c: describe_with_liveness(c, names))
    if as_json:
        _emit_json(reply)
        return
    out = console()
    table = Table(
        title="broker sets"
        + ("" if reply.liveness_known else " (liveness unknown: no controller leader answered)")
    )
    for col in ("broker set", "master", "epoch", "SyncStateSet", "sss epoch", "members"):
        table.add_column(col)
    for info in reply.broker_sets:
        role = info.role
        members = []
        for m in info.members:
            flags = ("M" if m.is_master else "") + ("S" if m.in_sync else "")
            life = ("up" if m.alive else "down") if reply.liveness_known else "?"
            where = f" {m.datacenter}" if m.datacenter else ""
            members.append(f"{m.broker_id}@{m.address}{where} [{flags or '-'}] {life}")
        table.add_row(
            role.broker_set,
            str(role.master_id) if role.has_master else "[red]none[/red]",
            str(role.master_epoch),
            _ids(role.sync_state_set),
            str(role.sync_state_set_epoch),
            "\n".join(members),
        )
    out.print(table)


@admin.command("elect")
@click.argument("broker_set")
@click.argument("broker_id_arg", metavar="[BROKER_ID]", type=int, required=False)
@click.option("--broker-id", type=int, default=None, help="elect this broker (designated); default: policy")
@click.option(
    "--unclean",
    is_flag=True,
    help="elect BROKER_ID even from outside the SyncStateSet, losing what only the lost replicas held "
    "(prints that RPO first; docs/RUNBOOK-quorum.md)",
)
@json_option
@click.pass_context
def elect(
    ctx: click.Context,
    broker_set: str,
    broker_id_arg: int | None,
    broker_id: int | None,
    unclean: bool,
    as_json: bool,
) -> None:
    """Elect a master for BROKER_SET (the named broker, or the policy's choice)."""
    if broker_id_arg is not None and broker_id is not None and broker_id_arg != broker_id:
        raise click.UsageError("name the broker once: BROKER_ID or --broker-id")
    bid = broker_id if broker_id is not None else broker_id_arg
    if unclean and bid is None:
        raise click.UsageError("--unclean elects one named broker: give BROKER_ID")
    if unclean:
        rpo = _run(ctx, lambda c: unclean_rpo(c, broker_set, bid))  # type: ignore[arg-type]
        click.echo(rpo.line(), err=as_json)
    reply = _run(ctx, lambda c: c.elect_master(broker_set, bid, designated=bid is not None, unclean=unclean))
    if as_json:
        _emit_json(reply)
        return
    role = reply.role
    click.echo(
        f"{role.broker_set}: master {role.master_id if role.has_master else 'none'} at epoch "
        f"{role.master_epoch}, SyncStateSet {_ids(role.sync_state_set)} (epoch {role.sync_state_set_epoch})"
    )


@admin.group("topics")
def topics() -> None:
    """List and create topics with per-broker-set queue counts (`tide topic delete` deletes)."""


def _topics_table(items: list[Any]) -> Table:
    table = Table(title="topics")
    for col in ("topic", "perm", "queues"):
        table.add_column(col)
    for t in items:
        table.add_row(t.name, t.perm, ", ".join(f"{k}={v}" for k, v in sorted(t.queues.items())))
    return table


@topics.command("list")
@json_option
@click.pass_context
def topics_list(ctx: click.Context, as_json: bool) -> None:
    """List topics."""
    items = _run(ctx, lambda c: c.list_topics())
    if as_json:
        _emit_json(items)
        return
    console().print(_topics_table(items))


def _parse_queues(values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        name, sep, count = v.partition("=")
        if not sep or not name or not count.isdigit():
            raise click.BadParameter(f"expected BROKER_SET=COUNT, got {v!r}", param_hint="--queues")
        out[name] = int(count)
    if not out:
        raise click.BadParameter("name at least one broker set", param_hint="--queues")
    return out


@topics.command("create")
@click.argument("name")
@click.option(
    "--queues",
    "queues",
    multiple=True,
    required=True,
    metavar="BROKER_SET=COUNT",
    help="queues in a broker set; repeat for several broker sets",
)
@click.option("--perm", default="rw", show_default=True, type=click.Choice(["rw", "r", "w"]))
@json_option
@click.pass_context
def topics_create(ctx: click.Context, name: str, queues: tuple[str, ...], perm: str, as_json: bool) -> None:
    """Create topic NAME. A deleted name can be created again one controller heartbeat timeout
    after the delete (TOPIC_DELETION_PENDING before that)."""
    parsed = _parse_queues(queues)
    topic = _run(ctx, lambda c: c.create_topic(name, parsed, perm))
    if as_json:
        _emit_json(topic)
        return
    console().print(_topics_table([topic]))


@admin.command("clean")
@click.argument("broker_set")
@click.option(
    "--broker-id",
    "broker_ids",
    type=int,
    multiple=True,
    help="forget this broker (repeatable); default: the whole broker set",
)
@click.option("--clean-living", is_flag=True, help="also forget brokers that still heartbeat")
@json_option
@click.pass_context
def clean(
    ctx: click.Context, broker_set: str, broker_ids: tuple[int, ...], clean_living: bool, as_json: bool
) -> None:
    """Forget decommissioned brokers of BROKER_SET (or the whole set)."""
    _run(ctx, lambda c: c.clean_broker_data(broker_set, broker_ids, clean_living=clean_living))
    what = f"brokers {', '.join(map(str, sorted(broker_ids)))} of {broker_set}" if broker_ids else broker_set
    if as_json:
        _emit_json({"cleaned": broker_set, "broker_ids": sorted(broker_ids)})
        return
    click.echo(f"forgot {what}")
