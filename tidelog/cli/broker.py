"""`tide broker`: run one broker replica from a YAML config."""

from __future__ import annotations

import logging

import click

from tidelog.broker import config as bcfg


@click.command("broker")
@click.option("--config", "config_path", required=True, metavar="FILE", help="broker YAML config")
@click.option("--data-dir", default=None, help="override the config's data_dir")
@click.option("--listen", default=None, help="override the gRPC address (host:port)")
@click.option("--ha-listen", default=None, help="override the HA address (host:port)")
@click.option("--controllers", default=None, help="override the controller addresses")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def broker(config_path: str, data_dir: str | None, listen: str | None, ha_listen: str | None,
           controllers: str | None, log_level: str) -> None:
    """Run a broker replica: commit log, replication and the produce/consume service."""
    cfg = bcfg.load(config_path)
    overrides = {k: v for k, v in (("data_dir", data_dir), ("listen", listen), ("ha_listen", ha_listen),
                                   ("controllers", controllers)) if v is not None}
    if overrides:
        doc = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
        doc.update(overrides)
        doc["data_dir"] = str(doc["data_dir"])
        cfg = bcfg.from_mapping(doc, source=config_path)
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s [" + cfg.broker_set + "] %(message)s")
    from tidelog.broker.server import run  # late: `tide --help` need not load gRPC

    run(cfg)
