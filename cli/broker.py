"""`tide broker`: run one broker replica from a YAML config."""

from __future__ import annotations

import dataclasses
import json

import click

from tidelog import logs
from tidelog.broker import config as bcfg
from tidelog.cli import brokerops
from tidelog.cli.common import (
    console,
    controller_call,
    controllers_option,
    log_options,
    progress,
    quiet_option,
    require_controllers,
    secret_options,
)
from tidelog.clusterauth import secret_from_env
from tidelog.private import require_private


@click.group("broker", invoke_without_command=True)
@click.option("--config", "config_path", default=None, metavar="FILE", help="broker YAML config")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@click.option("--listen", default=None, help="override the gRPC address (host:port)")
@click.option("--ha-listen", default=None, help="override the HA address (host:port)")
@click.option("--controllers", default=None, help="override the controller addresses")
@log_options
@click.pass_context
def broker(
    ctx: click.Context,
    config_path: str | None,
    data_dir: str | None,
    listen: str | None,
    ha_listen: str | None,
    controllers: str | None,
    log_level: str,
    log_format: str | None,
) -> None:
    """Run a broker replica: commit log, replication and the produce/consume service.

    `tide broker verify --data-dir DIR` checks a replica's commit log instead."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("--config is required to run a broker")
    overrides = {
        k: v
        for k, v in (
            ("data_dir", data_dir),
            ("listen", listen),
            ("ha_listen", ha_listen),
            ("controllers", controllers),
        )
        if v is not None
    }
    # over the file's own keys, before they are parsed: a parsed config does not read back as YAML
    cfg = bcfg.load(config_path, overrides)
    if cfg.secret and cfg.secret != secret_from_env():
        # the file holds the cluster secret: refused while other local accounts can read it
        require_private(config_path, "config file (it holds the cluster secret)")
    logs.configure(
        log_format or cfg.log_format,
        log_level,
        tag=cfg.broker_set,
        file=cfg.log_file,
        max_bytes=cfg.log_max_bytes,
        backups=cfg.log_backups,
    )
    from tidelog.broker.server import run  # late: `tide --help` need not load gRPC

    run(cfg)


@broker.command("verify")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="the broker's data dir (the broker may be stopped)",
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@quiet_option
def verify(data_dir: str, as_json: bool) -> None:
    """Check every record's length, magic and CRC; exit 1 when a damaged range is found."""
    from tidelog.commitlog.verify import scan, segment_bytes

    try:
        with progress(f"verifying {data_dir}", segment_bytes(data_dir), as_json) as step:
            report = scan(data_dir, on_segment=step)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "segments": report.segments,
                    "records": report.records,
                    "bytes": report.bytes,
                    "damaged": [dataclasses.asdict(d) for d in report.damage],
                },
                indent=2,
            )
        )
    else:
        out = console()
        out.print(f"{report.segments} segments, {report.records} records, {report.bytes} bytes checked")
        if report.damage:
            from rich.table import Table  # here: a broker's start never draws a table

            table = Table("file", "from offset", "to offset", "reason")
            for d in report.damage:
                table.add_row(d.path, str(d.start), str(d.end), d.reason)
            out.print(table)
        else:
            out.print("no damaged record")
    if report.damage:
        raise SystemExit(1)


def _decommission(
    controllers: str,
    broker_set: str,
    broker_id: int,
    force: bool,
    replacement: int | None,
    secret_file: str | None,
    data_dir: str,
) -> None:
    reply = controller_call(
        require_controllers(controllers),
        lambda c: c.decommission_broker(broker_set, broker_id, force=force, replacement=replacement),
        secret_file=secret_file,
        data_dir=data_dir,
    )
    role = reply.role
    what = f"replaced by broker {replacement}" if replacement is not None else "decommissioned"
    click.echo(
        f"{broker_set}: broker {broker_id} {what}; master {role.master_id if role.has_master else 'none'}, "
        f"SyncStateSet {sorted(role.sync_state_set)}"
    )


@broker.command("decommission")
@click.argument("broker_id", type=int)
@click.option("--broker-set", required=True, help="the broker set BROKER_ID belongs to")
@click.option(
    "--force",
    is_flag=True,
    help="also when it is the only in-sync replica of a required datacenter, or the broker still runs",
)
@controllers_option
@secret_options
def decommission(
    broker_id: int, broker_set: str, force: bool, controllers: str, secret_file: str | None, data_dir: str
) -> None:
    """Take a stopped broker out of its set for good (its id is never reused).

    Refused for the master, for the last in-sync replica, and (without --force) when the set
    would keep no in-sync replica in a required datacenter (controller RULES.md PL7)."""
    _decommission(controllers, broker_set, broker_id, force, None, secret_file, data_dir)


@broker.command("replace")
@click.argument("old", type=int)
@click.option("--with", "new", type=int, required=True, help="the broker that takes over (a member, in sync)")
@click.option("--broker-set", required=True, help="the broker set both belong to")
@click.option("--force", is_flag=True, help="also across datacenters, or while OLD still runs")
@controllers_option
@secret_options
def replace(
    old: int, new: int, broker_set: str, force: bool, controllers: str, secret_file: str | None, data_dir: str
) -> None:
    """Replace broker OLD by NEW: a new broker (e.g. on a fresh disk) started with the set's config
    registers under a new id and copies the whole log; once the master has taken it into the
    SyncStateSet, OLD is decommissioned. Refused before NEW is in sync."""
    _decommission(controllers, broker_set, old, force, new, secret_file, data_dir)


brokerops.register(broker)  # the operations on running brokers (list, drain) join this group
