"""Metrics end to end: a real `tide cluster up` cluster (two replicas, sync replication) scraped over
HTTP under load. The produce counter equals the messages the producer got receipts for, consumer
lag follows the group's commits, and the master's view of the slave's lag rises while the slave is
paused (SIGSTOP, `tide fault pause`) and falls back to zero after it resumes. Every process answers
/healthz, and /readyz once registered (brokers) or once Raft has a leader (controllers)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.client.conftest import LocalCluster, tide
from tidelog.client import Client

pytestmark = pytest.mark.slow

TOPIC = "metered"


def get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(address: str, name: str, **labels: str) -> float | None:
    """The sum of `name`'s samples whose labels include `labels` (None: no such sample)."""
    status, text = get(address, "/metrics")
    assert status == 200
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def produce(client: Client, n: int, prefix: str) -> int:
    """Send `n` messages; the number acknowledged (every one, or the test fails)."""
    futures = [client.producer().send_async(TOPIC, f"{prefix}-{i}".encode()) for i in range(n)]
    return sum(1 for f in futures if f.result(timeout=30))


class BackgroundProducer:
    """Sends continuously from a thread, counting receipts; errors (a paused slave) are expected."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.acked = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = self.client.producer()
        i = 0
        while not self.stop.is_set():
            batch = [producer.send_async(TOPIC, f"bg-{i}-{j}".encode()) for j in range(20)]
            i += 1
            for f in batch:
                try:
                    f.result(timeout=30)
                    self.acked += 1
                except (concurrent.futures.TimeoutError, Exception):
                    continue
            time.sleep(0.05)

    def __enter__(self) -> BackgroundProducer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _processes(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in cluster.up_doc["processes"]}


def _check_health(procs: dict[str, dict[str, Any]]) -> None:
    for name, p in procs.items():
        assert p["metrics"], f"{name} has no metrics address in `cluster up --json`"
        assert get(p["metrics"], "/healthz") == (200, "ok\n"), name
        wait_for(f"{name} ready", lambda p=p: get(p["metrics"], "/readyz")[0] == 200)
    ctrl = procs["controller-c1"]["metrics"]
    assert scrape(ctrl, "tidelog_raft_has_leader") == 1
    assert scrape(ctrl, "tidelog_raft_is_leader") == 1
    assert scrape(ctrl, "tidelog_controller_alive_brokers", broker_set="broker-a") == 2


def test_metrics_move_with_load_and_with_a_paused_slave(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(name="metrics")
    procs = _processes(cluster)
    _check_health(procs)
    brokers = [procs["broker-a-0"], procs["broker-a-1"]]
    assert (
        tide("topic", "create", TOPIC, "--queues", "2", "--controllers", cluster.controllers).returncode == 0
    )
    wait_for(
        "a master", lambda: any(scrape(b["metrics"], "tidelog_broker_role", role="master") for b in brokers)
    )
    master, slave = sorted(
        brokers, key=lambda b: -(scrape(b["metrics"], "tidelog_broker_role", role="master") or 0)
    )
    with Client(cluster.controllers) as client:
        acked = produce(client, 200, "first")
        assert scrape(master["metrics"], "tidelog_produced_messages_total", topic=TOPIC) == acked == 200
        assert scrape(master["metrics"], "tidelog_ack_wait_seconds_count")
        assert scrape(master["metrics"], "tidelog_rpc_duration_seconds_count", method="Produce")
        _consume_and_check_lag(client, master["metrics"])
        acked += produce(client, 30, "second")
        assert scrape(master["metrics"], "tidelog_produced_messages_total", topic=TOPIC) == acked
        assert scrape(master["metrics"], "tidelog_consumer_lag_messages", group="g", topic=TOPIC) == 30
        assert scrape(master["metrics"], "tidelog_ha_lag_bytes", slave_id=str(_slave_id(slave))) == 0
        # the cluster's HA stream is plain TCP: records go to the slave by sendfile
        assert (scrape(master["metrics"], "tidelog_ha_sent_bytes_total", how="sendfile") or 0) > 0
        _pause_and_resume(cluster, client, master, slave, acked)


def _slave_id(slave: dict[str, Any]) -> int:
    status, text = get(slave["metrics"], "/metrics")
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tidelog_broker_epoch":
                return int(s.labels["broker_id"])
    raise AssertionError("the slave exports no broker id")


def _consume_and_check_lag(client: Client, master: str) -> None:
    got = 0
    with client.consumer(group="g", topic=TOPIC) as consumer:
        deadline = time.monotonic() + 20
        while got < 200 and time.monotonic() < deadline:
            got += len(consumer.poll(max_messages=100, timeout=1.0))
        consumer.commit()
    assert got == 200
    wait_for("the group's lag at 0", lambda: scrape(master, "tidelog_consumer_lag_messages", group="g") == 0)


def _pause_and_resume(
    cluster: LocalCluster, client: Client, master: dict[str, Any], slave: dict[str, Any], acked: int
) -> None:
    lag = {"slave_id": str(_slave_id(slave))}
    data = str(cluster.data_dir)
    with BackgroundProducer(client) as bg:
        assert tide("fault", "pause", slave["name"], "--data-dir", data).returncode == 0
        try:
            wait_for(
                "lag to rise", lambda: (scrape(master["metrics"], "tidelog_ha_lag_bytes", **lag) or 0) > 0
            )
            first = scrape(master["metrics"], "tidelog_ha_lag_bytes", **lag) or 0
            wait_for(
                "lag to grow", lambda: (scrape(master["metrics"], "tidelog_ha_lag_bytes", **lag) or 0) > first
            )
            assert (scrape(master["metrics"], "tidelog_ha_lag_seconds", **lag) or 0) > 0
        finally:
            assert tide("fault", "resume", slave["name"], "--data-dir", data).returncode == 0
        wait_for("lag back to 0", lambda: scrape(master["metrics"], "tidelog_ha_lag_bytes", **lag) == 0, 30)
        assert scrape(master["metrics"], "tidelog_ha_slave_connected", **lag) == 1
    produced = scrape(master["metrics"], "tidelog_produced_messages_total", topic=TOPIC) or 0
    # every receipt the producer got was counted; a call the client gave up on may be counted too
    assert produced >= acked + bg.acked
    assert get(slave["metrics"], "/healthz") == (200, "ok\n")
