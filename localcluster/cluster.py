"""`tide cluster up|down`: a topology's processes in the background, recorded in cluster.json.

`up(topology, data_dir)` writes one controller config and one config per broker replica under
`data_dir`, starts each as a background process (its own session, so it outlives the command
that started it), records every pid in `data_dir/cluster.json`, and returns once every broker
set has a master. `down(data_dir)` stops exactly the processes recorded there (checking each
pid still runs a tidelog process before signalling it). Ports are picked free on loopback
(`ports: auto`) or counted up from a fixed first port, which is checked free before anything
starts.

A topology with a `tls:` section (deploy/secure.yaml) gets a throwaway CA and a certificate per
process under `data_dir/tls/` (localcluster/certs.py); every config carries its `tls:`
section and the state records `ca_file` (and the client's `cert_file`/`key_file`).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidelog import tlsconfig
from tidelog.clusterauth import new_secret
from tidelog.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, new_credentials
from tidelog.errors import ConfigError, TidelogError, UnavailableError, by_code
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
from tidelog.localcluster.configs import broker_doc, controller_doc, write_config
from tidelog.localcluster.procs import Proc, free_address, is_ours, reap, running, stop_process
from tidelog.localcluster.topology import Topology
from tidelog.private import private_dir, require_private, write_private
from tidelog.wire import bind_problem, make_error

if TYPE_CHECKING:
    # cryptography is imported only by an `up` of a topology with `tls:` (_make_certs): every other
    # command that loads this module (`status`, `down`, the tests' fixtures) went without it
    from tidelog.localcluster import certs

STATE_FILE = "cluster.json"
LAB_METRICS_PORT = 7300  # every process's /metrics in the lab, at its own address
# How long `up` waits, after the masters, for each SyncStateSet to be whole: a fresh slave joins
# within a second; one with a long log to copy is left to catch up in the background.
IN_SYNC_WAIT_S = 20.0


class _Ports:
    """Addresses on `host`: free ones (`auto`), or counted up from a first port checked free.

    With `auto`, the addresses an earlier `up` of the same data directory took (`reuse`, in the
    order they were taken) come first, each while it is still free: a cluster brought up again
    after a crash keeps its ports, and the TIDE_CONTROLLERS exported for it stays right."""

    def __init__(self, host: str, first: str | int, reuse: list[str] | None = None) -> None:
        self.host = host
        self.next = first
        self.reuse = list(reuse or [])
        self.taken: list[str] = []

    def take(self) -> str:
        address = self._take()
        self.taken.append(address)
        return address

    def _take(self) -> str:
        if self.next == "auto":
            while self.reuse:
                earlier = self.reuse.pop(0)
                host, _, earlier_port = earlier.rpartition(":")
                if host == self.host and earlier_port.isdigit() and bind_problem(earlier) is None:
                    return earlier
            return free_address(self.host)
        port = int(self.next)
        self.next = port + 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((self.host, port))
            except OSError as exc:
                raise ConfigError(
                    f"port {port} on {self.host} is already in use ({exc.strerror})",
                    hint="stop what uses it, or set `ports: auto`",
                ) from exc
        return f"{self.host}:{port}"


def _state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def _write_state(data_dir: Path, state: dict[str, Any]) -> None:
    # it names the admin's credentials: the data directory's owner alone reads it
    write_private(_state_path(data_dir), json.dumps(state, indent=2))


def read_state(data_dir: Path) -> dict[str, Any]:
    try:
        return json.loads(_state_path(data_dir).read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no cluster was started in {data_dir} (no {STATE_FILE})",
            hint="start one with `tide cluster up --data-dir DIR`",
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{_state_path(data_dir)} is damaged: {exc}") from exc


def _spawn(name: str, args: list[str], log_path: Path, netns: str | None = None) -> int:
    return Proc(name, args, log_path, netns=netns, new_session=True).start().pid


def is_running(proc: dict[str, Any]) -> bool:
    """Whether a process recorded in cluster.json still runs (a stopped one counts as running)."""
    return running(proc["pid"], proc.get("args"))


@dataclass
class _Layout:
    """Where each process of a topology listens: controller nodes and broker replicas."""

    nodes: list[dict[str, str]]  # id, raft, grpc (+ datacenter with a lab)
    brokers: list[dict[str, Any]]  # broker_set, replica, datacenter, listen, ha_listen
    plan: LabPlan | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # the controller keys besides nodes
    tls: certs.ClusterCerts | None = None
    ports: list[str] = field(default_factory=list)  # every address taken, in order (`_Ports.taken`)

    @property
    def controllers(self) -> str:
        return ",".join(n["grpc"] for n in self.nodes)

    def netns(self, name: str) -> str | None:
        return self.plan.host(name).netns if self.plan else None


def up(
    topology: Topology,
    data_dir: Path,
    *,
    wait_s: float = 60.0,
    netns: bool = False,
    wan_delay_ms: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start the topology's processes; return once every broker set has a master.

    With `netns`, every process gets its own network namespace and address, grouped by
    datacenter, behind one router that applies faults and adds the WAN delay (tidelog/lab).
    `on_step(what)` is called as each process starts and before the wait for masters (one
    call per process, then one: `process_count(topology) + 1` in all), for a progress bar."""
    note = on_step or (lambda _what: None)
    if netns and topology.auth_enabled:
        # the admin user is made from this side, which does not reach the lab's namespaces
        raise ConfigError("a topology with auth cannot run with --netns yet", key="auth")
    data_dir = data_dir.resolve()
    reuse = _prepare(data_dir, netns)
    layout = _layout(topology, data_dir, netns, wan_delay_ms, reuse)
    if topology.tls is not None:
        layout.tls = _make_certs(data_dir, layout, bool(topology.tls.get("require_client_cert", False)))
    ctrl_cfg, secret = _write_controller_config(topology, data_dir, layout)
    state: dict[str, Any] = {
        "controllers": layout.controllers,
        "data_dir": str(data_dir),
        "processes": [],
        "broker_sets": [bs["name"] for bs in topology.broker_sets],
        "started": time.time(),
        "ports": layout.ports,  # in the order taken: the next `up` of this directory takes them again
        **_tls_state(layout.tls),
    }
    if layout.plan is not None:
        state["lab"] = {"plan": layout.plan.to_json(), **net.create(layout.plan, data_dir / "lab")}
        state["client_netns"] = layout.plan.host(CLIENT_NAME).netns
    try:
        _start_controllers(data_dir, layout, ctrl_cfg, state["processes"], note)
        _start_brokers(topology, data_dir, layout, secret, state["processes"], note)
    finally:
        _write_state(data_dir, state)  # whatever started is recorded, so `down` finds it
    names, procs = state["broker_sets"], state["processes"]
    note(f"waiting for a master in {', '.join(names)}")
    try:
        if layout.plan is None:
            asyncio.run(wait_masters(layout.controllers, names, procs, wait_s, client_tls(state), secret))
            replicas = {bs["name"]: int(bs["replicas"]) for bs in topology.broker_sets}
            note("waiting for every replica to join its SyncStateSet")
            short = asyncio.run(
                wait_in_sync(layout.controllers, replicas, IN_SYNC_WAIT_S, client_tls(state), secret)
            )
            for name, members in short.items():
                note(
                    f"{name}: {members} of {replicas[name]} replicas in sync after {IN_SYNC_WAIT_S:.0f}s; the rest catch up"
                )
        else:
            _wait_masters_in(state, layout.controllers, names, procs, wait_s)
        if topology.auth_enabled:
            note("creating the admin user")
            state["credentials"] = asyncio.run(create_admin(layout.controllers, client_tls(state), secret))
            _write_state(data_dir, state)
    except BaseException:
        down(data_dir)
        raise
    return state


ADMIN_USER = "admin"


async def create_admin(controllers: str, tls: tlsconfig.ClientTls | None, secret: str) -> dict[str, str]:
    """A user with every permission (cluster admin), made with the cluster secret, which is the
    cluster itself: its credentials, for the state file and `up`'s output."""
    from tidelog.client.controllers import ControllerClient

    creds = new_credentials()
    async with ControllerClient(controllers, tls=tls, secret=secret, credentials=None) as client:
        await client.create_user(ADMIN_USER, creds.access_key, creds.signing_key)
        await client.grant_acl(ADMIN_USER, "cluster", "*", "admin")
    return {"access_key": creds.access_key, "secret_key": creds.secret_key}


def _make_certs(data_dir: Path, layout: _Layout, require_client_cert: bool) -> certs.ClusterCerts:
    """A fresh CA and a certificate per process, for the host each one listens on; the
    controller nodes share one config file, hence one certificate."""
    from tidelog.localcluster import certs

    hosts = {"controller": [n["grpc"].rpartition(":")[0] for n in layout.nodes]}
    for b in layout.brokers:
        hosts[f"{b['broker_set']}-{b['replica']}"] = [b["listen"].rpartition(":")[0]]
    return certs.for_cluster(data_dir / "tls", hosts, require_client_cert)


def _tls_state(tls: certs.ClusterCerts | None) -> dict[str, Any]:
    if tls is None:
        return {}
    return {"ca_file": str(tls.ca.cert), "cert_file": str(tls.client.cert), "key_file": str(tls.client.key)}


def client_tls(state: dict[str, Any]) -> tlsconfig.ClientTls | None:
    """How a client of the cluster recorded in `state` connects: TLS with its CA and client pair."""
    if not state.get("ca_file"):
        return None
    return tlsconfig.ClientTls(Path(state["ca_file"]), Path(state["cert_file"]), Path(state["key_file"]))


def client_options(state: dict[str, Any]) -> dict[str, Any]:
    """The Client/AsyncClient keyword arguments that connect to the cluster recorded in `state`:
    its CA, and with auth its admin's credentials."""
    options: dict[str, Any] = {"ca_file": state.get("ca_file")}
    if state.get("credentials"):
        options["access_key"] = state["credentials"]["access_key"]
        options["secret_key"] = state["credentials"]["secret_key"]
    return options


def bootstrap(state: dict[str, Any]) -> list[str]:
    """Every controller's and broker's gRPC address: a client given these finds the cluster while
    no controller answers too (a broker answers route lookups, broker/lookups.py)."""
    controllers = [a for a in state["controllers"].split(",") if a]
    brokers = [p["address"] for p in state["processes"] if p["kind"] == "broker"]
    return controllers + [a for a in brokers if a not in controllers]


def client_env(state: dict[str, Any]) -> dict[str, str]:
    """The environment variables that make `tide` commands connect to this cluster."""
    env = {"TIDE_CONTROLLERS": state["controllers"]}
    if state.get("credentials"):
        env[ACCESS_KEY_ENV] = state["credentials"]["access_key"]
        env[SECRET_KEY_ENV] = state["credentials"]["secret_key"]
    if state.get("ca_file"):
        env.update(
            {
                tlsconfig.CA_FILE_ENV: state["ca_file"],
                tlsconfig.CERT_FILE_ENV: state["cert_file"],
                tlsconfig.KEY_FILE_ENV: state["key_file"],
            }
        )
    return env


def _prepare(data_dir: Path, netns: bool) -> list[str]:
    """Refuse a data directory whose cluster still runs; clear the lab of one that does not.
    Returns the addresses the earlier cluster of this directory took (to take again)."""
    if netns:
        net.check_available()  # before anything is created: without root nothing is half made
    private_dir(data_dir)
    require_private(data_dir, "data directory")
    if not _state_path(data_dir).exists():
        return []
    old = read_state(data_dir)
    if any(is_ours(p["pid"], p.get("args")) for p in old.get("processes", [])):
        raise ConfigError(f"a cluster is already running in {data_dir}", hint="run `tide cluster down` first")
    if old.get("lab"):
        net.destroy(LabPlan.from_json(old["lab"]["plan"]), old["lab"])
    return [str(a) for a in old.get("ports", [])]


def _layout(
    topology: Topology, data_dir: Path, netns: bool, wan_delay_ms: float | None, reuse: list[str]
) -> _Layout:
    settings = dict(topology.controller)
    names = [f"c{i + 1}" for i in range(settings.pop("nodes", 1))]
    ctrl_dcs = settings.pop("datacenters", None)
    brokers = []
    for bs in topology.broker_sets:
        dcs = bs.get("datacenters") or []
        for r in range(bs["replicas"]):
            brokers.append(
                {"broker_set": bs["name"], "replica": r, "datacenter": dcs[r % len(dcs)] if dcs else ""}
            )
    if not netns:
        ports = _Ports(topology.host, topology.ports, reuse)
        nodes = [{"id": n, "raft": ports.take(), "grpc": ports.take()} for n in names]
        for b in brokers:
            b.update(listen=ports.take(), ha_listen=ports.take())
        # taken last, so that the other ports of a fixed-port topology keep their numbers
        for proc in [*nodes, *brokers]:
            proc["metrics_address"] = ports.take()
        return _Layout(nodes, brokers, None, settings, ports=ports.taken)
    wan_delay = float(wan_delay_ms if wan_delay_ms is not None else topology.lab.get("wan_delay_ms", 0.0))
    return _lab_layout(data_dir, names, ctrl_dcs, brokers, wan_delay, settings)


def _lab_layout(
    data_dir: Path,
    names: list[str],
    ctrl_dcs: Any,
    brokers: list[dict[str, Any]],
    wan_delay: float,
    settings: dict[str, Any],
) -> _Layout:
    """Every process at its own address in the lab, controller node i in datacenter i (round robin)."""
    if ctrl_dcs is None:
        ctrl_dcs = list(dict.fromkeys(b["datacenter"] for b in brokers if b["datacenter"])) or [""]
    if not isinstance(ctrl_dcs, list) or not ctrl_dcs:
        raise ConfigError("controller.datacenters must list datacenters", key="controller.datacenters")
    node_dc = {n: ctrl_dcs[i % len(ctrl_dcs)] for i, n in enumerate(names)}
    plan = make_plan(
        str(data_dir),
        [(f"controller-{n}", node_dc[n]) for n in names]
        + [(f"{b['broker_set']}-{b['replica']}", b["datacenter"]) for b in brokers],
        wan_delay_ms=wan_delay,
    )
    nodes = []
    for n in names:
        addr = plan.host(f"controller-{n}").address
        nodes.append(
            {
                "id": n,
                "raft": f"{addr}:{CONTROLLER_RAFT_PORT}",
                "grpc": f"{addr}:{CONTROLLER_GRPC_PORT}",
                "metrics_address": f"{addr}:{LAB_METRICS_PORT}",
                "datacenter": node_dc[n],
            }
        )
    for b in brokers:
        addr = plan.host(f"{b['broker_set']}-{b['replica']}").address
        b.update(
            listen=f"{addr}:{BROKER_PORT}",
            ha_listen=f"{addr}:{BROKER_HA_PORT}",
            metrics_address=f"{addr}:{LAB_METRICS_PORT}",
        )
    return _Layout(nodes, brokers, plan, settings)


def _write_controller_config(topology: Topology, data_dir: Path, layout: _Layout) -> tuple[Path, str]:
    """The controller config of every node; returns its path and the cluster secret.

    Every cluster has a secret, one node or many: it authenticates the Raft port and every
    broker's membership (controller calls and the HA handshake)."""
    settings = dict(layout.settings)
    # The datacenters a broker set is spread over are the ones its placement requires (RULES.md PL1).
    placement = {
        bs["name"]: list(dict.fromkeys(bs["datacenters"]))
        for bs in topology.broker_sets
        if bs.get("datacenters")
    }
    if placement and "placement" not in settings:
        settings["placement"] = placement
    secret = settings.pop("secret", None) or topology.broker.get("secret") or new_secret()
    nodes = [{k: n[k] for k in ("id", "raft", "grpc", "metrics_address")} for n in layout.nodes]
    if layout.tls is not None:
        settings["tls"] = layout.tls.section("controller")
    if topology.auth_enabled:
        settings["auth"] = {"enabled": True}
    # each node logs into the file its output goes to, rotated (deploy/CONFIG.md log_file)
    settings.setdefault("log_file", str(data_dir / "controller-{node_id}.log"))
    doc = controller_doc(data_dir / "controller", nodes, secret=secret, **settings)
    return write_config(data_dir / "controller.yaml", doc), secret


def process_count(topology: Topology) -> int:
    """How many processes `up` starts for `topology`."""
    return int(topology.controller.get("nodes", 1)) + sum(int(bs["replicas"]) for bs in topology.broker_sets)


def _start_controllers(
    data_dir: Path, layout: _Layout, ctrl_cfg: Path, procs: list[dict[str, Any]], note: Callable[[str], None]
) -> None:
    for n in layout.nodes:
        name = f"controller-{n['id']}"
        note(f"starting {name}")
        args = ["controller", "--config", str(ctrl_cfg), "--node-id", n["id"]]
        log_path = data_dir / f"{name}.log"
        ns = layout.netns(name)
        procs.append(
            {
                "name": name,
                "kind": "controller",
                "args": args,
                "log": str(log_path),
                "address": n["grpc"],
                "metrics": n["metrics_address"],
                "datacenter": n.get("datacenter", ""),
                "netns": ns,
                "pid": _spawn(name, args, log_path, ns),
            }
        )


def _start_brokers(
    topology: Topology,
    data_dir: Path,
    layout: _Layout,
    secret: str,
    procs: list[dict[str, Any]],
    note: Callable[[str], None],
) -> None:
    # The topology's broker keys may set anything but the secret, which is the cluster's.
    settings = {k: v for k, v in topology.broker.items() if k != "secret"}
    for b in layout.brokers:
        name = f"{b['broker_set']}-{b['replica']}"
        # each broker its own metrics port; `metrics_address: ""` in the topology turns them off
        metrics = "" if settings.get("metrics_address") == "" else b["metrics_address"]
        note(f"starting {name}")
        doc = broker_doc(
            b["broker_set"],
            data_dir / name,
            layout.controllers,
            b["listen"],
            b["ha_listen"],
            secret=None,
            **{"datacenter": b["datacenter"], **settings, "metrics_address": metrics},
        )
        doc["secret"] = secret
        doc.setdefault("log_file", str(data_dir / f"{name}.log"))  # rotated (deploy/CONFIG.md)
        if layout.tls is not None:
            doc["tls"] = layout.tls.section(name)
        if topology.auth_enabled:
            doc["auth"] = {"enabled": True}
        cfg = write_config(data_dir / f"{name}.yaml", doc)
        args = ["broker", "--config", str(cfg)]
        log_path = data_dir / f"{name}.log"
        ns = layout.netns(name)
        procs.append(
            {
                "name": name,
                "kind": "broker",
                "broker_set": b["broker_set"],
                "args": args,
                "log": str(log_path),
                "address": b["listen"],
                "metrics": metrics,
                "datacenter": b["datacenter"],
                "netns": ns,
                "pid": _spawn(name, args, log_path, ns),
            }
        )


def _dead_on_start(procs: list[dict[str, Any]]) -> TidelogError | None:
    """The error to raise if a process of `procs` has exited during start-up (with its log's last word)."""
    dead = [p for p in procs if not running(p["pid"])]
    if not dead:
        return None
    return start_failure(dead[0]["name"], _tail(Path(dead[0]["log"])), dead[0]["log"])


_ERROR_LINE = re.compile(r"error: ([A-Z][A-Z_]+): (.*)$")


def start_failure(name: str, last_word: str, log: str) -> TidelogError:
    """The error of a process that exited during start-up, as the typed error it printed last:
    a configuration error stays one (its hint is to fix the configuration, not to retry later),
    and its hint is said once."""
    found = _ERROR_LINE.search(last_word)
    if found is None:
        return UnavailableError(f"{name} exited during start-up: {last_word}", hint=f"see {log}")
    cls = by_code(found.group(1))
    message = found.group(2).removesuffix(f" ({cls.hint})") if cls.hint else found.group(2)
    return make_error(found.group(1), f"{name} exited during start-up: {message}")


def _wait_masters_in(
    state: dict[str, Any], controllers: str, names: list[str], procs: list[dict[str, Any]], wait_s: float
) -> None:
    """`wait_masters` from the lab's client namespace (the only side that reaches every process)."""
    cmd = [
        *net.in_netns(state["client_netns"]),
        sys.executable,
        "-m",
        "tidelog.cli",
        "cluster",
        "wait-masters",
        "--controllers",
        controllers,
        "--wait",
        str(wait_s),
        *names,
    ]
    child = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **client_env(state)},
    )
    while child.poll() is None:
        dead = _dead_on_start(procs)
        if dead is not None:
            child.kill()
            child.wait()
            raise dead
        time.sleep(0.1)
    if child.returncode != 0:
        out = (child.stdout.read() if child.stdout else b"").decode(errors="replace").strip()
        raise UnavailableError(
            out.splitlines()[-1] if out else f"not every broker set had a master within {wait_s:.0f}s"
        )


async def wait_masters(
    controllers: str,
    names: list[str],
    procs: list[dict[str, Any]],
    wait_s: float,
    tls: tlsconfig.ClientTls | None | tlsconfig.FromEnv = tlsconfig.FROM_ENV,
    secret: str | None = None,
) -> None:
    from tidelog.client.controllers import ControllerClient

    deadline = time.monotonic() + wait_s
    # with the cluster secret the wait is the cluster's own, whether users' auth is on or not
    async with ControllerClient(
        controllers, rpc_timeout=1.0, total_timeout=2.0, tls=tls, secret=secret, member=secret is not None
    ) as client:
        while True:
            dead = _dead_on_start(procs)
            if dead is not None:
                raise dead
            with contextlib.suppress(Exception):
                reply = await client.describe_broker_sets(names)
                masters = {b.role.broker_set for b in reply.broker_sets if b.role.has_master}
                if set(names) <= masters:
                    return
            if time.monotonic() > deadline:
                raise UnavailableError(f"not every broker set had a master within {wait_s:.0f}s")
            await asyncio.sleep(0.2)


async def wait_in_sync(
    controllers: str,
    replicas: dict[str, int],
    wait_s: float,
    tls: tlsconfig.ClientTls | None | tlsconfig.FromEnv = tlsconfig.FROM_ENV,
    secret: str | None = None,
) -> dict[str, int]:
    """Wait until every broker set's SyncStateSet holds each of its replicas (`replicas`: set name
    -> count), so that what `up` hands over takes writes needing every replica's ack (a ledger of
    ensemble 2, `in_sync_replicas: 2`) at once. Returns the sets still short when `wait_s` runs
    out (name -> members in sync): a slave catching up on a long log is not an error."""
    from tidelog.client.controllers import ControllerClient

    deadline = time.monotonic() + wait_s
    short = dict.fromkeys(replicas, 0)
    async with ControllerClient(
        controllers, rpc_timeout=1.0, total_timeout=2.0, tls=tls, secret=secret, member=secret is not None
    ) as client:
        while short and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                reply = await client.describe_broker_sets(list(short))
                for b in reply.broker_sets:
                    name = b.role.broker_set
                    if name in short:
                        short[name] = len(b.role.sync_state_set)
                        if short[name] >= replicas[name]:
                            del short[name]
            if short:
                await asyncio.sleep(0.1)
    return short


def _tail(path: Path, lines: int = 1) -> str:
    with contextlib.suppress(OSError):
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        for line in reversed(text):
            if "error" in line.lower():
                return line.strip()
        return " / ".join(t.strip() for t in text[-lines:])
    return "(no log)"


def down(data_dir: Path) -> list[str]:
    """Stop every process recorded in `data_dir`; returns their names."""
    data_dir = data_dir.resolve()
    state = read_state(data_dir)
    stopped = []
    # brokers first, so the controller does not fail them over while the cluster goes away
    for p in sorted(state["processes"], key=lambda p: p["kind"] == "controller"):
        if running(p["pid"], p["args"]):
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
            if running(p["pid"], p["args"]):
                os.kill(p["pid"], sig)
                if sig == signal.SIGKILL:
                    deadline = time.monotonic() + 5
                    while not reap(p["pid"]) and time.monotonic() < deadline:
                        time.sleep(0.02)
            return p
    raise ConfigError(f"no process named {name} in {data_dir}")


def restart(data_dir: Path, name: str) -> dict[str, Any]:
    state = read_state(data_dir)
    for p in state["processes"]:
        if p["name"] == name:
            if running(p["pid"], p["args"]):
                return p
            p["pid"] = _spawn(name, p["args"], Path(p["log"]), p.get("netns"))
            _write_state(data_dir, state)
            return p
    raise ConfigError(f"no process named {name} in {data_dir}")
