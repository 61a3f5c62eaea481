"""`tide controller`: run one controller node from a YAML config, and recover a controller cluster
that lost its majority for good (`recover`, `add-node`; docs/RUNBOOK-quorum.md)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import click

from tidelog import logs
from tidelog.cli.common import log_options
from tidelog.clusterauth import secret_from_env
from tidelog.controller import config as ccfg
from tidelog.errors import ConfigError, UnavailableError
from tidelog.private import require_private


@click.group("controller", invoke_without_command=True)
@click.option("--config", "config_path", default=None, metavar="FILE", help="controller YAML config")
@click.option("--node-id", default=None, help="which of the config's nodes this process is")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@log_options
@click.pass_context
def controller(
    ctx: click.Context,
    config_path: str | None,
    node_id: str | None,
    data_dir: str | None,
    log_level: str,
    log_format: str | None,
) -> None:
    """Run a controller node (Raft-replicated authority over masters, epochs and SyncStateSets).

    `tide controller --config FILE [--node-id ID]` runs the node; `recover` and `add-node` are
    the forced quorum recovery of docs/RUNBOOK-quorum.md."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("--config is required to run a controller node")
    cfg = ccfg.load(config_path, node_id=node_id, data_dir=data_dir)
    if cfg.secret and cfg.secret != secret_from_env():
        # the file holds the cluster secret: refused while other local accounts can read it
        require_private(config_path, "config file (it holds the cluster secret)")
    logs.configure(
        log_format or cfg.log_format,
        log_level,
        tag=cfg.node_id,
        file=cfg.log_file,
        max_bytes=cfg.log_max_bytes,
        backups=cfg.log_backups,
    )
    # Imported late so that `tide --help` does not pay for gRPC and PySyncObj.
    from tidelog.controller.node import run, with_secret

    run(with_secret(cfg))


def _load(config_path: str, node_id: str, data_dir: str | None) -> ccfg.ControllerConfig:
    cfg = ccfg.load(config_path, node_id=node_id, data_dir=data_dir)
    if cfg.secret:  # the usual case; the node module (gRPC) is not needed, and the operator waits
        return cfg
    from tidelog.controller.node import with_secret

    return with_secret(cfg)


@controller.command("recover")
@click.option("--config", "config_path", required=True, metavar="FILE", help="controller YAML config")
@click.option("--node-id", required=True, help="the surviving controller to recover (stopped)")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@click.option("--yes", is_flag=True, help="confirm: the other controllers are gone for good")
@click.option(
    "--lost-datacenter",
    "lost_datacenters",
    multiple=True,
    metavar="DC",
    help="a datacenter lost with the other controllers (repeatable): its silent masters are "
    "failed over without the new leader's heartbeat grace",
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def recover(
    config_path: str,
    node_id: str,
    data_dir: str | None,
    yes: bool,
    lost_datacenters: tuple[str, ...],
    as_json: bool,
) -> None:
    """Restart the stopped controller NODE_ID as a new one-node cluster at a new cluster epoch.

    Only when the controller majority is lost for good (a datacenter gone): the old nodes are
    fenced from then on and rejoin only wiped (`add-node`). Prints what is known committed and
    what cannot be known. Start the node afterwards as usual."""
    if not yes:
        raise click.UsageError(
            "recover forces a new controller cluster from this node alone: check first that the "
            "other controllers are down and cut off (docs/RUNBOOK-quorum.md), then pass --yes"
        )
    from tidelog.controller.recover import recover as run_recover

    logs.configure("text", "WARNING", tag=node_id)
    report = run_recover(_load(config_path, node_id, data_dir), lost_datacenters=lost_datacenters)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        return
    for line in report.lines():
        click.echo(line)
    click.echo(f"next: start it (tide controller --config {config_path} --node-id {node_id}); brokers follow")


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def _recovered_cluster(cfg: ccfg.ControllerConfig) -> tuple[int, tuple[str, ...], ccfg.NodeAddress]:
    """(cluster epoch, members, leader) of the recovered cluster, asked of the config's other nodes
    (a node of an older epoch is skipped: the newest epoch any node answers is the cluster's)."""
    from tidelog.client.controllers import ControllerClient

    others = [n.grpc for n in cfg.peers]
    if not others:
        raise ConfigError("the config names no other controller to join", key="nodes")

    async def statuses() -> list[Any]:
        async with ControllerClient(others, secret=cfg.secret, total_timeout=5.0) as client:
            out = []
            for address in others:
                try:
                    out.append(await client.cluster_status(address=address))
                except Exception as exc:  # an unreachable or fenced node is skipped
                    click.echo(f"{address}: {exc}", err=True)
            return out

    replies = [r for r in asyncio.run(statuses()) if r.leader_id]
    if not replies:
        raise UnavailableError("no controller of the recovered cluster answered with a leader")
    epoch = max(r.cluster_epoch for r in replies)
    if epoch == 0:
        raise ConfigError(
            "the controller cluster was never recovered (cluster epoch 0): add-node grows only a "
            "recovered cluster; a regular cluster's members are its config's nodes",
            key="--node-id",
        )
    status = next(r for r in replies if r.cluster_epoch == epoch)
    return int(epoch), tuple(status.members), cfg.node(status.leader_id)


@controller.command("add-node")
@click.option("--config", "config_path", required=True, metavar="FILE", help="controller YAML config")
@click.option("--node-id", required=True, help="the controller to add (stopped; its data dir is wiped)")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@click.option("--wait", "wait_s", default=120.0, show_default=True, help="seconds to wait for it to start")
@click.option("--yes", is_flag=True, help="confirm: wipe the node's data dir (it is moved aside)")
def add_node(config_path: str, node_id: str, data_dir: str | None, wait_s: float, yes: bool) -> None:
    """Grow a recovered controller cluster by NODE_ID: wipe it, then add it once it runs.

    Its data dir is moved aside (never merged), its identity file names the new cluster, and
    once it listens the leader adds it (one node at a time)."""
    if not yes:
        raise click.UsageError("add-node wipes the node's data dir (moved aside): pass --yes")
    from tidelog.controller.recover import load_identity, prepare_join, request_add

    cfg = _load(config_path, node_id, data_dir)
    epoch, members, leader = _recovered_cluster(cfg)
    ident = load_identity(cfg)
    prepared = ident is not None and ident.epoch == epoch and node_id in ident.members
    moved = None if prepared and _listening(cfg.self_node.raft) else prepare_join(cfg, epoch, members)
    if moved is not None:
        click.echo(f"{node_id}: old data dir moved aside to {moved} (delete it once the node caught up)")
    click.echo(
        f"{node_id}: will join cluster epoch {epoch} (members {', '.join(members)}; leader {leader.id}); "
        f"start it now: tide controller --config {config_path} --node-id {node_id}"
    )
    deadline = time.monotonic() + wait_s
    while not _listening(cfg.self_node.raft):
        if time.monotonic() > deadline:
            raise UnavailableError(
                f"{node_id} did not start listening on {cfg.self_node.raft} within {wait_s:.0f} s",
                hint="start it, then run add-node again (its data dir is already prepared)",
            )
        time.sleep(0.2)
    request_add(leader.raft, cfg.self_node.raft, cfg.secret or "", epoch)
    click.echo(
        f"{node_id}: added to cluster epoch {epoch}; members now {', '.join(sorted({*members, node_id}))}"
    )
