"""The network lab's shell: create and remove namespaces, links and rules; apply faults.

Everything here runs `ip` and `nft` as root; the decisions are in lab/plan.py and lab/rules.py.
`create` builds the whole lab or nothing: on any failure it removes what it made, by name.
`destroy` removes every namespace (their links go with them) and stops the relay.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tidelog.errors import ConfigError
from tidelog.lab import rules
from tidelog.lab.plan import RELAY_PORT, LabPlan

log = logging.getLogger(__name__)

FAULTS_FILE = "faults.json"
RELAY_FILE = "relay.json"


def unavailable_reason() -> str | None:
    """Why this machine cannot run a lab, or None."""
    if os.geteuid() != 0:
        return "--netns needs root (network namespaces, veth links and nftables)"
    for tool, pkg in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"--netns needs `{tool}` (Debian: apt-get install {pkg}; `make test` installs it)"
    if not Path("/proc/sys/net/ipv4").exists():
        return "--netns needs /proc/sys/net"
    return None


def check_available() -> None:
    """Refuse the lab where it cannot run (no root, no `ip` or `nft`) with a ConfigError saying why."""
    reason = unavailable_reason()
    if reason:
        raise ConfigError(reason)


def _run(*args: str, stdin: str | None = None) -> None:
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"`{' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")


CLIENT_SIDE_ENV = "TIDE_LAB_NETNS"  # set in a program started on a lab's client side


def in_netns(netns: str) -> list[str]:
    """The command prefix that runs a program inside `netns`."""
    return ["ip", "netns", "exec", netns]


def on_client_side(netns: str) -> list[str]:
    """The command prefix that runs a program on a lab's client side, marked so that it knows
    it is there (and does not try to get there again)."""
    return [*in_netns(netns), "env", f"{CLIENT_SIDE_ENV}={netns}"]


def existing_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def create(plan: LabPlan, lab_dir: Path) -> dict[str, Any]:
    """Build the lab; returns what `destroy` needs (the relay's pid)."""
    check_available()
    clash = {h.netns for h in plan.hosts} | {plan.wan_netns}
    taken = clash & existing_namespaces()
    if taken:
        raise ConfigError(
            f"network namespace {sorted(taken)[0]} already exists",
            hint="an earlier lab of this data dir is still there: run `tide cluster down`",
        )
    lab_dir.mkdir(parents=True, exist_ok=True)
    try:
        _run("ip", "netns", "add", plan.wan_netns)
        _run("ip", "-n", plan.wan_netns, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", plan.wan_netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for h in plan.hosts:
            _run("ip", "netns", "add", h.netns)
            _run("ip", "-n", h.netns, "link", "set", "lo", "up")
            _run("ip", "link", "add", h.veth_host, "type", "veth", "peer", "name", h.veth_router)
            _run("ip", "link", "set", h.veth_host, "netns", h.netns, "name", "eth0")
            _run("ip", "link", "set", h.veth_router, "netns", plan.wan_netns)
            _run("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _run("ip", "-n", h.netns, "link", "set", "eth0", "up")
            _run("ip", "-n", h.netns, "route", "add", "default", "via", h.router)
            _run("ip", "-n", plan.wan_netns, "addr", "add", f"{h.router}/24", "dev", h.veth_router)
            _run("ip", "-n", plan.wan_netns, "link", "set", h.veth_router, "up")
        _run(
            "ip", "netns", "exec", plan.wan_netns, "nft", "-f", "-", stdin=rules.render_nat(plan, RELAY_PORT)
        )
        apply(plan, lab_dir, {}, rules.empty())  # no faults yet; the relay reads its delays from it
        relay_pid = _start_relay(plan, lab_dir)
    except BaseException:
        destroy(plan, {})
        raise
    log.info("lab %s up: %d namespaces", plan.prefix, len(plan.hosts) + 1)
    return {"relay_pid": relay_pid}


def _start_relay(plan: LabPlan, lab_dir: Path) -> int:
    with open(lab_dir / "relay.log", "ab") as out:
        proc = subprocess.Popen(
            [
                *in_netns(plan.wan_netns),
                sys.executable,
                "-m",
                "tidelog.lab.relay",
                "--config",
                str(lab_dir / RELAY_FILE),
                "--port",
                str(RELAY_PORT),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"the lab's relay exited at start: see {lab_dir / 'relay.log'}")
        if "relay listening" in (lab_dir / "relay.log").read_text(errors="replace"):
            return proc.pid
        time.sleep(0.05)
    raise ConfigError("the lab's relay did not start within 10 s")


def destroy(plan: LabPlan, info: dict[str, Any]) -> list[str]:
    """Stop the relay and remove every namespace and host-side link of the lab; returns the
    namespaces removed."""
    pid = info.get("relay_pid")
    if pid and _is_relay(int(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    present = existing_namespaces()
    removed = []
    for ns in [h.netns for h in plan.hosts] + [plan.wan_netns]:
        if ns in present:
            # A process still inside would keep the namespace's links alive: stop it first.
            pids = subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True, check=False
            ).stdout.split()
            for p in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(p), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            removed.append(ns)
    for h in plan.hosts:  # a link made just before a failure, not yet moved
        if Path(f"/sys/class/net/{h.veth_host}").exists():
            subprocess.run(["ip", "link", "del", h.veth_host], capture_output=True, check=False)
    return removed


def _is_relay(pid: int) -> bool:
    try:
        return b"tidelog.lab.relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def read_faults(lab_dir: Path) -> rules.Faults:
    try:
        return json.loads((lab_dir / FAULTS_FILE).read_text())
    except FileNotFoundError:
        return rules.empty()


def _write_faults(lab_dir: Path, state: rules.Faults) -> None:
    tmp = lab_dir / (FAULTS_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(lab_dir / FAULTS_FILE)


def _write_relay_config(plan: LabPlan, lab_dir: Path, state: rules.Faults) -> None:
    doc = {
        "sites": {str(v): k for k, v in plan.site_octets.items()},
        "delays": rules.relay_delays(plan, state),
    }
    tmp = lab_dir / (RELAY_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(lab_dir / RELAY_FILE)


def apply(plan: LabPlan, lab_dir: Path, info: dict[str, Any], state: rules.Faults) -> None:
    """Make the network match `state`: one nft transaction, then the relay's delays."""
    check_available()
    _run("ip", "netns", "exec", plan.wan_netns, "nft", "-f", "-", stdin=rules.render(state))
    _write_faults(lab_dir, state)
    _write_relay_config(plan, lab_dir, state)
    pid = info.get("relay_pid")
    if pid and _is_relay(int(pid)):
        os.kill(int(pid), signal.SIGHUP)
    log.info("lab %s faults now: %s", plan.prefix, "; ".join(rules.describe(state)) or "none")
