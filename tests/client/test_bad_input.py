"""Scenario: an operator makes a mistake. Every one gets one clear line on stderr naming the
problem, a non-zero exit and no traceback; nothing is left running.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.client.conftest import REPO, TIDE, runs_from, tide, tide_env, tidelog_pids
from tidelog.cli.common import CONTROLLER_TIMEOUT_ENV
from tidelog.client.controllers import gave_up
from tidelog.errors import ControllerNotLeaderError, UnavailableError

NOWHERE = "127.0.0.1:1"  # nothing listens on port 1: connections are refused at once


def one_clear_line(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert out.returncode != 0, f"exit 0 on bad input; stdout: {out.stdout!r}"
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{out.stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not named in: {lines[0]}"
    return lines[0]


@pytest.mark.slow
def test_unreachable_controller() -> None:
    """Each command gives up within its bounded retry budget and names the address it could not reach
    (a short budget, $TIDE_CONTROLLER_TIMEOUT: the default 15 s is the same bound, only longer)."""
    commands = {
        "produce": ["produce", "orders", "--count", "1"],
        "consume": ["consume", "orders", "--group", "g", "--max-messages", "1", "--idle-timeout", "1"],
        "status": ["cluster", "status"],
        "topic create": ["topic", "create", "orders"],
        "group describe": ["group", "describe", "g", "--topic", "orders"],
    }
    started = time.monotonic()
    running = {
        name: subprocess.Popen(
            [*TIDE, *args, "--controllers", NOWHERE],
            cwd=REPO,
            env=tide_env({CONTROLLER_TIMEOUT_ENV: "2"}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }  # in parallel: each may take its retry budget
    results = {}
    try:
        for name, proc in running.items():
            # A generous bound: the retry budget is 2 s; over 30 s means it is not bounded.
            stdout, stderr = proc.communicate(timeout=max(1.0, 30 - (time.monotonic() - started)))
            results[name] = (
                subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                time.monotonic() - started,
            )
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    for name, (out, _elapsed) in results.items():
        line = one_clear_line(out, NOWHERE)
        assert "UNAVAILABLE" in line, (name, line)


TOPOLOGIES = {
    "not yaml": ("host: 127.0.0.1\nports: [\n", ["not valid YAML"]),
    "not a mapping": ("- broker-a\n", ["top level must be a mapping"]),
    "unknown key": ("hosts: 127.0.0.1\nbroker_sets: [{name: broker-a, replicas: 2}]\n", ["'hosts'"]),
    "no broker sets": ("host: 127.0.0.1\n", ["broker_sets"]),
    "broker set without replicas": ("broker_sets: [{name: broker-a, replicas: 0}]\n", ["broker_sets[0]"]),
    "controller not a mapping": (
        "broker_sets: [{name: broker-a, replicas: 1}]\ncontroller: 3\n",
        ["controller"],
    ),
    "broker not a mapping": ("broker_sets: [{name: broker-a, replicas: 1}]\nbroker: [flush]\n", ["broker"]),
    "two controllers": (
        "broker_sets: [{name: broker-a, replicas: 1}]\ncontroller: {nodes: 2}\n",
        ["controller.nodes"],
    ),
    "same name twice": ("broker_sets: [{name: a, replicas: 1}, {name: a, replicas: 1}]\n", ["'a'", "twice"]),
    "name with a slash": ("broker_sets: [{name: ../a, replicas: 1}]\n", ["broker_sets[0]"]),
    "bad ports": ("ports: lots\nbroker_sets: [{name: broker-a, replicas: 1}]\n", ["ports"]),
}


@pytest.mark.parametrize("case", sorted(TOPOLOGIES))
def test_malformed_topology(tmp_path: Path, case: str) -> None:
    text, needles = TOPOLOGIES[case]
    topology = tmp_path / "bad.yaml"
    topology.write_text(text)
    data_dir = tmp_path / "data"
    out = tide("cluster", "up", "-c", str(topology), "--data-dir", str(data_dir), timeout=60)
    one_clear_line(out, "bad.yaml", *needles)
    assert not (data_dir / "cluster.json").exists()
    assert [pid for pid in tidelog_pids() if runs_from(pid, data_dir.resolve())] == []


def test_missing_topology_file(tmp_path: Path) -> None:
    out = tide("cluster", "up", "-c", str(tmp_path / "nowhere.yaml"), "--data-dir", str(tmp_path / "d"))
    one_clear_line(out, "nowhere.yaml")


@pytest.mark.slow
def test_fixed_port_already_in_use(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        topology = tmp_path / "fixed.yaml"
        topology.write_text(
            f"host: 127.0.0.1\nports: {port}\nbroker_sets: [{{name: broker-a, replicas: 2}}]\n"
        )
        data_dir = tmp_path / "data"
        out = tide("cluster", "up", "-c", str(topology), "--data-dir", str(data_dir), timeout=60)
        line = one_clear_line(out, str(port), "in use")
        assert "ports: auto" in line  # and says what to do about it
    assert not (data_dir / "cluster.json").exists()
    assert [pid for pid in tidelog_pids() if runs_from(pid, data_dir.resolve())] == []


def test_down_where_no_cluster_runs(tmp_path: Path) -> None:
    one_clear_line(tide("cluster", "down", "--data-dir", str(tmp_path)), "no cluster", str(tmp_path))
    one_clear_line(tide("cluster", "down", "--data-dir", str(tmp_path / "never-made")), "no cluster")
    (tmp_path / "cluster.json").write_text("{not json")
    one_clear_line(tide("cluster", "down", "--data-dir", str(tmp_path)), "cluster.json", "damaged")


def test_drill_without_a_cluster(tmp_path: Path) -> None:
    one_clear_line(tide("drill", "kill-master", "broker-a", "--data-dir", str(tmp_path)), "no cluster")


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["{nonsense_key: 1}", "{flush: sometimes}"])
def test_broker_rejects_its_settings(tmp_path: Path, broker: str) -> None:
    """The topology parses, but a broker refuses its settings: `up` names why and stops what it started."""
    topology = tmp_path / "t.yaml"
    topology.write_text(f"broker_sets: [{{name: broker-a, replicas: 1}}]\nbroker: {broker}\n")
    data_dir = (tmp_path / "data").resolve()
    out = tide("cluster", "up", "-c", str(topology), "--data-dir", str(data_dir), "--wait", "60", timeout=120)
    one_clear_line(out, "broker-a-0", broker.strip("{}").split(":")[0])
    assert [pid for pid in tidelog_pids() if runs_from(pid, data_dir)] == []


@pytest.mark.slow
def test_up_that_times_out_stops_what_it_started(tmp_path: Path) -> None:
    data_dir = (tmp_path / "data").resolve()
    out = tide(
        "cluster", "up", "-c", "deploy/local.yaml", "--data-dir", str(data_dir), "--wait", "0.01", timeout=120
    )
    one_clear_line(out, "master", "within")
    assert (data_dir / "controller-c1.log").exists(), "nothing was started: the test would prove nothing"
    assert [pid for pid in tidelog_pids() if runs_from(pid, data_dir)] == []
    assert not (data_dir / "cluster.json").exists()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["consume", "orders", "--group", "g", "--max-messages", "-1"], "--max-messages"),
        (["consume", "orders", "--group", "g", "--max-messages", "0"], "--max-messages"),
        (["consume", "orders", "--group", "g", "--idle-timeout", "-3"], "--idle-timeout"),
        (["placement", "repair", "--max-ledgers", "0"], "--max-ledgers"),
    ],
)
def test_out_of_range_options_are_refused_before_anything_is_contacted(args: list[str], option: str) -> None:
    out = tide(*args, "--controllers", "127.0.0.1:1", timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and f"Invalid value for '{option}'" in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("last", "named"),
    [
        # a call that timed out before its connection was up: no address in the text
        (
            UnavailableError("DEADLINE_EXCEEDED: Deadline Exceeded"),
            "no controller answered within 2.0s (tried ",
        ),
        (None, "no controller answered within 2.0s (tried "),
        # gRPC's own words name the address: kept as they are
        (UnavailableError("failed to connect; ipv4:127.0.0.1:1: Connection refused"), "failed to connect"),
        (ControllerNotLeaderError("not the leader"), "not the leader"),
    ],
)
def test_a_call_that_gives_up_names_the_controllers_it_tried(last, named) -> None:
    err = gave_up(last, ["127.0.0.1:1", "127.0.0.1:2"], 2.0)
    assert err.message.startswith(named), err.message
    assert "127.0.0.1:1" in err.message or isinstance(last, ControllerNotLeaderError)
    if last is not None and named.startswith("no controller"):
        assert last.message in err.message  # the last error is kept in the text
