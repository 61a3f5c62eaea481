"""A broker whose disk fills up loses nothing acknowledged, steps down, and comes back (hardening rows 5, 6).

Observed before: a full disk on the master answered raw `UNKNOWN: INTERNAL: ... [Errno 28]`, then
STORE_CLOSED forever; the broker stayed master (no failover), freeing space did not help, and a
restart failed because the checkpoint claimed consume-queue data the files did not hold. With
one replica and `flush: sync`, acknowledged messages were lost.

Each broker's data dir is its own small tmpfs, so ENOSPC is real; space is freed by removing a
filler file or growing the tmpfs (`mount -o remount,size=`).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import QUEUES, SET, TOPIC
from tests.brokers import BrokerSetProcs, create_topic, read_queues, status_of, wait_topic
from tests.procs import ControllerCluster, wait_until
from tests.tmpfs import fill, tmpfs
from tidelog.client import Client
from tidelog.errors import TidelogError

pytestmark = pytest.mark.slow

RETRYABLE = {
    "DISK_FULL",
    "STORE_ERROR",
    "UNAVAILABLE",
    "NOT_MASTER",
    "FLUSH_DISK_TIMEOUT",
    "FLUSH_SLAVE_TIMEOUT",
    "IN_SYNC_REPLICAS_NOT_ENOUGH",
    "SEND_FAILED",
}


@contextlib.contextmanager
def _cluster(
    root: Path, replicas: int, disk_mb: int, **options: object
) -> Iterator[tuple[ControllerCluster, BrokerSetProcs]]:
    (root / "controllers").mkdir(parents=True)
    cc = ControllerCluster(root / "controllers", 1)
    bs = BrokerSetProcs(root, SET, replicas, cc.address_list, **options)
    with contextlib.ExitStack() as mounts:
        for d in bs.data_dirs:
            mounts.enter_context(tmpfs(d, disk_mb << 20))
        try:
            cc.start()
            bs.start()
            create_topic(cc.address_list, TOPIC, {SET: QUEUES})
            bs.wait_master(timeout=20)
            wait_topic(bs, TOPIC)
            if replicas > 1:
                bs.wait_in_sync(replicas, timeout=20)
            yield cc, bs
        finally:
            bs.stop()
            cc.stop()


def _produce_until_refused(
    bs: BrokerSetProcs, index: int, acked: list[bytes], codes: set[str], limit_s: float = 60
) -> None:
    deadline = time.monotonic() + limit_s
    i = len(acked)
    failures = 0
    while time.monotonic() < deadline and failures < 5:
        bodies = [b"m-%06d-" % (i + k) + b"x" * 1000 for k in range(20)]
        try:
            bs.clients[index].produce(TOPIC, bodies, timeout=10)
        except TidelogError as exc:
            codes.add(exc.code)
            failures += 1
            time.sleep(0.2)
            continue
        acked.extend(bodies)
        i += len(bodies)


def produce_while(
    addresses: list[str], tag: bytes, seconds: float, done: Callable[[int, list[bytes]], bool]
) -> tuple[list[bytes], list[str]]:
    """Send one message at a time through a client for up to `seconds`, until `done(sent, acked)`
    after an acknowledged one: (the bodies acknowledged, the codes of the sends refused)."""
    acked: list[bytes] = []
    errors: list[str] = []
    with Client(addresses, send_timeout=30) as client:
        producer = client.producer()
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < seconds:
            body = tag + b"-%06d-" % n + b"w" * 1000
            n += 1
            try:
                producer.send(TOPIC, body)
            except TidelogError as exc:
                errors.append(exc.code)
                continue
            acked.append(body)
            if done(n, acked):
                break
    return acked, errors


def test_one_replica_with_sync_flush_loses_nothing_and_serves_again(tmp_path: Path) -> None:
    with _cluster(tmp_path, 1, 8, flush="sync", in_sync_replicas=1) as (_, bs):
        acked: list[bytes] = []
        codes: set[str] = set()
        _produce_until_refused(bs, 0, acked, codes)
        assert acked and codes, "the disk never filled"
        assert codes <= RETRYABLE and codes & {"DISK_FULL", "STORE_ERROR"}, codes
        assert bs.procs[0].alive(), "the broker exited instead of stepping down"
        # room again: the broker recovers in place (same process id) and is master again
        subprocess.run(["mount", "-o", "remount,size=64m", str(bs.data_dirs[0])], check=True)
        wait_until(
            lambda: (s := status_of(bs, 0)) is not None and s.role == "master",
            30,
            what="the broker to serve again after space was freed",
        )
        stored = {b for q in read_queues(bs.clients[0], TOPIC, QUEUES).values() for b in q}
        lost = [b for b in acked if b not in stored]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost"
        bs.clients[0].produce(TOPIC, [b"after-the-disk-was-freed"])


def test_the_master_of_two_steps_down_and_rejoins(tmp_path: Path) -> None:
    with _cluster(tmp_path, 2, 64, flush="sync") as (cc, bs):
        old = bs.wait_master()
        new = 1 - old
        filler = fill(bs.data_dirs[old], leave_bytes=600 << 10)

        def elected(n: int, acked: list[bytes]) -> bool:
            s = status_of(bs, new)
            return s is not None and s.role == "master" and len(acked) > 50 and n % 20 == 0

        acked, errors = produce_while(cc.address_list, b"k", 40, elected)
        assert (s := status_of(bs, new)) is not None and s.role == "master", "the slave was not elected"
        assert bs.procs[old].alive(), "the old master exited instead of stepping down"
        stored = {b for q in read_queues(bs.clients[new], TOPIC, QUEUES).values() for b in q}
        lost = [b for b in acked if b not in stored]
        assert not lost, (
            f"{len(lost)} of {len(acked)} acknowledged messages lost (errors seen: {set(errors)})"
        )
        # room again: the old master recovers in place and follows the new one
        filler.unlink()
        end = bs.clients[new].status().max_offset
        wait_until(
            lambda: (s := status_of(bs, old)) is not None and s.role == "slave" and s.max_offset >= end,
            40,
            what="the old master to rejoin as a slave and catch up",
        )
