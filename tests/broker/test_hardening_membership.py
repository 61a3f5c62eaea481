"""Cluster membership proves the cluster secret (hardening rows 2 and 11).

Observed before: with the generated stubs and no credentials, a script registered a fake broker,
forged its heartbeats, added it to the SyncStateSet, forced its election and answered the real
brokers' HA handshakes with an empty epoch list: both truncated to 0 bytes. A heartbeat claiming
epoch 2^62 was accepted. Now every membership call without a valid proof is refused
(UNAUTHENTICATED) at the first step, and a heartbeat beyond the set's epoch is refused even with
one; nothing changes on the real brokers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import grpc
import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import read_queues
from tidelog.clusterauth import CALL_KEY, sign_call
from tidelog.proto import controller_pb2 as pb
from tidelog.proto import controller_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

SET = "broker-a"


def _token(secret: str, method: str, request: object, broker_id: int) -> tuple[tuple[str, str], ...]:
    return (
        (
            CALL_KEY,
            sign_call(
                secret,
                method,
                request.SerializeToString(deterministic=True),  # type: ignore[attr-defined]
                SET,
                broker_id,
                int(time.time() * 1000),
            ),
        ),
    )


def test_the_takeover_is_refused_at_the_first_step(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()
    bodies = [b"acked-%d" % i for i in range(50)]
    for b in bodies:
        bs.clients[master].produce(TOPIC, [b])
    before = [s.max_offset for s in bs.statuses() if s is not None]
    master_epoch = bs.clients[master].status().master_epoch
    controller = cluster.cc.addresses[0]
    stub = pb_grpc.ControllerBrokerStub(grpc.insecure_channel(controller))
    register = pb.RegisterBrokerRequest(
        broker_set=SET, address="127.0.0.1:1", ha_address="127.0.0.1:2", identity="fake"
    )
    forged = [
        ("RegisterBroker", register),
        (
            "Heartbeat",
            pb.HeartbeatRequest(broker_set=SET, broker_id=3, epoch=master_epoch, max_offset=1 << 40),
        ),
        (
            "AlterSyncStateSet",
            pb.AlterSyncStateSetRequest(
                broker_set=SET,
                master_id=1,
                master_epoch=master_epoch,
                new_sync_state_set=[1, 2, 3],
                sync_state_set_epoch=2,
            ),
        ),
        ("ElectMaster", pb.ElectMasterRequest(broker_set=SET, broker_id=3, designated=True)),
    ]
    for method, request in forged:
        for metadata in (None, _token("a-wrong-secret", method, request, 3), ((CALL_KEY, "v1:garbage"),)):
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(request, timeout=5, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, info.value)
    # a valid proof cannot be replayed
    good = _token("test-cluster-secret", "ElectMaster", forged[3][1], -1)
    with pytest.raises(grpc.RpcError):
        stub.ElectMaster(forged[3][1], timeout=5, metadata=good)  # may be refused for its content
    with pytest.raises(grpc.RpcError) as info:
        stub.ElectMaster(forged[3][1], timeout=5, metadata=good)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # a heartbeat claiming an epoch from nowhere is refused even with the secret
    bid = bs.clients[master].status().broker_id
    hb = pb.HeartbeatRequest(broker_set=SET, broker_id=bid, epoch=2**62, max_offset=0, confirm_offset=-1)
    with pytest.raises(grpc.RpcError) as info:
        stub.Heartbeat(hb, timeout=5, metadata=_token("test-cluster-secret", "Heartbeat", hb, bid))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "beyond the broker set's epoch" in (info.value.details() or "")

    time.sleep(2)  # a few heartbeat rounds: nothing may have changed
    assert bs.master_index() == master
    assert bs.clients[master].status().master_epoch == master_epoch
    after = [s.max_offset for s in bs.statuses() if s is not None]
    assert after == before or all(a >= b for a, b in zip(after, before, strict=True))
    for i in range(2):
        stored = sorted(b for q in read_queues(bs.clients[i], TOPIC, QUEUES).values() for b in q)
        assert stored == sorted(bodies)
    assert "refused RegisterBroker" in cluster.cc.logs()
    assert os.environ.get("TIDE_CLUSTER_SECRET") == "test-cluster-secret"
