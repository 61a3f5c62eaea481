"""A local cluster started the way an operator starts one: `tide cluster up` as a subprocess.

`cluster` (module scope) runs `tide cluster up -c deploy/local.yaml --data-dir <tmp> --json` once
per test module, for tests that kill nothing. `cluster_factory` (function scope) starts a fresh one
per call, for drills and for the tests of `tide cluster down`. Every cluster is stopped at
teardown with `tide cluster down`; if that leaves any of its processes running (found by pid,
and only if the process still runs from that cluster's data directory) they are killed by pid and
the teardown fails. When a test fails, the tail of every running cluster's process logs is added
to its report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import procs
from tidelog.localcluster import proc_args
from tidelog.localcluster.procs import PORT_SLICE_ENV

REPO = Path(__file__).resolve().parents[2]
LOCAL_TOPOLOGY = REPO / "deploy" / "local.yaml"
_TIDE_SCRIPT = Path(sys.executable).with_name("tide")
# The console script is what operators run; fall back to the module when it is not installed.
TIDE = [str(_TIDE_SCRIPT)] if _TIDE_SCRIPT.exists() else [sys.executable, "-m", "tidelog.cli"]


def tide_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a `tide` subprocess: no cluster settings leak in from the caller's shell.

    The worker's port slice stays: a `tide cluster up` without it draws its ports from the whole
    range, where another worker's clusters live (a broker of one then found its port taken)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_") or k == PORT_SLICE_ENV}
    env["COLUMNS"] = "200"  # tables wide enough that names are not folded
    env.update(extra or {})
    return env


def tide(
    *args: str, timeout: float = 120.0, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `tide ARGS` to completion from the repository root (bounded by `timeout`)."""
    return procs.tide(*args, timeout=timeout, input=input, env=tide_env(env), cwd=REPO, program=TIDE)


def cmdline(pid: int) -> str:
    """The command line of a running (not zombie) process, or "" if there is none."""
    return " ".join(proc_args(pid))


def tidelog_pids() -> dict[int, str]:
    """Every running `tidelog.cli` process on the machine: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            line = cmdline(int(entry.name))
            if "tidelog.cli" in line:
                out[int(entry.name)] = line
    return out


def runs_from(pid: int, data_dir: Path) -> bool:
    """True if `pid` is a running tidelog process whose configuration lives in `data_dir`."""
    line = cmdline(pid)
    return "tidelog.cli" in line and str(data_dir) in line


@dataclass
class LocalCluster:
    data_dir: Path
    up_stdout: str
    up_doc: dict[str, Any]
    seen_pids: set[int] = field(default_factory=set)
    is_down: bool = False

    @property
    def controllers(self) -> str:
        return str(self.up_doc["controllers"])

    def state(self) -> dict[str, Any]:
        """cluster.json as it is now (a drill's restart changes a pid)."""
        doc: dict[str, Any] = json.loads((self.data_dir / "cluster.json").read_text())
        self.seen_pids.update(p["pid"] for p in doc["processes"])
        return doc

    def pids(self) -> dict[str, int]:
        return {p["name"]: p["pid"] for p in self.state()["processes"]}

    def running(self) -> list[int]:
        """Pids of this cluster (as ever recorded) that still run from its data directory."""
        with contextlib.suppress(OSError, ValueError):
            self.state()
        return sorted(pid for pid in self.seen_pids if runs_from(pid, self.data_dir))

    def down(self) -> subprocess.CompletedProcess[str]:
        with contextlib.suppress(OSError, ValueError):
            self.state()
        out = tide("cluster", "down", "--data-dir", str(self.data_dir), "--json", timeout=120)
        self.is_down = True
        return out

    def logs(self, lines: int = 60) -> str:
        parts = []
        for log in sorted(self.data_dir.glob("*.log")):
            text = log.read_text(errors="replace").splitlines()
            parts.append(f"===== {log.name} (last {lines} lines) =====\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)


_ACTIVE: list[LocalCluster] = []


def start_cluster(data_dir: Path, topology: Path = LOCAL_TOPOLOGY, wait: float = 90.0) -> LocalCluster:
    data_dir = data_dir.resolve()
    try:
        out = tide(
            "cluster",
            "up",
            "-c",
            str(topology),
            "--data-dir",
            str(data_dir),
            "--wait",
            str(wait),
            "--json",
            timeout=wait + 60,
        )
        failure = None if out.returncode == 0 else f"exited {out.returncode}: {out.stderr}"
    except subprocess.TimeoutExpired:
        failure = f"did not return within {wait + 60:.0f}s"
    if failure is not None:
        leftovers = [pid for pid in tidelog_pids() if runs_from(pid, data_dir)]
        for pid in leftovers:  # only processes that run from this cluster's own directory
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in data_dir.glob("*.log")
        )
        pytest.fail(
            f"tide cluster up {failure}\n{logs}"
            + (f"\nkilled leftover pids {leftovers}" if leftovers else "")
        )
    cluster = LocalCluster(data_dir, out.stdout, json.loads(out.stdout))
    cluster.state()
    _ACTIVE.append(cluster)
    return cluster


@contextlib.contextmanager
def local_cluster_with(
    where: Path, *, broker_sets: tuple[str, ...] = (), tls: bool = False, **broker: Any
) -> Iterator[LocalCluster]:
    """deploy/local.yaml with `broker`'s keys set for every broker (and, given `broker_sets`, those
    sets of two replicas instead of its one; given `tls`, TLS on every port as deploy/secure.yaml
    has it, without mutual TLS or users' auth), started under `where` and stopped (every process)
    on leaving."""
    topology = yaml.safe_load(LOCAL_TOPOLOGY.read_text())
    if tls:
        topology["tls"] = {"require_client_cert": False}
    if broker_sets:
        topology["broker_sets"] = [{"name": name, "replicas": 2} for name in broker_sets]
    topology["broker"].update(broker)
    path = where / "topology.yaml"
    path.write_text(yaml.safe_dump(topology))
    c = start_cluster(where / "cluster", path)
    try:
        yield c
    finally:
        stop_cluster(c)


def stop_cluster(cluster: LocalCluster) -> None:
    """`tide cluster down` (unless a test already ran it); fail loudly if any of its processes survive."""
    problems = []
    try:
        if not cluster.is_down:
            out = cluster.down()
            if out.returncode != 0:
                problems.append(f"tide cluster down exited {out.returncode}: {out.stderr.strip()}")
        deadline = time.monotonic() + 15
        while cluster.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = cluster.running()
        if survivors:
            problems.append(f"still running after tide cluster down: {survivors}")
            for pid in survivors:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ValueError):
            _ACTIVE.remove(cluster)
    if problems:
        raise AssertionError("; ".join(problems) + "\n" + cluster.logs())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One cluster of deploy/local.yaml for a whole module (tests that kill nothing)."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: `cluster_factory(topology=..., name=...)` starts a fresh cluster; all stopped at teardown."""
    started: list[LocalCluster] = []

    def start(topology: Path = LOCAL_TOPOLOGY, name: str = "cluster") -> LocalCluster:
        c = start_cluster(tmp_path / f"{name}{len(started)}", topology)
        started.append(c)
        return c

    yield start
    errors = []
    for c in reversed(started):
        try:
            stop_cluster(c)
        except AssertionError as exc:
            errors.append(str(exc))
    if errors:
        raise AssertionError("\n".join(errors))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    # A failed test's report carries the process logs of every cluster that is up at that moment.
    rep = yield
    if rep.when == "call" and rep.failed:
        for c in list(_ACTIVE):
            with contextlib.suppress(OSError):
                rep.sections.append((f"cluster logs: {c.data_dir.name}", c.logs()))
    return rep
