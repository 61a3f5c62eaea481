"""`tide broker drain` on a real `tide cluster up` cluster (2 replicas, sync replication) under a
producer: the master role moves to the other replica, no acknowledged message is lost, and the
longest write gap is printed beside a kill -9 failover's for comparison (not asserted: timing
on a shared machine is no proof; the gaps go to the report).

Run with `-s` to see the gaps:
    .venv/bin/pytest -s tests/client/test_broker_drain.py
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, tide
from tidelog.client import Client
from tidelog.drill.killmaster import Load, describe_set, kill_master, read_all

pytestmark = pytest.mark.slow

BROKER_SET = "broker-a"


def test_drain_hands_the_master_role_over_under_load(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(name="drain")
    with Client(cluster.controllers) as client:
        client.admin().create_topic("drained", queues=2)
        old = describe_set(client, BROKER_SET).role.master_id
        with Load(client.producer(), "drained") as load:
            time.sleep(1.5)  # writes before the drain (hundreds: the producer runs flat out)
            t_drain = time.monotonic()
            out = tide(
                "broker",
                "drain",
                BROKER_SET,
                "--controllers",
                cluster.controllers,
                "--data-dir",
                str(cluster.data_dir),
                "--json",
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            result: dict[str, Any] = json.loads(out.stdout)
            assert result["old_master"] == old and result["new_master"] != old and result["serving"]
            assert time.monotonic() - t_drain < 10, "the role moved within 10 s"
            time.sleep(1.5)  # and writes to the new master
        assert describe_set(client, BROKER_SET).role.master_id == result["new_master"]
        acked = [b for b, _ in load.acked]
        assert len(acked) > 100, "the producer kept writing"
        read = collections.Counter(read_all(client, "drained"))
        lost = [b for b in acked if read[b] == 0]
        assert lost == [], f"{len(lost)} acknowledged messages lost"
        print(f"\ndrain: {len(acked)} acked, 0 lost, longest write gap {load.longest_gap(t_drain):.3f} s")


def test_kill_9_failover_for_comparison(cluster_factory: Callable[..., LocalCluster]) -> None:
    """The same load through a kill -9 of the master (the drill `tide drill kill-master` runs)."""
    cluster = cluster_factory(name="kill9")
    report = kill_master(cluster.data_dir, BROKER_SET, duration_s=6.0, queues=2)
    assert report["acked_lost"] == 0 and report["acked"] > 100
    with Client(cluster.controllers) as client:
        assert report["topic_deleted"] and client.admin().list_topics() == [], "the drill's topic is gone"
    print(
        f"\nkill -9: {report['acked']} acked, 0 lost, longest write gap {report['max_write_gap_s']:.3f} s, "
        f"failover {report['failover_s']} s"
    )
