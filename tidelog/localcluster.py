"""A local cluster from a topology file: generate configs, start processes, stop exactly them.

`up(topology, data_dir)` writes one controller config and one config per broker replica under
`data_dir`, starts each as a background process (its own session, so it outlives the command
that started it), records every pid in `data_dir/cluster.json`, and returns once every broker
set has a master. `down(data_dir)` stops exactly the processes recorded there (checking each
pid still runs a tidelog process before signalling it). Ports are picked free on loopback
(`ports: auto`) or counted up from a fixed first port, which is checked free before anything
starts.

Topology file (see deploy/local.yaml):

    host: 127.0.0.1
    ports: auto                   # or the first port number
    controller: {nodes: 1, heartbeat_interval_ms: 1000, heartbeat_timeout_ms: 3000,
                 datacenters: [dc-a, dc-b, dc-c]}   # with --netns: node i lives in datacenters[i]
    broker_sets:
      - {name: broker-a, replicas: 2, datacenters: [dc-a, dc-b]}
    broker: {flush: async, replication: sync, ...}   # deploy/CONFIG.md keys for every broker
    lab: {wan_delay_ms: 2}        # with --netns: one-way delay between datacenters

With `netns=True` (`tide cluster up --netns`) every process runs in its own network namespace
with its own address (tidelog/lab: plan, rules, relay), ports are fixed per role, and the
cluster state records the lab so that `down` removes every namespace it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidelog.clusterauth import new_secret
from tidelog.errors import ConfigError, UnavailableError
from tidelog.lab import net
from tidelog.lab.plan import (
    BROKER_HA_PORT,
    BROKER_PORT,
    CLIENT_NAME,
    CONTROLLER_GRPC_PORT,
    CONTROLLER_RAFT_PORT,
    LabPlan,
    make_plan,
)

STATE_FILE = "cluster.json"
_TOP = {"host", "ports", "controller", "broker_sets", "broker", "lab"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # also a file name: <name>-<replica>.yaml, .log


@dataclass
class Topology:
    host: str = "127.0.0.1"
    ports: str | int = "auto"
    controller: dict[str, Any] = field(default_factory=dict)
    broker_sets: list[dict[str, Any]] = field(default_factory=list)
    broker: dict[str, Any] = field(default_factory=dict)
    lab: dict[str, Any] = field(default_factory=dict)   # with --netns: {wan_delay_ms: N}


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read topology {p}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    unknown = sorted(set(doc) - _TOP)
    if unknown:
        raise ConfigError(f"{p}: unknown key {unknown[0]!r}", key=unknown[0])
    topo = Topology(**{k: v for k, v in doc.items() if v is not None})
    if not isinstance(topo.host, str) or not topo.host:
        raise ConfigError(f"{p}: host must be an address such as 127.0.0.1", key="host")
    for key in ("controller", "broker", "lab"):
        if not isinstance(getattr(topo, key), dict):
            raise ConfigError(f"{p}: {key} must be a mapping of settings", key=key)
    if not isinstance(topo.broker_sets, list) or not topo.broker_sets:
        raise ConfigError(f"{p}: broker_sets must list at least one broker set", key="broker_sets")
    names = set()
    for i, bs in enumerate(topo.broker_sets):
        replicas = bs.get("replicas", 0) if isinstance(bs, dict) else 0
        if not isinstance(bs, dict) or not isinstance(bs.get("name"), str) \
                or not _NAME.fullmatch(bs["name"]) or type(replicas) is not int or replicas < 1:
            raise ConfigError(f"{p}: broker_sets[{i}] needs a name (letters, digits, '.', '_', '-') "
                              "and replicas >= 1", key=f"broker_sets[{i}]")
        if bs["name"] in names:
            raise ConfigError(f"{p}: broker set {bs['name']!r} is listed twice", key=f"broker_sets[{i}]")
        names.add(bs["name"])
        dcs = bs.get("datacenters")
        if dcs is not None and (not isinstance(dcs, list) or not all(isinstance(d, str) for d in dcs)):
            raise ConfigError(f"{p}: broker_sets[{i}].datacenters must be a list of names",
                              key=f"broker_sets[{i}].datacenters")
    nodes = topo.controller.get("nodes", 1)
    if nodes not in (1, 3, 5):
        raise ConfigError(f"{p}: controller.nodes must be 1, 3 or 5", key="controller.nodes")
    if topo.ports != "auto" and (not isinstance(topo.ports, int) or not 1024 <= topo.ports < 65000):
        raise ConfigError(f"{p}: ports must be 'auto' or a first port number", key="ports")
    return topo


class _Ports:
    def __init__(self, host: str, first: str | int) -> None:
        self.host = host
        self.next = first
        self._held: list[socket.socket] = []

    def take(self) -> str:
        if self.next == "auto":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((self.host, 0))
            self._held.append(s)  # held until all are chosen, so none is handed out twice
            return f"{self.host}:{s.getsockname()[1]}"
        port = int(self.next)
        self.next = port + 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((self.host, port))
            except OSError as exc:
                raise ConfigError(f"port {port} on {self.host} is already in use ({exc.strerror})",
                                  hint="stop what uses it, or set `ports: auto`") from exc
        return f"{self.host}:{port}"

    def release(self) -> None:
        for s in self._held:
            s.close()
        self._held.clear()


def _state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def read_state(data_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(_state_path(data_dir).read_text())
    except FileNotFoundError:
        raise ConfigError(f"no cluster was started in {data_dir} (no {STATE_FILE})",
                          hint="start one with `tide cluster up --data-dir DIR`") from None
    except ValueError as exc:
        raise ConfigError(f"{_state_path(data_dir)} is damaged: {exc}") from exc


def _is_ours(pid: int, args: list[str] | None = None) -> bool:
    """True if `pid` runs `python -m tidelog.cli ARGS` (with `args`: exactly the recorded command,
    whose config path lies in the data directory; a reused pid running anything else is not ours)."""
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    want = [b"tidelog.cli", *(a.encode() for a in args or [])]
    return any(parts[i:i + len(want)] == want for i in range(len(parts)))


_children: dict[int, subprocess.Popen[bytes]] = {}


def _spawn(args: list[str], log_path: Path, netns: str | None = None) -> int:
    # `ip netns exec` execs the program in place, so the pid is the tidelog process's own.
    prefix = net.in_netns(netns) if netns else []
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "tidelog.cli", *args], stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _children[proc.pid] = proc  # this process started it: poll() is exact, /proc is not right after fork
    return proc.pid


def _running(pid: int, args: list[str] | None = None) -> bool:
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    return _is_ours(pid, args)


def is_running(proc: dict[str, Any]) -> bool:
    """Whether a process recorded in cluster.json still runs (a stopped one counts as running)."""
    return _running(proc["pid"], proc.get("args"))


def up(topology: Topology, data_dir: Path, *, wait_s: float = 60.0, netns: bool = False,
       wan_delay_ms: float | None = None) -> dict[str, Any]:
    """Start the topology's processes; return once every broker set has a master.

    With `netns`, every process gets its own network namespace and address, grouped by
    datacenter, behind one router that applies faults and adds the WAN delay (tidelog/lab)."""
    data_dir = data_dir.resolve()
    if netns:
        net.require()  # before anything is created: without root nothing is half made
    data_dir.mkdir(parents=True, exist_ok=True)
    if _state_path(data_dir).exists():
        old = read_state(data_dir)
        if any(_is_ours(p["pid"], p.get("args")) for p in old.get("processes", [])):
            raise ConfigError(f"a cluster is already running in {data_dir}", hint="run `tide cluster down` first")
        if old.get("lab"):
            net.destroy(LabPlan.from_json(old["lab"]["plan"]), old["lab"])
    ctrl = dict(topology.controller)
    n_nodes = ctrl.pop("nodes", 1)
    ctrl_dcs = ctrl.pop("datacenters", None)
    wan_delay = float(wan_delay_ms if wan_delay_ms is not None else topology.lab.get("wan_delay_ms", 0.0))
    names = [f"c{i + 1}" for i in range(n_nodes)]
    brokers = []
    for bs in topology.broker_sets:
        dcs = bs.get("datacenters") or []
        for r in range(bs["replicas"]):
            brokers.append({"broker_set": bs["name"], "replica": r,
                            "datacenter": dcs[r % len(dcs)] if dcs else ""})
    plan: LabPlan | None = None
    lab: dict[str, Any] = {}
    if netns:
        all_dcs = list(dict.fromkeys(b["datacenter"] for b in brokers if b["datacenter"]))
        if ctrl_dcs is None:
            ctrl_dcs = all_dcs or [""]
        if not isinstance(ctrl_dcs, list) or not ctrl_dcs:
            raise ConfigError("controller.datacenters must list datacenters", key="controller.datacenters")
        node_dc = {n: ctrl_dcs[i % len(ctrl_dcs)] for i, n in enumerate(names)}
        plan = make_plan(str(data_dir), [(f"controller-{n}", node_dc[n]) for n in names]
                         + [(f"{b['broker_set']}-{b['replica']}", b["datacenter"]) for b in brokers],
                         wan_delay_ms=wan_delay)
        nodes = []
        for n in names:
            addr = plan.host(f"controller-{n}").address
            nodes.append({"id": n, "raft": f"{addr}:{CONTROLLER_RAFT_PORT}", "grpc": f"{addr}:{CONTROLLER_GRPC_PORT}",
                          "datacenter": node_dc[n]})
        for b in brokers:
            addr = plan.host(f"{b['broker_set']}-{b['replica']}").address
            b.update(listen=f"{addr}:{BROKER_PORT}", ha_listen=f"{addr}:{BROKER_HA_PORT}")
    else:
        ports = _Ports(topology.host, topology.ports)
        nodes = [{"id": n, "raft": ports.take(), "grpc": ports.take()} for n in names]
        for b in brokers:
            b.update(listen=ports.take(), ha_listen=ports.take())
        ports.release()
    controllers = ",".join(n["grpc"] for n in nodes)
    ctrl_doc = {"data_dir": str(data_dir / "controller"),
                "nodes": [{k: n[k] for k in ("id", "raft", "grpc")} for n in nodes], **ctrl}
    # Every cluster has a secret, one node or many: it authenticates the Raft port and every
    # broker's membership (controller calls and the HA handshake).
    # The datacenters a broker set is spread over are the ones its placement requires (RULES.md PL1).
    placement = {bs["name"]: list(dict.fromkeys(bs["datacenters"])) for bs in topology.broker_sets
                 if bs.get("datacenters")}
    if placement and "placement" not in ctrl_doc:
        ctrl_doc["placement"] = placement
    if not ctrl_doc.get("secret"):
        ctrl_doc["secret"] = topology.broker.get("secret") or new_secret()
    ctrl_cfg = data_dir / "controller.yaml"
    ctrl_cfg.write_text(yaml.safe_dump(ctrl_doc))
    ctrl_cfg.chmod(0o600)
    if plan is not None:
        lab = {"plan": plan.to_json(), **net.create(plan, data_dir / "lab")}
    procs: list[dict[str, Any]] = []
    state = {"controllers": controllers, "data_dir": str(data_dir), "processes": procs,
             "broker_sets": [bs["name"] for bs in topology.broker_sets], "started": time.time()}
    if plan is not None:
        state["lab"] = lab
        state["client_netns"] = plan.host(CLIENT_NAME).netns
    try:
        for n in nodes:
            name = f"controller-{n['id']}"
            args = ["controller", "--config", str(ctrl_cfg), "--node-id", n["id"]]
            log_path = data_dir / f"{name}.log"
            ns = plan.host(name).netns if plan else None
            procs.append({"name": name, "kind": "controller", "args": args, "log": str(log_path),
                          "address": n["grpc"], "datacenter": n.get("datacenter", ""), "netns": ns,
                          "pid": _spawn(args, log_path, ns)})
        for b in brokers:
            name = f"{b['broker_set']}-{b['replica']}"
            doc = {"broker_set": b["broker_set"], "data_dir": str(data_dir / name), "controllers": controllers,
                   "listen": b["listen"], "ha_listen": b["ha_listen"], "datacenter": b["datacenter"],
                   **topology.broker, "secret": ctrl_doc["secret"]}
            cfg = data_dir / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump(doc))
            cfg.chmod(0o600)
            args = ["broker", "--config", str(cfg)]
            log_path = data_dir / f"{name}.log"
            ns = plan.host(name).netns if plan else None
            procs.append({"name": name, "kind": "broker", "broker_set": b["broker_set"], "args": args,
                          "log": str(log_path), "address": b["listen"], "datacenter": b["datacenter"],
                          "netns": ns, "pid": _spawn(args, log_path, ns)})
    finally:
        _state_path(data_dir).write_text(json.dumps(state, indent=2))
    try:
        if plan is None:
            asyncio.run(wait_masters(controllers, state["broker_sets"], procs, wait_s))
        else:
            _wait_masters_in(plan.host(CLIENT_NAME).netns, controllers, state["broker_sets"], procs, wait_s)
    except BaseException:
        down(data_dir)
        raise
    return state


def _wait_masters_in(netns: str, controllers: str, names: list[str], procs: list[dict[str, Any]],
                     wait_s: float) -> None:
    """`_wait_masters` from the lab's client namespace (the only side that reaches every process)."""
    cmd = [*net.in_netns(netns), sys.executable, "-m", "tidelog.cli", "cluster", "wait-masters",
           "--controllers", controllers, "--wait", str(wait_s), *names]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    while child.poll() is None:
        dead = [p["name"] for p in procs if not _running(p["pid"])]
        if dead:
            child.kill()
            child.wait()
            tail = _tail(Path(next(p["log"] for p in procs if p["name"] == dead[0])))
            raise UnavailableError(f"{dead[0]} exited during start-up: {tail}")
        time.sleep(0.1)
    if child.returncode != 0:
        out = (child.stdout.read() if child.stdout else b"").decode(errors="replace").strip()
        raise UnavailableError(out.splitlines()[-1] if out else f"not every broker set had a master within {wait_s:.0f}s")


async def wait_masters(controllers: str, names: list[str], procs: list[dict[str, Any]], wait_s: float) -> None:
    from tidelog.controller.client import ControllerClient

    deadline = time.monotonic() + wait_s
    async with ControllerClient(controllers, rpc_timeout=1.0, total_timeout=2.0) as client:
        while True:
            dead = [p["name"] for p in procs if not _running(p["pid"])]
            if dead:
                tail = _tail(Path(next(p["log"] for p in procs if p["name"] == dead[0])))
                raise UnavailableError(f"{dead[0]} exited during start-up: {tail}")
            with contextlib.suppress(Exception):
                reply = await client.describe_broker_sets(names)
                masters = {b.role.broker_set for b in reply.broker_sets if b.role.has_master}
                if set(names) <= masters:
                    return
            if time.monotonic() > deadline:
                raise UnavailableError(f"not every broker set had a master within {wait_s:.0f}s")
            await asyncio.sleep(0.2)


def _tail(path: Path, lines: int = 1) -> str:
    with contextlib.suppress(OSError):
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for line in reversed(text):
            if "error" in line.lower():
                return line.strip()
        return " / ".join(t.strip() for t in text[-lines:])
    return "(no log)"


def stop_process(pid: int, timeout: float = 10.0, args: list[str] | None = None) -> None:
    if not _running(pid, args):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _running(pid, args) and time.monotonic() < deadline:
        if _reap(pid):
            return
        time.sleep(0.05)
    if _running(pid, args):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int) -> bool:
    """Collect a child that exited (a zombie still shows in /proc); True once it is gone."""
    child = _children.get(pid)
    if child is not None:
        return child.poll() is not None
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    return True


def down(data_dir: Path) -> list[str]:
    """Stop every process recorded in `data_dir`; returns their names."""
    data_dir = data_dir.resolve()
    state = read_state(data_dir)
    stopped = []
    # brokers first, so the controller does not fail them over while the cluster goes away
    for p in sorted(state["processes"], key=lambda p: p["kind"] == "controller"):
        if _running(p["pid"], p["args"]):
            stop_process(p["pid"], args=p["args"])
            stopped.append(p["name"])
    if state.get("lab"):
        lab = state["lab"]
        net.destroy(LabPlan.from_json(lab["plan"]), lab)
    _state_path(data_dir).unlink(missing_ok=True)
    return stopped


def kill(data_dir: Path, name: str, sig: int = signal.SIGKILL) -> dict[str, Any]:
    state = read_state(data_dir)
    for p in state["processes"]:
        if p["name"] == name:
            if _running(p["pid"], p["args"]):
                os.kill(p["pid"], sig)
                if sig == signal.SIGKILL:
                    deadline = time.monotonic() + 5
                    while not _reap(p["pid"]) and time.monotonic() < deadline:
                        time.sleep(0.02)
            return p
    raise ConfigError(f"no process named {name} in {data_dir}")


def restart(data_dir: Path, name: str) -> dict[str, Any]:
    state = read_state(data_dir)
    for p in state["processes"]:
        if p["name"] == name:
            if _running(p["pid"], p["args"]):
                return p
            p["pid"] = _spawn(p["args"], Path(p["log"]), p.get("netns"))
            _state_path(data_dir).write_text(json.dumps(state, indent=2))
            return p
    raise ConfigError(f"no process named {name} in {data_dir}")
