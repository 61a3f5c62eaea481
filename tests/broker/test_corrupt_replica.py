"""A flipped byte in a replica's older segment: readers fall back, the replica repairs it (hardening row 7).

Observed before: one byte flipped in an older segment of the slave, slave restarted: it started
cleanly (recovery scans only from the checkpoint), readers got CORRUPT_RECORD from the slave and
did not try the master: 1,000 acknowledged messages unreadable through the client.
Now the client reads the range from another replica, the slave asks its master for that range
and rewrites it in place, and `tide broker verify` names the damage before and none after. A
damaged master asks a slave that holds the range for its copy and stays master.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import procs
from tests.broker.conftest import QUEUES, TOPIC, BrokerCluster
from tests.brokers import status_of, wait_topic
from tests.procs import wait_until
from tidelog.client import Client
from tidelog.errors import CorruptRecordError

pytestmark = pytest.mark.slow

N = 1500


def _verify(data_dir: Path) -> tuple[int, dict]:
    done = procs.tide("broker", "verify", "--data-dir", str(data_dir), "--json", timeout=60)
    return done.returncode, json.loads(done.stdout)


def test_a_damaged_slave_is_read_around_and_repaired(broker_cluster: Callable[..., BrokerCluster]) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()
    slave = 1 - master
    bodies = {i: b"msg-%05d-" % i + bytes([65 + i % 26]) * 1000 for i in range(N)}
    for start in range(0, N, 50):
        bs.clients[master].produce(TOPIC, [bodies[i] for i in range(start, start + 50)], queue=0)
    end = bs.clients[master].status().max_offset
    wait_until(
        lambda: (s := status_of(bs, slave)) is not None and s.confirm_offset == end,
        15,
        what="the slave to hold and confirm everything",
    )
    segs = sorted((bs.data_dirs[slave] / "commitlog").iterdir())
    assert len(segs) >= 2, "the test needs an older segment"
    victim = segs[0]
    bs.procs[slave].stop()
    data = bytearray(victim.read_bytes())
    at = 300_000  # inside some record's body in the first segment
    data[at] ^= 0xFF
    victim.write_bytes(bytes(data))
    code, report = _verify(bs.data_dirs[slave])
    assert code == 1 and report["damaged"], report
    damage = report["damaged"][0]
    assert damage["path"].endswith(victim.name) and damage["start"] <= at < damage["end"]

    bs.procs[slave].start()
    wait_topic(bs, TOPIC, [slave], timeout=20)
    wait_until(
        lambda: (s := status_of(bs, slave)) is not None and s.role == "slave", 20, what="the slave back"
    )
    with Client(cluster.controllers) as client:
        reader = client.reader(TOPIC, 0, 0)
        got: list[bytes] = []
        while len(got) < N:
            batch = reader.read(max_messages=500, timeout=1.0)
            assert batch, f"the reader stalled at {len(got)}"
            got.extend(m.body for m in batch)
    assert got == [bodies[i] for i in range(N)]

    master_bytes = (bs.data_dirs[master] / "commitlog" / victim.name).read_bytes()
    wait_until(
        lambda: (
            victim.read_bytes()[damage["start"] : damage["end"]]
            == master_bytes[damage["start"] : damage["end"]]
        ),
        20,
        what="the slave to repair the damaged range",
    )
    direct = bs.clients[slave].pull_all(TOPIC, 0)
    assert [m.body for m in direct] == [bodies[i] for i in range(N)]
    bs.procs[slave].stop()
    code, report = _verify(bs.data_dirs[slave])
    assert code == 0 and not report["damaged"] and report["records"] >= N
    assert QUEUES >= 1


def test_a_damaged_master_repairs_from_its_slave_and_stays_master(
    broker_cluster: Callable[..., BrokerCluster],
) -> None:
    cluster = broker_cluster(2)
    bs = cluster.bs
    master = bs.wait_master()
    slave = 1 - master
    bodies = [b"m-%05d-" % i + b"q" * 1000 for i in range(N)]
    for start in range(0, N, 50):
        bs.clients[master].produce(TOPIC, bodies[start : start + 50], queue=0)
    end = bs.clients[master].status().max_offset
    epoch = bs.clients[master].status().master_epoch
    wait_until(
        lambda: (s := status_of(bs, slave)) is not None and s.confirm_offset == end,
        15,
        what="the slave to hold and confirm everything",
    )
    victim = sorted((bs.data_dirs[master] / "commitlog").iterdir())[0]
    with open(victim, "r+b") as f:  # damage under the running master (its reads see the page cache)
        f.seek(300_000)
        byte = f.read(1)
        f.seek(300_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    # the read that meets the damage is refused, and the master asks its slave for the range
    with pytest.raises(CorruptRecordError, match=r"being repaired from slave \d+'s copy"):
        bs.clients[master].pull_all(TOPIC, 0)

    def repaired() -> bool:
        try:
            return [m.body for m in bs.clients[master].pull_all(TOPIC, 0)] == bodies
        except CorruptRecordError:
            return False

    wait_until(repaired, 20, what="the master to repair its damaged range from the slave's copy")
    s = bs.clients[master].status()
    assert (s.role, s.master_epoch) == ("master", epoch), "the master gave its role up instead of repairing"
