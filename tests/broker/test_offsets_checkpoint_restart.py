"""Brokers restarted after kill -9 start their group-offsets fold from its checkpoint
(broker/offsets.py) and answer every commit as before: those the checkpoint holds, and those
made after it, which the restart folds from the log."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import BrokerClient
from tidelog.broker.offsets import CHECKPOINT_FILE
from tidelog.broker.offsetscheckpoint import decode
from tidelog.errors import GroupLimitReachedError, InvalidArgumentError, UnavailableError
from tidelog.localcluster import wait_until
from tidelog.proto import broker_pb2 as pb

pytestmark = pytest.mark.slow


def fetched(client: BrokerClient, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
    """Every key's committed offset, once the restarted broker answers (its client's channel
    may still be in its reconnect backoff)."""

    def attempt() -> dict[tuple[str, int], int | None] | None:
        try:
            return {k: client.fetch(k[0], TOPIC, k[1]) for k in keys}
        except UnavailableError:
            return None

    return wait_until(attempt, 20, 0.1, what=f"{client.address} to answer fetches")


def test_a_restart_after_kill_9_starts_from_the_fold_checkpoint(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    bs = broker_cluster(2, offsets_checkpoint_interval_ms=200).bs
    master = bs.clients[bs.wait_master()]
    for q in range(QUEUES):  # commits stay within their queue
        master.produce(TOPIC, [b"m"] * 100, queue=q)
    committed: dict[tuple[str, int], int | None] = {}
    for g in range(6):
        for q in range(QUEUES):
            master.commit(f"g{g}", TOPIC, q, 10 * g + q)
            committed[(f"g{g}", q)] = 10 * g + q
    files = [d / CHECKPOINT_FILE for d in bs.data_dirs]

    def checkpointed() -> bool:
        # both replicas wrote a checkpoint holding every commit made so far
        cps = [decode(f.read_bytes()) if f.exists() else None for f in files]
        return all(cp is not None and len(cp.offsets) == len(committed) for cp in cps)

    wait_until(checkpointed, 20, 0.05, what="both replicas to checkpoint the fold")
    # after the checkpoint: new values, a new group, a delete
    for q in range(QUEUES):
        master.commit("g0", TOPIC, q, 90 + q)
        committed[("g0", q)] = 90 + q
    master.commit("late", TOPIC, 0, 7)
    committed[("late", 0)] = 7
    master._call("DeleteGroupOffsets", pb.DeleteGroupOffsetsRequest(group="g5"))
    for q in range(QUEUES):
        committed[("g5", q)] = None

    for p in bs.procs:
        p.kill9()
    for p in bs.procs:
        p.start()
    bs.wait_master(timeout=30)
    bs.wait_in_sync(2, timeout=30)
    for client in bs.clients:
        assert fetched(client, committed) == committed
    logs = bs.logs(tail=200_000)
    assert logs.count("commits from") >= 2, logs  # both replicas started from their checkpoint


def test_a_clean_stop_checkpoints_the_fold_for_the_next_start(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    # no periodic checkpoint: only the stop writes one
    bs = broker_cluster(2, offsets_checkpoint_interval_ms=0).bs
    master = bs.clients[bs.wait_master()]
    master.produce(TOPIC, [b"m"] * 20, queue=1)
    committed = {(f"g{g}", 1): g + 1 for g in range(8)}
    for (group, q), offset in committed.items():
        master.commit(group, TOPIC, q, offset)
    files = [d / CHECKPOINT_FILE for d in bs.data_dirs]
    assert not any(f.exists() for f in files)
    wait_until(lambda: all(c.fetch("g7", TOPIC, 1) == 8 for c in bs.clients), 10, 0.05, what="both to fold")
    for p in bs.procs:
        assert p.stop(timeout=15) == 0  # SIGTERM: a clean stop
    for f in files:
        cp = decode(f.read_bytes())
        assert cp is not None
        assert {(g, q): o for (g, _t, q), (o, _p) in cp.offsets.items()} == committed
    for p in bs.procs:
        p.start()
    bs.wait_master(timeout=30)
    bs.wait_in_sync(2, timeout=30)
    for client in bs.clients:
        assert fetched(client, committed) == committed
    assert bs.logs(tail=200_000).count("commits from") >= 2


def test_a_new_group_past_max_groups_is_refused_and_a_deleted_one_makes_room(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    bs = broker_cluster(1, max_groups=2).bs
    master = bs.clients[bs.wait_master()]
    master.produce(TOPIC, [b"m"] * 10, queue=0)
    master.commit("a", TOPIC, 0, 1)
    master.commit("b", TOPIC, 0, 2)
    with pytest.raises(GroupLimitReachedError, match="max_groups is 2"):
        master.commit("c", TOPIC, 0, 3)
    assert master.fetch("c", TOPIC, 0) is None
    master.commit("a", TOPIC, 0, 5)  # a group already here commits as before
    master._call("DeleteGroupOffsets", pb.DeleteGroupOffsetsRequest(group="b"))
    wait_until(lambda: master.fetch("b", TOPIC, 0) is None, 10, 0.05, what="the delete to be confirmed")
    master.commit("c", TOPIC, 0, 3)
    assert master.fetch("c", TOPIC, 0) == 3 and master.fetch("a", TOPIC, 0) == 5


def test_many_groups_commits_in_one_call_are_all_written_or_none(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    """`CommitOffsets`: every commit of the call lands, replicated like one; one that is refused
    (an offset past its queue's end, a group past max_groups) refuses the call and writes none."""
    bs = broker_cluster(2, max_groups=4).bs
    master = bs.clients[bs.wait_master()]
    for q in (0, 1):
        master.produce(TOPIC, [b"m"] * 10, queue=q)
    master.commit_many([("a", TOPIC, 0, 3), ("a", TOPIC, 1, 4), ("b", TOPIC, 0, 5), ("c", TOPIC, 1, 10)])
    want = {("a", 0): 3, ("a", 1): 4, ("b", 0): 5, ("c", 1): 10}
    assert {k: master.fetch(k[0], TOPIC, k[1]) for k in want} == want

    with pytest.raises(InvalidArgumentError, match="beyond the end"):
        master.commit_many([("a", TOPIC, 0, 7), ("b", TOPIC, 1, 11)])
    with pytest.raises(GroupLimitReachedError, match=r"max_groups is 4 \(2 new in this call\)"):
        master.commit_many([("a", TOPIC, 0, 8), ("d", TOPIC, 0, 1), ("e", TOPIC, 0, 1)])
    assert master.fetch("a", TOPIC, 0) == 3 and master.fetch("d", TOPIC, 0) is None  # none written

    # the slave holds the batch once it is in sync, as it holds any commit
    slave = next(c for i, c in enumerate(bs.clients) if i != bs.wait_master())
    bs.wait_in_sync(2, timeout=30)
    wait_until(
        lambda: {k: slave.fetch(k[0], TOPIC, k[1]) for k in want} == want, 10, 0.05, what="the slave's fold"
    )


def test_a_call_of_many_commits_fits_a_small_max_message_bytes(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    """A call's commits go in records of up to 64 KiB, fewer on a broker whose max_message_bytes
    is smaller: every commit of the call lands, and survives a restart that folds them again."""
    bs = broker_cluster(1, max_message_bytes=2048, offsets_checkpoint_interval_ms=0).bs
    master = bs.clients[bs.wait_master()]
    master.produce(TOPIC, [b"m"] * 10, queue=0)
    commits = [(f"group-{i:03d}", TOPIC, 0, i % 11) for i in range(300)]
    master.commit_many(commits)
    want = {(g, q): o for g, _, q, o in commits}
    assert fetched(master, want) == want
    bs.procs[0].kill9()  # no checkpoint either way: the restart folds the batch records
    bs.procs[0].start()
    assert fetched(bs.clients[0], want) == want
