"""Scenario: a replica's disk is wiped; it comes back as a new, empty broker, copies the whole log,
and replaces the old one; decommissions that would break placement are refused
(controller RULES.md PL4, PL7; broker identity in broker/identity.py).

Real processes from `tide cluster up` on loopback, with the two replicas labelled dc-a and dc-b,
driven only through the `tide` commands an operator would type.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, tide

pytestmark = pytest.mark.slow

TOPOLOGY = """\
host: 127.0.0.1
ports: auto
controller: {nodes: 1, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 3000, placement_audit_interval_ms: 500}
broker_sets:
  - {name: broker-a, replicas: 2, datacenters: [dc-a, dc-b]}
broker:
  flush: async
  replication: sync
  in_sync_replicas: 2
  min_in_sync_replicas: 1
  auto_in_sync_replicas: true
  heartbeat_interval_ms: 500
  ha_idle_timeout_ms: 2000
"""


def run(cluster: LocalCluster, *args: str) -> Any:
    return tide(*args, "--controllers", cluster.controllers)


def status(cluster: LocalCluster) -> dict[str, Any]:
    out = run(cluster, "placement", "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def replicas(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    return {r["broker_id"]: r for r in status(cluster)["replicas"] if r["broker_set"] == "broker-a"}


def live_offsets(cluster: LocalCluster) -> dict[int, int | None]:
    """Each replica's max offset as the replica itself answers it (`tide cluster status`). The
    placement status shows the offsets the controller recorded, which a broker reports at most
    every 30 s (a hint for operators): waiting for those to agree waits for that report."""
    out = run(cluster, "cluster", "status", "--json")
    assert out.returncode == 0, out.stderr
    members = json.loads(out.stdout)["broker_sets"][0]["members"]
    return {m["broker_id"]: m["max_offset"] for m in members}


def exited(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return True


def wait(what: str, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.3)


def test_a_wiped_replica_rejoins_as_new_copies_everything_and_replaces_the_old_one(
    tmp_path: Path, cluster_factory: Callable[..., LocalCluster]
) -> None:
    topo = tmp_path / "two-dc.yaml"
    topo.write_text(TOPOLOGY)
    cluster = cluster_factory(topo)
    data = cluster.data_dir
    assert run(cluster, "topic", "create", "orders", "--queues", "2").returncode == 0
    sent = run(cluster, "produce", "orders", "--count", "3000", "--size", "200")
    assert sent.returncode == 0, sent.stderr
    before = wait(
        "both replicas in sync",
        lambda: (
            (r := replicas(cluster))
            and len(r) == 2
            and all(x["in_sync"] and x["alive"] for x in r.values())
            and r
        ),
    )
    # A ledger on both replicas; its ensemble will name the replica that is wiped.
    wrote = run(
        cluster,
        "ledger",
        "append",
        "-d",
        "first",
        "-d",
        "second",
        "-d",
        "third",
        "--password",
        "pw",
        "--json",
    )
    assert wrote.returncode == 0, wrote.stderr
    ledger = str(json.loads(wrote.stdout)["ledger_id"])
    master = next(i for i, r in before.items() if r["master"])
    old = next(i for i, r in before.items() if not r["master"])
    home, away = before[master]["datacenter"], before[old]["datacenter"]
    assert {home, away} == {"dc-a", "dc-b"}
    names = {p.get("address"): p["name"] for p in cluster.state()["processes"]}
    process, master_process = names[before[old]["address"]], names[before[master]["address"]]

    # Decommissions that would lose the set's safety are refused with a typed error.
    for args in ([str(master)], [str(old)]):
        refused = run(
            cluster, "broker", "decommission", *args, "--broker-set", "broker-a", "--data-dir", str(data)
        )
        assert refused.returncode != 0 and "PLACEMENT_REFUSED" in refused.stderr, refused.stderr
    assert set(replicas(cluster)) == {master, old}

    new = _wipe_and_rejoin(cluster, process, master_process, master, old, away)
    _replace(cluster, ledger, master, old, new, away)
    _read_back(cluster, ledger)
    _refuse_a_foreign_disk(cluster, process, master, new, away)


def _wipe_and_rejoin(
    cluster: LocalCluster, process: str, master_process: str, master: int, old: int, away: str
) -> int:
    """The slave's disk is wiped: it comes back under a new id, empty. The master is paused before
    the new broker starts, so the new one cannot copy anything yet: it must be neither in sync nor
    elected while the master is silent, however long (no acknowledged byte is on it)."""
    data = cluster.data_dir
    assert tide("fault", "kill", process, "--data-dir", str(data)).returncode == 0
    shutil.rmtree(data / process)
    assert tide("fault", "pause", master_process, "--data-dir", str(data)).returncode == 0
    try:
        assert tide("fault", "dc-up", away, "--data-dir", str(data)).returncode == 0
        new = wait(
            f"a new broker id in {away}",
            lambda: next(
                (
                    i
                    for i, r in replicas(cluster).items()
                    if i not in (master, old) and r["datacenter"] == away
                ),
                None,
            ),
        )
        assert new > old, "a wiped replica must not come back under its old id"
        until = (
            time.monotonic() + 5
        )  # past the controller's heartbeat timeout (3 s): the master is dead to it
        while time.monotonic() < until:
            r = replicas(cluster)[new]
            assert r["alive"] and not r["master"] and not r["in_sync"], f"the empty replica was promoted: {r}"
            time.sleep(0.3)
    finally:
        tide("fault", "resume", master_process, "--data-dir", str(data))
    assert run(cluster, "produce", "orders", "--count", "500", "--size", "200").returncode == 0
    now = wait(
        "the new replica to catch up and join the SyncStateSet",
        lambda: (
            (r := replicas(cluster))
            and r[new]["in_sync"]
            and (o := live_offsets(cluster))[new] is not None
            and o[new] == o[master]
            and r
        ),
    )
    assert not now[old]["alive"]
    # The old id is not shown as a live slave although its address now answers as the new broker.
    shown = run(cluster, "cluster", "status", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {m["broker_id"]: m for m in json.loads(shown.stdout)["broker_sets"][0]["members"]}
    assert rows[old]["role"].startswith("gone") and rows[old]["alive"] is False, rows[old]
    assert rows[new]["role"] == "slave" and rows[new]["datacenter"] == away, rows[new]
    return new


def _replace(cluster: LocalCluster, ledger: str, master: int, old: int, new: int, away: str) -> None:
    """The new replica still runs, and it is the only in-sync one in its datacenter: it cannot go.
    Replacing the old id with it re-replicates the ledger's ensembles and leaves a clean audit."""
    data = cluster.data_dir
    refused = run(
        cluster, "broker", "decommission", str(new), "--broker-set", "broker-a", "--data-dir", str(data)
    )
    assert refused.returncode != 0 and "PLACEMENT_REFUSED" in refused.stderr, refused.stderr

    def replace() -> Any:
        out = run(
            cluster,
            "broker",
            "replace",
            str(old),
            "--with",
            str(new),
            "--broker-set",
            "broker-a",
            "--data-dir",
            str(data),
        )
        # Under load the master may drop a lagging replica from the SyncStateSet for a moment: the
        # refusal says so, and the operator tries again (a bounded wait, not a speed assertion).
        return out if out.returncode == 0 or "not in the SyncStateSet" not in out.stderr else None

    replaced = wait("the replace to be accepted", replace)
    assert replaced.returncode == 0, replaced.stderr
    assert set(replicas(cluster)) == {master, new}
    # Re-replicated: the ledger's ensembles name the new replica, which holds its entries.
    info = run(cluster, "ledger", "info", ledger, "--json")
    assert info.returncode == 0, info.stderr
    assert [sorted(m) for m in json.loads(info.stdout)["ensembles"].values()] == [sorted([master, new])]
    repaired = run(cluster, "placement", "repair", "--json", "--data-dir", str(data))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert json.loads(repaired.stdout)["repaired"] == []
    shown = status(cluster)["repairs"]  # the replace's re-replication is visible
    assert [(r["ledger"], r["replaced"]) for r in shown] == [(ledger, {str(old): new})]
    audit = wait(
        "a clean audit", lambda: (a := run(cluster, "placement", "audit", "--json")).returncode == 0 and a
    )
    assert json.loads(audit.stdout)["violations"] == []


def _read_back(cluster: LocalCluster, ledger: str) -> None:
    """Every acknowledged message reads back through the client from the set the new replica is in."""
    got = run(
        cluster, "consume", "orders", "--group", "check", "--from-beginning", "--json", "--idle-timeout", "3"
    )
    assert got.returncode == 0, got.stderr
    assert len([line for line in got.stdout.splitlines() if line.strip()]) == 3500
    entries = run(cluster, "ledger", "read", ledger, "--password", "pw", "--json")
    assert entries.returncode == 0, entries.stderr
    assert all(word in entries.stdout for word in ("first", "second", "third"))


def _refuse_a_foreign_disk(cluster: LocalCluster, process: str, master: int, new: int, away: str) -> None:
    """A disk written by another cluster (its identity file names that cluster) is refused, not
    taken for this cluster's replica: the broker stops with a clear error and changes nothing."""
    data = cluster.data_dir
    ident_path = data / process / "identity.json"
    ident = json.loads(ident_path.read_text())
    assert ident["cluster_id"] and ident["broker_id"] == new
    assert tide("fault", "kill", process, "--data-dir", str(data)).returncode == 0
    ident_path.write_text(json.dumps({**ident, "cluster_id": "another-cluster"}))
    assert tide("fault", "dc-up", away, "--data-dir", str(data)).returncode == 0
    log = data / f"{process}.log"
    wait(
        "the broker to refuse the foreign disk",
        lambda: (
            "CLUSTER_MISMATCH" in log.read_text(errors="replace")
            or "belongs to cluster another-cluster" in log.read_text(errors="replace")
        ),
        timeout=30,
    )
    pid = next(p["pid"] for p in cluster.state()["processes"] if p["name"] == process)
    wait("the refused broker to exit", lambda: exited(pid), timeout=30)
    assert set(replicas(cluster)) == {master, new}
