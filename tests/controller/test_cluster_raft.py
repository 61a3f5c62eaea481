"""Scenario: the controller is a 3-node Raft cluster of real processes.

- kill -9 of the leader: a new leader within 5 s, and every committed change (topics,
  metadata, broker registrations) is still there;
- the killed node restarts with the same data dir and catches up (reads from it show the changes
  made while it was down);
- a follower answers a write with CONTROLLER_NOT_LEADER naming the leader, and ControllerClient
  follows it transparently;
- a multi-node controller without a cluster secret refuses to start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.brokers import pause, resume
from tests.controller.simbroker import wait_for
from tests.procs import ControllerCluster
from tidelog import errors
from tidelog.client.controllers import ControllerClient
from tidelog.proto import controller_pb2 as pb

pytestmark = pytest.mark.slow


async def _leader(
    client: ControllerClient, cluster: ControllerCluster, among: list[str], all_up: bool = False
) -> str | None:
    """The node id every answering node in `among` agrees leads (every node must answer if `all_up`)."""
    seen = set()
    for nid in among:
        try:
            st = await client.cluster_status(address=cluster.grpc[nid])
        except errors.TidelogError:
            if all_up:
                return None
            continue
        if st.raft_state == "leader":
            seen.add(nid)
        elif st.leader_id and st.leader_id in among:  # a leader outside `among` (killed) does not count
            seen.add(st.leader_id)
        else:
            return None
    return seen.pop() if len(seen) == 1 else None


async def _commit_initial_state(client: ControllerClient) -> None:
    """Committed state before the crash: broker registrations, a topic, metadata."""
    ids = [
        (
            await client.register_broker(
                "broker-a", f"127.0.0.1:{30001 + i}", f"127.0.0.1:{31001 + i}", identity=f"a-{i}"
            )
        ).broker_id
        for i in range(2)
    ]
    assert ids == [1, 2]
    await client.create_topic("orders", {"broker-a": 8})
    await client.meta_create("ledgers/1", b"open")
    await client.meta_cas("ledgers/1", b"closed", 1)


async def _check_followers_redirect_writes(
    client: ControllerClient, cluster: ControllerCluster, leader: str, followers: list[str]
) -> None:
    """A follower refuses a write naming the leader, answers reads, and a client follows it to the leader."""
    # a follower answers a write with NOT_LEADER naming the leader's gRPC address
    with pytest.raises(errors.ControllerNotLeaderError) as info:
        await client.call(
            "admin",
            "CreateTopic",
            pb.CreateTopicRequest(name="direct", queues={"broker-a": 1}),
            address=cluster.grpc[followers[0]],
        )
    assert info.value.leader == cluster.grpc[leader]
    # ... and any follower answers reads from its replica
    st = await client.cluster_status(address=cluster.grpc[followers[0]])
    assert st.leader_address == cluster.grpc[leader]
    # a client that knows only followers first still gets its write done
    async with ControllerClient([cluster.grpc[f] for f in followers] + [cluster.grpc[leader]]) as fc:
        await fc.create_topic("via-follower", {"broker-a": 2})
        assert fc.leader_hint == cluster.grpc[leader]


async def _kill_leader_and_elect(
    client: ControllerClient,
    cluster: ControllerCluster,
    leader: str,
    followers: list[str],
    timings: dict[str, float],
) -> tuple[str, float]:
    """kill -9 the leader: a new leader within 5 s. Returns the new leader and when the kill happened."""
    cluster.procs[leader].kill9()
    killed_at = time.monotonic()
    new_leader = await wait_for(
        lambda: _leader(client, cluster, followers), 10, interval=0.05, what="a new leader"
    )
    timings["leader election after kill -9"] = time.monotonic() - killed_at
    assert new_leader in followers
    assert timings["leader election after kill -9"] < 5.0
    return new_leader, killed_at


async def _check_state_kept_and_writes_resume(
    client: ControllerClient,
    cluster: ControllerCluster,
    followers: list[str],
    killed_at: float,
    timings: dict[str, float],
) -> None:
    """Every committed change is still there, and the surviving majority takes writes again."""
    # every committed change is still there, read from the new leader
    for nid in followers:
        assert {"orders", "via-follower"} <= await _topics_on(client, cluster, nid)
    assert (await client.meta_get("ledgers/1")).value == b"closed"
    members = (await client.describe_broker_sets(["broker-a"])).broker_sets[0].members
    assert [m.broker_id for m in members] == [1, 2]
    # the cluster takes writes again (2 of 3 is a majority)
    write_ok_at = time.monotonic()
    await client.create_topic("after-crash", {"broker-a": 4})
    timings["first write after kill -9"] = time.monotonic() - killed_at
    await client.meta_cas("ledgers/1", b"reopened", 2)
    await client.register_broker("broker-a", "127.0.0.1:30009", "127.0.0.1:31009", identity="a-late")
    assert time.monotonic() - write_ok_at < 10


async def _restart_and_catch_up(
    client: ControllerClient,
    cluster: ControllerCluster,
    leader: str,
    new_leader: str,
    timings: dict[str, float],
) -> None:
    """The killed node restarts with the same data dir, catches up and follows the new leader."""
    cluster.procs[leader].start()
    restarted = cluster.grpc[leader]

    async def caught_up() -> bool:
        topics = await _topics_on(client, cluster, leader)
        meta = await client.call("admin", "MetaGet", pb.MetaGetRequest(key="ledgers/1"), address=restarted)
        sets = await client.call(
            "route", "DescribeBrokerSets", pb.DescribeBrokerSetsRequest(), address=restarted
        )
        return "after-crash" in topics and meta.value == b"reopened" and len(sets.broker_sets[0].members) == 3

    t0 = time.monotonic()
    await wait_for(caught_up, 20, interval=0.2, what="the restarted node to catch up")
    timings["restarted node caught up"] = time.monotonic() - t0
    status = await client.cluster_status(address=restarted)
    assert status.raft_state == "follower" and status.leader_address == cluster.grpc[new_leader]


async def _scenario(cluster: ControllerCluster) -> dict[str, float]:
    timings: dict[str, float] = {}
    async with ControllerClient(cluster.address_list, total_timeout=20) as client:
        leader = await wait_for(
            lambda: _leader(client, cluster, cluster.ids, all_up=True), 20, what="a first leader"
        )
        followers = [i for i in cluster.ids if i != leader]
        await _commit_initial_state(client)
        await _check_followers_redirect_writes(client, cluster, leader, followers)
        new_leader, killed_at = await _kill_leader_and_elect(client, cluster, leader, followers, timings)
        await _check_state_kept_and_writes_resume(client, cluster, followers, killed_at, timings)
        await _restart_and_catch_up(client, cluster, leader, new_leader, timings)
    return timings


async def _topics_on(client: ControllerClient, cluster: ControllerCluster, nid: str) -> set[str]:
    """Topic names as one node's replica has them (no leader following)."""
    reply = await client.call("admin", "ListTopics", pb.ListTopicsRequest(), address=cluster.grpc[nid])
    return {t.name for t in reply.topics}


def test_leader_crash_keeps_committed_state_and_restart_catches_up(
    controller_cluster: Callable[..., ControllerCluster],
) -> None:
    cluster = controller_cluster(3)
    timings = asyncio.run(_scenario(cluster))
    print("3-node controller: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()))


def test_multi_node_controller_without_secret_refuses_to_start(
    controller_cluster: Callable[..., ControllerCluster],
) -> None:
    cluster = controller_cluster(3, secret=None, start=False)
    for p in cluster.procs.values():
        p.env = {"TIDE_CLUSTER_SECRET": "", "TIDE_CONTROLLER_SECRET": ""}
        p.start()
    for p in cluster.procs.values():
        assert p.wait(30) != 0
        assert "secret" in p.output()


def test_a_node_with_the_wrong_secret_cannot_join(
    controller_cluster: Callable[..., ControllerCluster],
) -> None:
    cluster = controller_cluster(3, start=False)
    # c3 is told a different secret: the others must not let it in, nor must it learn the state.
    text = cluster.config_path.read_text().replace("test-cluster-secret", "a-different-secret")
    wrong = cluster.root / "wrong-secret.yaml"
    wrong.write_text(text)
    wrong.chmod(0o600)  # it holds a secret: a controller refuses a config others can read
    cluster.procs["c3"].args[cluster.procs["c3"].args.index(str(cluster.config_path))] = str(wrong)
    cluster.start()

    async def scenario() -> None:
        good = [cluster.grpc["c1"], cluster.grpc["c2"]]
        async with ControllerClient(good, total_timeout=20) as client:
            await client.register_broker("broker-a", "127.0.0.1:30001", "127.0.0.1:31001", identity="a-1")
            await client.create_topic("secret-topic", {"broker-a": 1})
            await asyncio.sleep(3.0)  # several append-entries rounds and c3's own election attempts
            assert await _topics_on(client, cluster, "c2") == {"secret-topic"}
            assert await _topics_on(client, cluster, "c3") == set()
            st3 = await client.cluster_status(address=cluster.grpc["c3"])
            assert st3.raft_state != "leader" and st3.leader_id in ("", "c3")
            for nid in ("c1", "c2"):
                st = await client.cluster_status(address=cluster.grpc[nid])
                assert st.leader_id in ("c1", "c2")

    asyncio.run(scenario())


def test_a_leader_cut_off_from_its_majority_withholds_the_lease(
    controller_cluster: Callable[..., ControllerCluster],
) -> None:
    """docs/ARCHITECTURE.md §3.5: a Raft leader whose followers stopped answering leads on for
    leader_fallback_timeout_ms, but its heartbeat replies stop renewing leases within a fraction of
    the heartbeat timeout (the simulator's seed 46)."""
    cluster = controller_cluster(3)

    async def scenario() -> None:
        async with ControllerClient(cluster.address_list, total_timeout=20) as client:
            leader = await wait_for(
                lambda: _leader(client, cluster, cluster.ids, all_up=True), 20, what="a first leader"
            )
            bid = (
                await client.register_broker("broker-a", "127.0.0.1:30001", "127.0.0.1:31001", identity="a-0")
            ).broker_id

            async def beat() -> pb.HeartbeatReply:
                request = pb.HeartbeatRequest(broker_set="broker-a", broker_id=bid, epoch=-1, max_offset=0)
                return await client.call("broker", "Heartbeat", request, address=cluster.grpc[leader])

            assert not (await beat()).lease_withheld  # a leader its majority answers grants it
            followers = [cluster.procs[i] for i in cluster.ids if i != leader]
            for p in followers:
                pause(p)
            try:
                # still the leader (PySyncObj steps down only after its fallback), no longer granting
                await wait_for(
                    lambda: _withheld_while_leading(client, cluster, leader, beat),
                    3,
                    0.05,
                    what="the cut-off leader to withhold the lease",
                )
            finally:
                for p in followers:
                    resume(p)

    asyncio.run(scenario())


async def _withheld_while_leading(
    client: ControllerClient, cluster: ControllerCluster, leader: str, beat: Callable[..., Any]
) -> bool:
    reply = await beat()
    status = await client.cluster_status(address=cluster.grpc[leader])
    assert status.raft_state == "leader", "the leader stepped down before it withheld the lease"
    return bool(reply.lease_withheld)
