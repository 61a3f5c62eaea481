"""Forced quorum recovery on real processes (docs/RUNBOOK-quorum.md): three controllers, one broker
set of two replicas; the "datacenter" holding c1, c2 and the master dies (SIGKILL). The survivor
c3 is recovered as a one-node cluster at cluster epoch 1, elects the surviving slave (it is in the
SyncStateSet), and the set writes again. The old majority comes back with its old data and forms
its own epoch-0 quorum: its answers are refused by a client and by the brokers that saw epoch 1,
and it refuses their calls itself (it creates no topic for a caller that saw epoch 1).
Then c1 is wiped and added back (`tide controller add-node`), and the old master rejoins as a slave
with a byte-identical log.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests import procs
from tests.brokers import BrokerSetProcs, commitlog_prefix, create_topic, read_queues, status_of, wait_topic
from tests.procs import ControllerCluster, wait_until
from tidelog.client.controllers import ControllerClient
from tidelog.clusterepoch import CALLER_EPOCH_KEY, IDENTITY_FILE
from tidelog.errors import ClusterEpochFencedError
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc
from tidelog.wire import ERROR_CODE_KEY

pytestmark = pytest.mark.slow

TOPIC = "t"
SET = "broker-a"
QUEUES = 2
WRITES_AGAIN_S = 10.0  # the target: writes again within 10 s of the recovery command


def tide(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return procs.tide(*args, timeout=timeout)


async def _status(addresses: list[str], address: str, seen: int = 0) -> tuple[int, tuple[str, ...], str]:
    """(cluster epoch, members, leader id) of the node at `address`, by a client that saw `seen`."""
    async with ControllerClient(addresses, cluster_epoch=seen, total_timeout=5.0) as client:
        reply = await client.cluster_status(address=address)
        return reply.cluster_epoch, tuple(reply.members), reply.leader_id


async def _indexes(addresses: list[str], address: str) -> tuple[int, int]:
    """(commit index, last applied) of the node at `address`."""
    async with ControllerClient(addresses, total_timeout=5.0) as client:
        reply = await client.cluster_status(address=address)
        return reply.commit_index, reply.last_applied


async def _create_topic(addresses: list[str], name: str, seen: int) -> None:
    async with ControllerClient(addresses, cluster_epoch=seen, total_timeout=3.0) as client:
        await client.create_topic(name, {SET: 1})


async def _topics(addresses: list[str]) -> set[str]:
    """The topics the controllers at `addresses` hold, asked by a client that saw no epoch."""
    async with ControllerClient(addresses, total_timeout=5.0) as client:
        return {t.name for t in await client.list_topics()}


def _server_refuses(address: str, seen: int) -> str:
    """The error code the controller at `address` itself answers a call naming epoch `seen` with,
    on a bare channel (no client-side check): "" when it answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            pb_grpc.ControllerAdminStub(channel).ClusterStatus(
                pb.ClusterStatusRequest(), metadata=((CALLER_EPOCH_KEY, str(seen)),), timeout=5
            )
        except grpc.RpcError as exc:
            return dict(exc.trailing_metadata() or ()).get(ERROR_CODE_KEY, exc.code().name)
    return ""


def _produce(bs: BrokerSetProcs, i: int, tag: str, n: int) -> list[bytes]:
    bodies = [f"{tag}-{k}".encode() for k in range(n)]
    for b in bodies:
        bs.clients[i].produce(TOPIC, [b], timeout=5)
    return bodies


def _produce_until_acked(bs: BrokerSetProcs, i: int, body: bytes, within_s: float) -> None:
    """Send `body` to replica `i` until it is acknowledged (fails after `within_s`)."""
    start = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - start < within_s:
        try:
            bs.clients[i].produce(TOPIC, [body], timeout=2)
            return
        except Exception as exc:  # not master yet, or no ack yet: the set is still failing over
            last = exc
            time.sleep(0.05)  # pacing retries, not ordering events
    raise AssertionError(f"{body!r} not acknowledged within {within_s} s: {last}")


def _lose_the_majority_and_recover(cc: ControllerCluster, bs: BrokerSetProcs, m: int) -> None:
    """Kill c1, c2 and the master (their datacenter goes dark), recover c3, start it. First c3
    applies what the cluster committed: the recovery's report is checked for the broker set as
    the majority left it, which a follower one entry behind would not hold yet."""
    committed = max(asyncio.run(_indexes(cc.addresses, cc.grpc[c]))[0] for c in ("c1", "c2", "c3"))
    wait_until(
        lambda: asyncio.run(_indexes(cc.addresses, cc.grpc["c3"]))[1] >= committed,
        10,
        0.1,
        what="c3 to apply what the cluster committed",
    )
    for c in ("c1", "c2"):
        cc.procs[c].kill9()
    bs.procs[m].kill9()
    cc.procs["c3"].stop()
    refused = tide("controller", "recover", "--config", str(cc.config_path), "--node-id", "c3")
    assert refused.returncode != 0 and "--yes" in refused.stderr, refused
    done = tide(
        "controller", "recover", "--config", str(cc.config_path), "--node-id", "c3", "--yes", "--json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["old_epoch"], report["new_epoch"]) == (0, 1)
    assert report["applied_index"] >= report["known_committed_index"] > 0
    (summary,) = report["broker_sets"]
    assert summary["name"] == SET and len(summary["sync_state_set"]) == 2
    cc.procs["c3"].start()


def _old_majority_is_fenced(cc: ControllerCluster, bs: BrokerSetProcs, s: int) -> list[bytes]:
    """c1 and c2 return with their old data and elect a leader of their own (epoch 0): a client
    that saw epoch 1 refuses them, and the broker set keeps following c3."""
    addresses, c1 = cc.addresses, cc.grpc["c1"]
    cc.procs["c1"].start()
    cc.procs["c2"].start()
    wait_until(
        lambda: asyncio.run(_status(addresses, c1))[2] in ("c1", "c2"),
        20,
        0.2,
        what="the old majority to elect a leader of its own",
    )
    with pytest.raises(ClusterEpochFencedError):
        asyncio.run(_status(addresses, c1, seen=1))
    # a caller that saw epoch 1 is refused by the old controllers themselves: they do not act
    old_majority = [c1, cc.grpc["c2"]]
    with pytest.raises(ClusterEpochFencedError):
        asyncio.run(_create_topic(old_majority, "made-by-the-old-majority", seen=1))
    assert "made-by-the-old-majority" not in asyncio.run(_topics(old_majority))
    assert _server_refuses(c1, seen=1) == "CLUSTER_EPOCH_FENCED"
    # the broker saw epoch 1 and persisted it; it keeps following c3 and writing
    assert (bs.data_dirs[s] / "controller-cluster.epoch").read_text().strip() == "1"
    acked = _produce(bs, s, "old-majority-back", 10)
    assert bs.master_index() == s
    cc.procs["c1"].stop()
    cc.procs["c2"].stop()
    return acked


def _add_back(cc: ControllerCluster, node: str) -> None:
    """`tide controller add-node` for a stopped node of the old majority, started once prepared."""
    args = [
        "controller",
        "add-node",
        "--config",
        str(cc.config_path),
        "--node-id",
        node,
        "--yes",
        "--wait",
        "30",
    ]
    adder = subprocess.Popen(
        [sys.executable, "-m", "tidelog.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (cc.root / "data" / node / IDENTITY_FILE).exists(), 20, 0.1, what=f"{node} to be prepared"
        )
        cc.procs[node].start()
        out, err = adder.communicate(timeout=40)
    finally:
        if adder.poll() is None:
            adder.kill()
            adder.wait(5)
    assert adder.returncode == 0, (out, err)
    assert any(p.name.startswith(f"{node}.wiped-epoch-0") for p in (cc.root / "data").iterdir())


def _rejoins_identical(bs: BrokerSetProcs, m: int, s: int, acked: list[bytes]) -> None:
    """The old master rejoins as a slave; both logs are byte-identical and hold every ack."""
    bs.procs[m].start()
    assert bs.wait_in_sync(2, timeout=30) == s
    end = bs.clients[s].status().max_offset
    wait_until(
        lambda: (st := status_of(bs, m)) is not None and st.max_offset == end,
        20,
        0.1,
        what="the old master to copy the new master's log",
    )
    on_master = read_queues(bs.clients[s], TOPIC, QUEUES)
    assert read_queues(bs.clients[m], TOPIC, QUEUES) == on_master
    assert set(acked) <= {b for q in on_master.values() for b in q}
    assert commitlog_prefix(bs.data_dirs[m], end) == commitlog_prefix(bs.data_dirs[s], end)


def test_recover_the_survivor_elect_the_slave_fence_and_rejoin_the_old_majority(tmp_path: Path) -> None:
    (tmp_path / "controllers").mkdir(parents=True)
    cc = ControllerCluster(tmp_path / "controllers", 3).start()
    bs = BrokerSetProcs(tmp_path, SET, 2, cc.address_list, flush="sync")
    try:
        bs.start()
        create_topic(cc.address_list, TOPIC, {SET: QUEUES})
        bs.wait_master(timeout=20)
        wait_topic(bs, TOPIC)
        m = bs.wait_in_sync(2, timeout=30)
        s = 1 - m
        acked = _produce(bs, m, "before", 20)
        _lose_the_majority_and_recover(cc, bs, m)
        # the slave, in the SyncStateSet, is elected once the lost master's liveness times out
        # (a bounded wait, not a speed claim: the drill measures the time)
        _produce_until_acked(bs, s, b"after-recovery", WRITES_AGAIN_S + 5)
        acked += [b"after-recovery"] + _produce(bs, s, "after", 10)
        assert asyncio.run(_status(cc.addresses, cc.grpc["c3"]))[:2] == (1, ("c3",))
        acked += _old_majority_is_fenced(cc, bs, s)
        _add_back(cc, "c1")
        wait_until(
            lambda: asyncio.run(_status(cc.addresses, cc.grpc["c1"], seen=1))[:2] == (1, ("c1", "c3")),
            20,
            0.2,
            what="c1 to serve cluster epoch 1 with members c1 and c3",
        )
        acked += _produce(bs, s, "after-add", 5)
        _rejoins_identical(bs, m, s, acked)
    except BaseException:
        print(bs.logs())
        print(cc.logs())
        raise
    finally:
        bs.stop()
        cc.stop()
