"""`tide controller`: run one controller node from a YAML config."""

from __future__ import annotations

import click

from tidelog import logs
from tidelog.cli.common import log_options
from tidelog.clusterauth import secret_from_env
from tidelog.controller import config as ccfg
from tidelog.private import require_private


@click.command("controller")
@click.option("--config", "config_path", required=True, metavar="FILE", help="controller YAML config")
@click.option("--node-id", default=None, help="which of the config's nodes this process is")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@log_options
def controller(
    config_path: str, node_id: str | None, data_dir: str | None, log_level: str, log_format: str | None
) -> None:
    """Run a controller node (Raft-replicated authority over masters, epochs and SyncStateSets)."""
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
