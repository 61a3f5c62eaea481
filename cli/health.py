"""`tide health`: ask a broker or controller whether it is ready, and wait until it is.

A process serves `/healthz` (it runs) and `/readyz` (a broker registered with a known role; a
controller whose Raft group has a leader) on its `metrics_address` (deploy/METRICS.md). This
command asks one of them, given the address or the process's own config file, and can keep
asking for `--wait` seconds: the systemd units in `deploy/systemd/` run it as `ExecStartPost`, so
a unit counts as started only once its process is ready, and scripts can wait on a restart.

The decisions (which address a config names; what an answer means) are pure functions; the
command is the loop around one HTTP GET.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from tidelog.cli.common import emit, json_option
from tidelog.errors import ConfigError

POLL_S = 0.5
REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Answer:
    """One ask: ready or not, the HTTP status (0: no answer) and the process's reason."""

    ready: bool
    status: int
    reason: str


def metrics_address_of(doc: Any, source: str, node_id: str | None) -> str:
    """The metrics address a broker or controller config names (a controller's: its node's)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys")
    if "nodes" in doc:  # a controller config: one file for every node
        nodes = [n for n in doc.get("nodes") or [] if isinstance(n, dict)]
        if node_id is None and len(nodes) == 1:
            node_id = str(nodes[0].get("id"))
        node = next((n for n in nodes if str(n.get("id")) == node_id), None)
        if node is None:
            raise ConfigError(
                f"{source}: no node {node_id!r} among {[n.get('id') for n in nodes]}",
                key="--node-id",
                hint="name the node with --node-id",
            )
        address = str(node.get("metrics_address") or "")
    else:
        address = str(doc.get("metrics_address") or "")
    if not address:
        raise ConfigError(
            f"{source}: no metrics_address, so the process serves no health endpoint",
            key="metrics_address",
            hint="set metrics_address (deploy/CONFIG.md) and restart the process",
        )
    return address


def answer_of(status: int, body: str) -> Answer:
    """What one HTTP answer means: 200 is ready; anything else is not, with the process's reason."""
    reason = body.strip().splitlines()[0] if body.strip() else f"HTTP {status}"
    return Answer(status == 200, status, "ready" if status == 200 else reason)


def ask(address: str, path: str) -> Answer:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=REQUEST_TIMEOUT_S) as reply:
            return answer_of(reply.status, reply.read(4096).decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return answer_of(exc.code, exc.read(4096).decode(errors="replace"))
    except (OSError, ValueError) as exc:
        return Answer(False, 0, f"no answer from {address}: {getattr(exc, 'reason', exc)}")


def _address(address: str | None, config: Path | None, node_id: str | None) -> str:
    if address is not None:
        if config is not None:
            raise click.UsageError("give either --address or --config, not both")
        return address
    if config is None:
        raise click.UsageError("give either --address or --config")
    try:
        doc = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {config}: {exc}", key="--config") from exc
    return metrics_address_of(doc, str(config), node_id)


@click.command()
@click.option("--address", default=None, help="the process's metrics_address (host:port)")
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the broker's or controller's config file: its metrics_address is asked",
)
@click.option("--node-id", default=None, help="with a controller config: which node")
@click.option(
    "--wait",
    type=click.FloatRange(0, 3600),
    default=0.0,
    show_default=True,
    help="seconds to keep asking until ready (0: ask once)",
)
@click.option("--live", is_flag=True, help="ask /healthz (the process runs) instead of /readyz")
@json_option
def health(
    address: str | None, config: Path | None, node_id: str | None, wait: float, live: bool, as_json: bool
) -> None:
    """Exit 0 once the process answers ready (or alive, with --live); 1 if it does not in time."""
    target = _address(address, config, node_id)
    path = "/healthz" if live else "/readyz"
    deadline = time.monotonic() + wait
    while True:
        answer = ask(target, path)
        if answer.ready or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    doc = {
        "address": target,
        "path": path,
        "ready": answer.ready,
        "status": answer.status,
        "reason": answer.reason,
    }
    emit(doc, as_json, title=f"{target}{path}")
    if not answer.ready:
        raise SystemExit(1)
