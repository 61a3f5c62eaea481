"""A controller cluster plus broker set(s) as real processes, always stopped at teardown.

`broker_cluster(replicas, controllers=1, controller_options=None, **broker_options)` starts the controllers and one broker
set `broker-a`, creates the topic `t` with `QUEUES` queues on it, and waits until a master serves
the topic and every replica is in the SyncStateSet. At teardown every paused broker is resumed
(SIGCONT) and every process is stopped; the logs are printed when the test failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import BrokerSetProcs, create_topic, resume, wait_topic
from tests.procs import ControllerCluster

TOPIC = "t"
QUEUES = 4
SET = "broker-a"


@dataclass
class BrokerCluster:
    cc: ControllerCluster
    bs: BrokerSetProcs

    @property
    def controllers(self) -> str:
        return self.cc.address_list


@pytest.fixture
def broker_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., BrokerCluster]]:
    started: list[BrokerCluster] = []
    pending: list[Any] = []

    def start(
        replicas: int = 2,
        controllers: int = 1,
        *,
        wait_in_sync: bool = True,
        controller_options: dict[str, Any] | None = None,
        **broker_options: Any,
    ) -> BrokerCluster:
        root = tmp_path / f"cluster{len(started) + len(pending)}"
        (root / "controllers").mkdir(parents=True)
        options: dict[str, Any] = {}
        options.update(controller_options or {})
        cc = ControllerCluster(root / "controllers", controllers, **options)
        pending.append(cc)
        cc.start()
        bs = BrokerSetProcs(root, SET, replicas, cc.address_list, **broker_options)
        cluster = BrokerCluster(cc, bs)
        pending.remove(cc)
        started.append(cluster)
        bs.start()
        create_topic(cc.address_list, TOPIC, {SET: QUEUES})
        bs.wait_master(timeout=20)
        wait_topic(bs, TOPIC)
        if wait_in_sync:
            bs.wait_in_sync(replicas, timeout=20)
        return cluster

    yield start
    rep = getattr(request.node, "rep_call", None)
    failed = rep is None or rep.failed
    for cluster in reversed(started):
        for p in [*cluster.bs.procs, *cluster.cc.procs.values()]:
            resume(p)
        cluster.bs.stop()
        cluster.cc.stop()
        if failed:
            print(cluster.bs.logs())
            print(cluster.cc.logs())
    for cc in pending:
        cc.stop()


def replica_over_log(tmp_path: Path, **keys: Any) -> tuple[Any, Any]:
    """A `Replica` of broker set broker-a over a real commit log in `tmp_path` (`flush: sync`),
    in this process: no controller answers it (127.0.0.1:1) and no port is open. `keys` add to
    or override its config. The caller closes the log."""
    from tidelog.broker import config
    from tidelog.broker.replica import Replica
    from tidelog.commitlog import CommitLog

    cfg = config.from_mapping(
        {
            "broker_set": "broker-a",
            "data_dir": str(tmp_path),
            "controllers": "127.0.0.1:1",
            "secret": "a-real-secret-for-the-tests-0123456789",
            "flush": "sync",
            **keys,
        }
    )
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush="sync")
    return Replica(cfg, log, broker_id=1), log
