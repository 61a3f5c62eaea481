"""Fault verbs on a cluster started by `tide cluster up`: the network ones (a `--netns` cluster)
and the process ones (any local cluster).

Network faults go through the pure rules (lab/rules.py `step`) and are applied as one nftables
transaction (lab/net.py); `heal` removes them all and restores the WAN delay. Process faults
signal the recorded pids: `kill` (SIGKILL), `pause` (SIGSTOP), `resume` (SIGCONT, or a restart
if the process is gone), `dc-down` (SIGKILL every process of a datacenter) and `dc-up` (restart
them).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from tidelog import localcluster
from tidelog.errors import ConfigError
from tidelog.lab import net, rules
from tidelog.lab.plan import LabPlan

log = logging.getLogger(__name__)


def _lab(data_dir: Path) -> tuple[LabPlan, dict[str, Any], Path]:
    state = localcluster.read_state(data_dir.resolve())
    lab = state.get("lab")
    if not lab:
        raise ConfigError(
            f"the cluster in {data_dir} was started without --netns: network faults need the lab",
            hint="start it with `tide cluster up --netns`",
        )
    return LabPlan.from_json(lab["plan"]), lab, data_dir.resolve() / "lab"


def network(data_dir: Path, event: rules.Event) -> list[str]:
    """Apply one network verb; returns the faults now in force."""
    plan, lab, lab_dir = _lab(data_dir)
    state = rules.step(plan, net.read_faults(lab_dir), event)
    net.apply(plan, lab_dir, lab, state)
    return rules.describe(state)


def current(data_dir: Path) -> list[str]:
    return rules.describe(net.read_faults(_lab(data_dir)[2]))


def has_lab(data_dir: Path) -> bool:
    return bool(localcluster.read_state(data_dir.resolve()).get("lab"))


def heal(data_dir: Path) -> list[str]:
    """Remove every network fault (when there is a lab) and resume every paused process."""
    if has_lab(data_dir):
        network(data_dir, rules.Heal())
    for p in localcluster.read_state(data_dir.resolve())["processes"]:
        if localcluster.is_running(p):
            os.kill(p["pid"], signal.SIGCONT)
    return []


def process(data_dir: Path, verb: str, name: str) -> dict[str, Any]:
    data_dir = data_dir.resolve()
    if verb == "kill":
        return localcluster.kill(data_dir, name, signal.SIGKILL)
    if verb == "pause":
        return localcluster.kill(data_dir, name, signal.SIGSTOP)
    if verb == "resume":
        state = localcluster.read_state(data_dir)
        p = next((p for p in state["processes"] if p["name"] == name), None)
        if p is None:
            raise ConfigError(f"no process named {name} in {data_dir}")
        if localcluster.is_running(p):
            os.kill(p["pid"], signal.SIGCONT)
            return p
        return localcluster.restart(data_dir, name)
    raise ConfigError(f"unknown process fault {verb!r}")


def datacenter(data_dir: Path, verb: str, dc: str) -> list[str]:
    """`down`: SIGKILL every process of `dc`; `up`: start again those that are not running."""
    data_dir = data_dir.resolve()
    state = localcluster.read_state(data_dir)
    names = [p["name"] for p in state["processes"] if p.get("datacenter") == dc]
    if not names:
        known = sorted({p.get("datacenter") or "" for p in state["processes"]} - {""})
        raise ConfigError(
            f"no process of {data_dir} runs in datacenter {dc!r}",
            hint=f"datacenters: {', '.join(known) or 'none recorded'}",
        )
    for name in names:
        if verb == "down":
            localcluster.kill(data_dir, name, signal.SIGKILL)
        else:
            localcluster.restart(data_dir, name)
    log.info("datacenter %s %s: %s", dc, verb, ", ".join(names))
    return names
