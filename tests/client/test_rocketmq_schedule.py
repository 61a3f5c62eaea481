"""Delayed and transactional messages of the official RocketMQ client, against the brokers'
RocketMQ endpoint of a cluster started by `tide cluster up` (broker/rocketmqtx.py): two broker
sets of two replicas, every topic with queues in both (tests/client/rocketmq_cluster.py). The
client runs in its own process (tests/client/rocketmq_tx_driver.py). The last test kills the master.

The cluster checks orphaned transactions after 3 s (`rocketmq_tx_check_interval_ms`), so the
tests see checks without waiting for the production default of 30 s."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client import rocketmq_cluster as rc
from tests.client.conftest import LocalCluster
from tests.client.test_rocketmq_endpoint import drive as drive_official
from tidelog import localcluster

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("rocketmq_tx_driver.py")
CHECK_INTERVAL_S = 3.0


def drive(*args: str, timeout: float = 180) -> dict[str, Any]:
    return drive_official(*args, timeout=timeout, driver=DRIVER)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two broker sets with a short transaction check interval."""
    with rc.two_sets(
        tmp_path_factory.mktemp("rmqtx"),
        rocketmq_tx_check_interval_ms=int(CHECK_INTERVAL_S * 1000),
        # enough checks to outlast the last test's failover, its delayed receive and its checker's
        # start on a loaded machine (5 ran out there); no test waits for checks to run out
        rocketmq_tx_max_checks=40,
    ) as c:
        yield c


def master_endpoint(cluster: LocalCluster) -> str:
    return rc.endpoint(cluster, "broker-a", "master")


create_topic = rc.create_topic


def test_delayed_messages_are_received_no_earlier_than_asked_and_once(cluster: LocalCluster) -> None:
    endpoint = master_endpoint(cluster)
    # one broker set (8 queues): a receive waits on the set it names, so each message is seen as
    # it becomes due rather than when the consumer's turn comes back to its set
    rc.create_topic_in(cluster, "rmq-delay", "broker-a", queues=8)
    # the longest first: it must not hold back the shorter ones behind it
    out = drive(endpoint, "delay-send", "rmq-delay", "4", "2", "3")
    sent = out["sent"]
    assert out["too_far"].startswith("40012"), out["too_far"]  # ILLEGAL_DELIVERY_TIME, not stored
    got = drive(endpoint, "receive", "rmq-delay", "g-delay", "3", "9")["received"]
    assert sorted(m["id"] for m in got) == sorted(s["id"] for s in sent), "each delayed message once"
    by_id = {m["id"]: m for m in got}
    for s in sent:
        m = by_id[s["id"]]
        assert (m["body"], m["keys"], m["attempt"]) == (f"delayed-{s['i']}", [f"dk-{s['i']}"], 1)
        assert m["at"] >= s["at"], f"message {s['i']} received {s['at'] - m['at']:.2f} s early"
        assert m["at"] <= s["at"] + 3, f"message {s['i']} received {m['at'] - s['at']:.2f} s late"
    # each in its own window above, the longest sent first: it held none of the shorter ones back
    # past theirs. No order is asserted between them: their times are a second apart, within the
    # window a receive under load may take (RocketMQ promises no order among delayed messages).
    assert "too-far" not in {m["body"] for m in got}


def test_a_recalled_delayed_message_is_never_delivered_and_a_delivered_one_cannot_be_recalled(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "rmq-recall")
    out = drive(master_endpoint(cluster), "recall", "rmq-recall")
    first, second = out["sent"]
    assert first["handle"] and second["handle"]
    assert out["first"] == first["id"]  # recall_message answers the recalled message's id
    assert out["received"] == [second["id"]], "the recalled one never comes; the other once"
    # RocketMQ's answer to a late recall: INTERNAL_SERVER_ERROR, "recall failed, timestamp invalid"
    assert "recall failed, timestamp invalid" in out["late"] and "50001" in out["late"], out["late"]


def test_delayed_messages_of_a_topic_in_another_broker_set_are_kept_and_recalled_there(
    cluster: LocalCluster,
) -> None:
    """The client's endpoint is in broker-a, the topic only in broker-b: the endpoint passes the
    SendMessage and the RecallMessage on to broker-b's master, which keeps the message."""
    rc.create_topic_in(cluster, "rmq-recall-b", "broker-b", queues=4)
    out = drive(master_endpoint(cluster), "recall", "rmq-recall-b")
    first, second = out["sent"]
    assert first["id"].startswith("broker-b:") and second["id"].startswith("broker-b:")
    assert out["first"] == first["id"]
    assert out["received"] == [second["id"]]
    assert "delivered (or recalled) already" in out["late"], out["late"]


def test_transactions_commit_rollback_and_orphans_checked_back(cluster: LocalCluster) -> None:
    endpoint = master_endpoint(cluster)
    create_topic(cluster, "rmq-tx")
    create_topic(cluster, "rmq-tx-other")
    # the producer stays past the first check (3 s) of its two orphans
    out = drive(endpoint, "transactions", "rmq-tx", str(CHECK_INTERVAL_S + 4))
    checked = {c["body"]: c for c in out["checks"]}
    assert sorted(checked) == ["orphan-commit", "orphan-rollback"], out["checks"]
    for body, c in checked.items():
        assert c["id"] == out[body]["id"], "the checker gets the message id its producer was given"
        assert c["at"] >= out["sent_at"] + CHECK_INTERVAL_S - 1
    # received well past the check interval and the last check: a rolled-back message never comes
    got = drive(endpoint, "receive", "rmq-tx", "g-tx", "2", str(2 * CHECK_INTERVAL_S + 1))["received"]
    assert sorted((m["body"], m["id"], m["attempt"]) for m in got) == [
        ("commit", out["commit"]["id"], 1),
        ("orphan-commit", out["orphan-commit"]["id"], 1),
    ]
    assert {m["body"]: m["keys"] for m in got} == {
        "commit": ["tk-commit"],
        "orphan-commit": ["tk-orphan-commit"],
    }

    codes = drive(endpoint, "end-raw", "rmq-tx", "rmq-tx-other")
    assert {k: v for k, v in codes.items() if k != "id"} == {
        "delay_without_time": "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        "normal_with_time": "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        "transaction_with_time": "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        "transaction_with_group": "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        "delay_too_far": "ILLEGAL_DELIVERY_TIME",
        "not_an_id": "INVALID_TRANSACTION_ID",
        "unknown": "INVALID_TRANSACTION_ID",
        "wrong_topic": "INVALID_TRANSACTION_ID",
        "rollback": "OK",
        "again_commit": "INVALID_TRANSACTION_ID",
        "again_rollback": "INVALID_TRANSACTION_ID",
    }
    # none of the refused sends and ends stored anything: the rolled-back half never reaches the topic
    time.sleep(CHECK_INTERVAL_S + 1)
    assert drive(endpoint, "receive", "rmq-tx", "g-tx", "0", "2")["received"] == []


def test_delayed_and_half_messages_survive_a_master_killed_before_they_are_due(cluster: LocalCluster) -> None:
    """Runs last: it leaves the cluster with one replica. A delayed message not due yet and an
    orphaned half message are kept by the master, which is killed; the new master delivers the
    first at its time and checks the second with a producer connected to it, once each."""
    endpoint = master_endpoint(cluster)
    create_topic(cluster, "rmq-delay-kill")
    create_topic(cluster, "rmq-tx-kill")
    (sent,) = drive(endpoint, "delay-send", "rmq-delay-kill", "8")["sent"]
    half = drive(endpoint, "half-send", "rmq-tx-kill", "orphan-commit-after-failover")
    localcluster.kill(cluster.data_dir, rc.member(cluster, "broker-a", "master")["name"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    new = ""
    while time.monotonic() < deadline and not new:
        time.sleep(0.5)
        found = [
            m["rocketmq_endpoint"]
            for m in rc.members(cluster)
            if m["set"] == "broker-a" and m["role"] == "master" and m["rocketmq_endpoint"] != endpoint
        ]
        new = str(found[0]) if found else ""
    assert new, "no new master elected"
    got = drive(new, "receive", "rmq-delay-kill", "g-kill", "1", str(max(3.0, sent["at"] - time.time() + 4)))[
        "received"
    ]
    assert [(m["id"], m["body"]) for m in got] == [(sent["id"], "delayed-0")], "delivered once, as sent"
    assert got[0]["at"] >= sent["at"]

    checks = drive(new, "answer-checks", "rmq-tx-kill", str(2 * CHECK_INTERVAL_S + 1))["checks"]
    assert checks and {c["id"] for c in checks} == {half["id"]}, checks
    committed = drive(new, "receive", "rmq-tx-kill", "g-kill", "1", "3")["received"]
    assert [(m["id"], m["body"]) for m in committed] == [(half["id"], "orphan-commit-after-failover")]
