"""Scenario: an operator drives a local cluster with `tide` (real processes): start it, look at it,
produce and consume, describe a group, run the kill-master drill, stop it again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, cmdline, runs_from, tide
from tests.procs import ControllerCluster

pytestmark = pytest.mark.slow


def ok(*args: str, input: str | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    out = tide(*args, input=input, timeout=timeout)
    assert out.returncode == 0, f"tide {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
    assert "Traceback" not in out.stderr
    return out


def ok_json(*args: str, input: str | None = None, timeout: float = 120.0) -> Any:
    """Run a `--json` command; its whole standard output must be one JSON document."""
    return json.loads(ok(*args, "--json", input=input, timeout=timeout).stdout)


def consume_json(cluster: LocalCluster, topic: str, group: str, *extra: str) -> list[dict[str, Any]]:
    out = ok(
        "consume",
        topic,
        "--group",
        group,
        "--controllers",
        cluster.controllers,
        "--json",
        "--idle-timeout",
        "3",
        *extra,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_up_prints_one_json_object_naming_the_controllers(cluster: LocalCluster) -> None:
    doc = json.loads(cluster.up_stdout)  # the whole output parses: exactly one JSON document
    assert isinstance(doc, dict)
    host, port = doc["controllers"].split(":")
    assert host == "127.0.0.1" and int(port) > 0
    kinds = sorted(p["kind"] for p in doc["processes"])
    assert kinds == ["broker", "broker", "controller"]  # deploy/local.yaml: 1 controller, 2 replicas
    for p in doc["processes"]:
        assert runs_from(p["pid"], cluster.data_dir), f"{p['name']} (pid {p['pid']}) is not running"
        assert Path(p["log"]).is_file()
    assert {p["pid"] for p in doc["processes"]} == set(cluster.pids().values())


def test_status_shows_master_epoch_sync_state_set_and_offsets(cluster: LocalCluster) -> None:
    ok("topic", "create", "status-t", "--queues", "2", "--controllers", cluster.controllers)
    ok("produce", "status-t", "--count", "50", "--controllers", cluster.controllers)
    addresses = {p["address"] for p in cluster.up_doc["processes"] if p["kind"] == "broker"}

    def status() -> dict[str, Any]:
        doc: dict[str, Any] = ok_json("cluster", "status", "--controllers", cluster.controllers)
        return doc

    deadline = time.monotonic() + 20
    while True:  # the slave's confirm offset follows the master's within a heartbeat or two
        doc = status()
        (bs,) = doc["broker_sets"]
        members = {m["broker_id"]: m for m in bs["members"]}
        if (
            all(m["confirm_offset"] == m["max_offset"] for m in members.values())
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.3)
    assert bs["name"] == "broker-a"
    assert bs["epoch"] >= 1
    assert bs["master"] in members and bs["master"] in bs["sync_state_set"]
    assert sorted(bs["sync_state_set"]) == sorted(members)  # both replicas in sync on a quiet cluster
    assert {m["address"] for m in members.values()} == addresses
    master = members[bs["master"]]
    assert master["role"] == "master"
    assert master["max_offset"] > 0, "50 messages were produced"
    for m in members.values():
        assert isinstance(m["broker_id"], int)
        assert isinstance(m["max_offset"], int) and isinstance(m["confirm_offset"], int)
        assert m["confirm_offset"] <= m["max_offset"]
        assert m["max_offset"] == master["max_offset"], "a replica lags on a quiet cluster"
    table = ok("cluster", "status", "--controllers", cluster.controllers)
    assert "broker-a" in table.stdout and "master" in table.stdout


def test_produce_then_consume_from_the_beginning(cluster: LocalCluster) -> None:
    c = cluster.controllers
    ok("topic", "create", "cli-rt", "--queues", "4", "--controllers", c)
    lines = [f"order {i} for customer {i % 9}" for i in range(500)]
    produced = ok_json("produce", "cli-rt", "--batch", "7", "--controllers", c, input="\n".join(lines) + "\n")
    assert produced["sent"] == 500
    msgs = consume_json(cluster, "cli-rt", "g1", "--from-beginning", "--max-messages", "500")
    assert sorted(m["body"] for m in msgs) == sorted(lines)
    assert len({(m["queue"], m["offset"]) for m in msgs}) == 500
    assert {m["queue"] for m in msgs} == {0, 1, 2, 3}
    # The group committed its offsets: a second run has nothing left to read.
    assert consume_json(cluster, "cli-rt", "g1", "--from-beginning", "--idle-timeout", "2") == []


def test_produce_count_and_consume_in_two_runs(cluster: LocalCluster) -> None:
    """`--max-messages` stops a run; the next run of the same group continues where it stopped."""
    c = cluster.controllers
    ok("topic", "create", "cli-split", "--queues", "4", "--controllers", c)
    assert (
        ok_json("produce", "cli-split", "--count", "300", "--batch", "5", "--size", "32", "--controllers", c)[
            "sent"
        ]
        == 300
    )
    first = consume_json(cluster, "cli-split", "split", "--from-beginning", "--max-messages", "123")
    # the rest, counted: a second run that read anything of the first one's again would overlap it
    # below (each queue is read from its committed offset up), so no idle wait is needed to end it
    second = consume_json(cluster, "cli-split", "split", "--from-beginning", "--max-messages", "177")
    assert len(first) == 123
    assert all(len(m["body"]) == 32 for m in first + second)
    a = {(m["queue"], m["offset"]) for m in first}
    b = {(m["queue"], m["offset"]) for m in second}
    assert not a & b, "the second run read again what the first one committed"
    assert len(a | b) == 300, f"{300 - len(a | b)} messages were never read by the group"


def test_group_describe_shows_committed_offsets_and_lag(cluster: LocalCluster) -> None:
    c = cluster.controllers
    ok("topic", "create", "cli-lag", "--queues", "4", "--controllers", c)
    ok("produce", "cli-lag", "--count", "200", "--batch", "10", "--controllers", c)
    assert (
        len(consume_json(cluster, "cli-lag", "lagging", "--from-beginning", "--max-messages", "200")) == 200
    )
    doc = ok_json("group", "describe", "lagging", "--topic", "cli-lag", "--controllers", c)
    rows = doc["queues"]
    assert len(rows) == 4
    assert sum(r["committed"] for r in rows) == 200
    assert all(r["lag"] == 0 and r["committed"] == r["confirmed"] for r in rows)
    assert all({"broker_set", "queue", "committed", "confirmed", "lag", "owner"} <= set(r) for r in rows)
    assert doc["members"] == []  # the consumer closed: it holds no queue and is not live

    ok("produce", "cli-lag", "--count", "40", "--batch", "10", "--controllers", c)
    # Without --topic: the group's topic is found from what its (now gone) members consumed.
    doc = ok_json("group", "describe", "lagging", "--controllers", c)
    assert doc["topic"] == "cli-lag" and sum(r["lag"] for r in doc["queues"]) == 40
    table = ok("group", "describe", "lagging", "--controllers", c)
    assert "cli-lag" in table.stdout


def test_unknown_topic_is_one_clear_line(cluster: LocalCluster) -> None:
    for args in (
        ["produce", "nosuch", "--count", "1"],
        ["consume", "nosuch", "--group", "g", "--max-messages", "1", "--idle-timeout", "1"],
        ["topic", "describe", "nosuch"],
    ):
        out = tide(*args, "--controllers", cluster.controllers, timeout=60)
        assert out.returncode != 0, args
        assert "Traceback" not in out.stderr + out.stdout
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "nosuch" in lines[0] and "TOPIC_NOT_FOUND" in lines[0], (args, out.stderr)


def test_drill_kill_master_loses_no_acknowledged_message(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    c = cluster_factory(name="drill")
    before = c.pids()
    out = ok(
        "drill",
        "kill-master",
        "broker-a",
        "--duration",
        "3s",  # the drill waits for the failover and the rejoin however long they take
        "--keep-topic",
        "--data-dir",
        str(c.data_dir),
        "--json",
        timeout=180,
    )
    report = json.loads(out.stdout)  # one JSON object and nothing else on stdout
    assert isinstance(report, dict)
    assert report["acked"] > 0
    assert report["acked_lost"] == 0
    assert isinstance(report["duplicates"], int) and report["duplicates"] >= 0
    assert report["read"] >= report["acked"]
    assert isinstance(report["max_write_gap_s"], float) and report["max_write_gap_s"] > 0
    assert isinstance(report["rejoin_s"], float) and report["rejoin_s"] > 0, "the old master never rejoined"
    assert report["failover_s"] is not None and report["failover_s"] <= report["rejoin_s"]
    # Cross-check: the drill read back every record its topic holds now (so "lost" was measured
    # against the whole log, not against a partial read).
    queues = ok_json("topic", "describe", report["topic"], "--controllers", c.controllers)
    assert sum(q["max"] - q["min"] for q in queues) == report["read"]
    assert all(q["confirmed"] == q["max"] for q in queues)

    # The killed master was restarted under a new pid that `tide cluster down` must stop as well.
    after = c.pids()
    killed = [name for name in before if before[name] != after[name]]
    assert len(killed) == 1 and killed[0].startswith("broker-a-")
    assert not runs_from(before[killed[0]], c.data_dir)
    status = ok_json("cluster", "status", "--controllers", c.controllers)
    (bs,) = status["broker_sets"]
    assert bs["master"] is not None and bs["master"] != report["killed_broker_id"]
    assert bs["epoch"] >= 2
    down = ok_json("cluster", "down", "--data-dir", str(c.data_dir))
    c.is_down = True
    assert sorted(down["stopped"]) == sorted(after)
    assert [pid for pid in after.values() if runs_from(pid, c.data_dir)] == []


SMALL = """
host: 127.0.0.1
ports: auto
controller: {nodes: 1, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 2500}
broker_sets: [{name: broker-a, replicas: 1}]
broker: {flush: async, replication: async, heartbeat_interval_ms: 500}
"""


def test_down_stops_exactly_what_up_started(
    tmp_path: Path, cluster_factory: Callable[..., LocalCluster]
) -> None:
    topology = tmp_path / "small.yaml"
    topology.write_text(SMALL)
    (tmp_path / "bystander").mkdir()
    bystander = ControllerCluster(tmp_path / "bystander", 1, secret=None).start()
    try:
        c = cluster_factory(topology, name="small")
        pids = c.pids()
        assert len(pids) == 2 and all(runs_from(pid, c.data_dir) for pid in pids.values())
        down = ok_json("cluster", "down", "--data-dir", str(c.data_dir))
        c.is_down = True
        assert sorted(down["stopped"]) == sorted(pids)
        for name, pid in pids.items():
            assert not cmdline(pid), f"{name} (pid {pid}) still exists after tide cluster down"
        (proc,) = bystander.procs.values()
        assert proc.alive(), "tide cluster down stopped a process it did not start"
        # A second `down` finds nothing to stop, and says so.
        again = tide("cluster", "down", "--data-dir", str(c.data_dir))
        assert again.returncode != 0 and "no cluster" in again.stderr and "Traceback" not in again.stderr
    finally:
        bystander.stop()


def test_down_does_not_signal_a_reused_pid(
    tmp_path: Path, cluster_factory: Callable[..., LocalCluster]
) -> None:
    """A recorded pid that now belongs to another tidelog process (pids are reused) is left alone."""
    topology = tmp_path / "small.yaml"
    topology.write_text(SMALL)
    c = cluster_factory(topology, name="reuse")
    pids = c.pids()
    # A process that looks like tidelog (its command line says so) but was not started by `up`.
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "tidelog.cli", "controller"],
        stdin=subprocess.DEVNULL,
    )
    try:
        state_path = c.data_dir / "cluster.json"
        state = json.loads(state_path.read_text())
        broker = next(p for p in state["processes"] if p["kind"] == "broker")
        real_pid = broker["pid"]
        os.kill(real_pid, signal.SIGKILL)  # the broker died ...
        deadline = time.monotonic() + 10
        while cmdline(real_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        broker["pid"] = stranger.pid  # ... and its pid now runs something else
        state_path.write_text(json.dumps(state))
        out = ok_json("cluster", "down", "--data-dir", str(c.data_dir))
        c.is_down = True
        assert broker["name"] not in out["stopped"]
        assert stranger.poll() is None, "tide cluster down killed a process it did not start"
        assert not runs_from(pids["controller-c1"], c.data_dir)
    finally:
        stranger.kill()
        stranger.wait(10)


def test_drill_refuses_a_set_with_one_replica(
    tmp_path: Path, cluster_factory: Callable[..., LocalCluster]
) -> None:
    """Killing the only replica leaves nothing to fail over to: the drill says so and kills nothing."""
    topology = tmp_path / "small.yaml"
    topology.write_text(SMALL)
    c = cluster_factory(topology, name="single")
    pids = c.pids()
    out = tide(
        "drill",
        "kill-master",
        "broker-a",
        "--duration",
        "3s",
        "--data-dir",
        str(c.data_dir),
        "--json",
        timeout=120,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "broker-a" in lines[0] and "replica" in lines[0], out.stderr
    assert c.pids() == pids and all(runs_from(pid, c.data_dir) for pid in pids.values())


def test_up_again_on_a_running_cluster_is_refused(cluster: LocalCluster) -> None:
    pids = cluster.pids()
    out = tide("cluster", "up", "-c", "deploy/local.yaml", "--data-dir", str(cluster.data_dir), timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "already running" in lines[0], out.stderr
    assert cluster.pids() == pids and all(runs_from(pid, cluster.data_dir) for pid in pids.values())


def test_consume_without_from_beginning_starts_at_the_end(cluster: LocalCluster) -> None:
    c = cluster.controllers
    ok("topic", "create", "cli-latest", "--queues", "2", "--controllers", c)
    ok("produce", "cli-latest", "--controllers", c, input="".join(f"old {i}\n" for i in range(20)))
    assert consume_json(cluster, "cli-latest", "late", "--idle-timeout", "1") == []
    ok(
        "produce",
        "cli-latest",
        "--controllers",
        c,
        "--batch",
        "1",
        input="".join(f"new {i}\n" for i in range(6)),
    )
    # The first run committed where it started, so the second run reads exactly what came after
    # (had it started before, its first six would include old ones: they come first in each queue).
    msgs = consume_json(cluster, "cli-latest", "late", "--max-messages", "6")
    assert sorted(m["body"] for m in msgs) == sorted(f"new {i}" for i in range(6))


def test_admin_elect_finds_the_secret_in_the_cluster_data_dir(cluster: LocalCluster) -> None:
    status = ok_json("cluster", "status", "--controllers", cluster.controllers)
    master = status["broker_sets"][0]["master"]
    elect = ["admin", "--controllers", cluster.controllers, "elect", "broker-a", "--broker-id", str(master)]
    unsigned = tide(*elect)  # no $TIDE_CLUSTER_SECRET, no ./tide-data: the call is refused
    assert unsigned.returncode != 0 and "UNAUTHENTICATED" in unsigned.stderr
    signed = tide("admin", "--data-dir", str(cluster.data_dir), *elect[1:])
    # signed, the call reaches the election rules, which keep a live master where it is
    assert "UNAUTHENTICATED" not in signed.stderr, signed.stderr
    assert "CONTROLLER_MASTER_STILL_EXIST" in signed.stderr, signed.stderr
    after = ok_json("cluster", "status", "--controllers", cluster.controllers)["broker_sets"][0]
    assert after["master"] == master


def test_network_faults_need_a_netns_cluster_and_process_faults_do_not(cluster: LocalCluster) -> None:
    out = tide("fault", "partition", "dc-a", "dc-b", "--data-dir", str(cluster.data_dir))
    assert out.returncode != 0 and "--netns" in out.stderr and "Traceback" not in out.stderr
    out = tide("fault", "pause", "no-such-process", "--data-dir", str(cluster.data_dir))
    assert out.returncode != 0 and "no process named" in out.stderr
