"""Delayed and transactional messages of the official RocketMQ client, against the brokers'
RocketMQ endpoint of a cluster started by `tide cluster up` (broker/rocketmqtx.py): two broker
sets of two replicas, every topic with queues in both (tests/client/rocketmq_cluster.py). The
client runs in its own process (tests/client/rocketmq_tx_driver.py). The last test kills the master.

The cluster checks orphaned transactions after 3 s (`rocketmq_tx_check_interval_ms`), so the
tests see checks without waiting for the production default of 30 s. A driver stops once what it
waits for came, after a quiet period (`QUIET_S`, or a check interval where a check could follow)
in which what must not come would have come."""

from __future__ import annotations

import signal
import sys
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
#: Past what a driver waited for: a second copy, or a recalled message, is moved by the master's
#: loop within a tick (0.2 s) of its time and then answers a waiting receive (long polls of 1 s).
QUIET_S = 1.5


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


@pytest.fixture(scope="module")
def members(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """broker-a's master and slave as `tide cluster status` names them, looked up once (each
    lookup runs the CLI): the roles hold until the last test kills the master."""
    return {role: rc.member(cluster, "broker-a", role) for role in ("master", "slave")}


def master_endpoint(members: dict[str, dict[str, Any]]) -> str:
    return str(members["master"]["rocketmq_endpoint"])


create_topic = rc.create_topic


def test_delayed_messages_are_received_no_earlier_than_asked_and_once(
    cluster: LocalCluster, members: dict[str, dict[str, Any]]
) -> None:
    endpoint = master_endpoint(members)
    # one broker set (8 queues): a receive waits on the set it names, so each message is seen as
    # it becomes due rather than when the consumer's turn comes back to its set
    rc.create_topic_in(cluster, "rmq-delay", "broker-a", queues=8)
    # the longest first: it must not hold back the shorter ones behind it
    out = drive(endpoint, "delay-receive", "rmq-delay", "g-delay", str(QUIET_S), "4", "2", "3")
    sent = out["sent"]
    assert out["too_far"].startswith("40012"), out["too_far"]  # ILLEGAL_DELIVERY_TIME, not stored
    got = out["received"]
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
    cluster: LocalCluster, members: dict[str, dict[str, Any]]
) -> None:
    create_topic(cluster, "rmq-recall")
    out = drive(master_endpoint(members), "recall", "rmq-recall", str(QUIET_S))
    first, second = out["sent"]
    assert first["handle"] and second["handle"]
    assert out["first"] == first["id"]  # recall_message answers the recalled message's id
    # received until past both delivery times and a quiet period: the recalled one never came
    assert out["received"] == [second["id"]], "the recalled one never comes; the other once"
    # RocketMQ's answer to a late recall: INTERNAL_SERVER_ERROR, "recall failed, timestamp invalid"
    assert "recall failed, timestamp invalid" in out["late"] and "50001" in out["late"], out["late"]


def test_delayed_messages_of_a_topic_in_another_broker_set_are_kept_and_recalled_there(
    cluster: LocalCluster, members: dict[str, dict[str, Any]]
) -> None:
    """The client's endpoint is in broker-a, the topic only in broker-b: the endpoint passes the
    SendMessage and the RecallMessage on to broker-b's master, which keeps the message."""
    rc.create_topic_in(cluster, "rmq-recall-b", "broker-b", queues=4)
    out = drive(master_endpoint(members), "recall", "rmq-recall-b", str(QUIET_S))
    first, second = out["sent"]
    assert first["id"].startswith("broker-b:") and second["id"].startswith("broker-b:")
    assert out["first"] == first["id"]
    assert out["received"] == [second["id"]]
    assert "delivered (or recalled) already" in out["late"], out["late"]


def test_transactions_commit_rollback_and_orphans_checked_back(
    cluster: LocalCluster, members: dict[str, dict[str, Any]]
) -> None:
    endpoint = master_endpoint(members)
    create_topic(cluster, "rmq-tx")
    create_topic(cluster, "rmq-tx-other")
    # first the refused sends and ends, and a half message ended by a raw ROLLBACK: the
    # transactions' driver below then runs past this half's first check, and its producer is the
    # one such a check would go to
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
    # the producer and a consumer stay until its two orphans were checked (3 s) and the committed
    # messages came, then a check interval more: a rolled-back message would be checked again or
    # delivered within it
    out = drive(endpoint, "transactions", "rmq-tx", "g-tx", str(CHECK_INTERVAL_S + 1))
    checked = {c["body"]: c for c in out["checks"]}
    # the raw-rolled-back half is never checked: its ROLLBACK was stored
    assert sorted(checked) == ["orphan-commit", "orphan-rollback"], out["checks"]
    # and each orphan once: its checker's answer settled it before a second check was due
    assert len(out["checks"]) == 2, out["checks"]
    for body, c in checked.items():
        assert c["id"] == out[body]["id"], "the checker gets the message id its producer was given"
        assert c["at"] >= out["sent_at"] + CHECK_INTERVAL_S - 1
    # a rolled-back message never comes, and none of the refused sends and ends stored anything
    got = out["received"]
    assert sorted((m["body"], m["id"], m["attempt"]) for m in got) == [
        ("commit", out["commit"]["id"], 1),
        ("orphan-commit", out["orphan-commit"]["id"], 1),
    ]
    assert {m["body"]: m["keys"] for m in got} == {
        "commit": ["tk-commit"],
        "orphan-commit": ["tk-orphan-commit"],
    }


def test_delayed_and_half_messages_survive_a_master_killed_before_they_are_due(
    cluster: LocalCluster, members: dict[str, dict[str, Any]]
) -> None:
    """Runs last: it leaves the cluster with one replica. A delayed message not due yet and an
    orphaned half message are kept by the master, which is killed; the new master delivers the
    first at its time and checks the second with a producer connected to it, once each."""
    endpoint, victim, survivor = master_endpoint(members), members["master"]["name"], members["slave"]
    create_topic(cluster, "rmq-delay-kill")
    create_topic(cluster, "rmq-tx-kill")
    # the half message first, then the delayed one (4 s ahead), so that it is not due at the kill
    kept = drive(endpoint, "keep", "rmq-delay-kill", "4", "rmq-tx-kill", "orphan-commit-after-failover")
    (sent,), half = kept["sent"], kept["half"]
    localcluster.kill(cluster.data_dir, victim, signal.SIGKILL)
    assert time.time() < sent["at"], "the delayed message was due before its master was killed"
    # a producer answering checks and a consumer of both topics, on the endpoint of the replica
    # that is to be master, from the kill on (no check could be answered before it)
    command = [sys.executable, str(DRIVER), survivor["rocketmq_endpoint"], "answer-and-receive"]
    args = ["rmq-tx-kill", "g-kill", "2", str(QUIET_S), "rmq-delay-kill", "rmq-tx-kill"]
    with rc.driver_run(command + args) as driver:
        out = rc.driver_output(driver)
    # what the driver received and the check it answered came from the survivor as master
    assert rc.master_of(cluster) == survivor["name"], "no new master elected"
    got = out["received"]
    assert sorted((m["topic"], m["id"], m["body"]) for m in got) == [
        ("rmq-delay-kill", sent["id"], "delayed-0"),  # delivered once, as sent
        ("rmq-tx-kill", half["id"], "orphan-commit-after-failover"),  # committed once, by its check
    ]
    delayed = next(m for m in got if m["topic"] == "rmq-delay-kill")
    assert delayed["at"] >= sent["at"]
    checks = out["checks"]
    assert checks and {c["id"] for c in checks} == {half["id"]}, checks
    # while the new master took its role, the endpoint answered receives as empty (the client
    # asks again), never with an error the client raises to the application
    assert out["receive_errors"] == [], out["receive_errors"]
