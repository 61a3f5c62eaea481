"""A slave whose log fails its checksums is not elected over a healthy member (docs/SECURITY.md,
probe 7; broker/scrub.py).

Real processes: a controller and a broker set of three. The master is paused (SIGSTOP: it cannot
send the damaged slave its copy of the range) and a byte is flipped in a slave's segment. Of the
two slaves, both in the SyncStateSet with the same epoch and log, the controller would elect the
lower broker id: the damaged one is that one. Before, nothing found the damage until a read met
it, and the damaged slave became master. Now its scrub finds the damage and its heartbeats carry
the worst election priority, so the healthy slave is elected; the damaged one then repairs the
range from it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.broker.conftest import TOPIC, BrokerCluster, broker_cluster  # noqa: F401 (a fixture)
from tests.brokers import pause, status_of
from tests.procs import wait_until

pytestmark = pytest.mark.slow

N = 300
AT = 100_000  # inside some record's body in the first segment
ELECTION_TIMEOUT_MS = 8000  # long enough for the scrub (every second) to find the damage first


def test_a_damaged_slave_is_not_elected_over_a_healthy_one(
    broker_cluster: Callable[..., BrokerCluster],  # noqa: F811
) -> None:
    cluster = broker_cluster(
        3,
        controller_options={"heartbeat_timeout_ms": ELECTION_TIMEOUT_MS},
        scrub_bytes_per_s=64 << 20,
    )
    bs = cluster.bs
    master = bs.wait_in_sync(3)
    for start in range(0, N, 50):
        bs.clients[master].produce(TOPIC, [b"m-%05d-" % i + b"z" * 1000 for i in range(start, start + 50)])
    end = bs.clients[master].status().max_offset
    slaves = [i for i in range(3) if i != master]

    def settled(i: int) -> bool:
        s = status_of(bs, i)
        return s is not None and s.confirm_offset == end and s.flushed_offset == end

    wait_until(lambda: all(settled(i) for i in slaves), 15, what="both slaves to hold, flush and confirm all")
    ids = {i: bs.clients[i].status().broker_id for i in slaves}
    damaged, healthy = sorted(slaves, key=lambda i: ids[i])  # a tie goes to the lower id
    victim = sorted((bs.data_dirs[damaged] / "commitlog").iterdir())[0]
    assert victim.stat().st_size > AT

    pause(bs.procs[master])  # resumed by the fixture at teardown
    with open(victim, "r+b") as f:  # under the running slave: its reads see the page cache
        f.seek(AT)
        byte = f.read(1)
        f.seek(AT)
        f.write(bytes([byte[0] ^ 0xFF]))
    log_path = bs.procs[damaged].log_path
    wait_until(
        lambda: "corrupt record in" in log_path.read_text(errors="replace"),
        ELECTION_TIMEOUT_MS / 1000 - 2,
        what="the damaged slave's scrub to find the flipped byte",
    )
    new = bs.wait_master(timeout=30, exclude=master)
    assert new == healthy, f"broker {ids[new]} (damaged) was elected over broker {ids[healthy]}"

    # the damaged replica, now the new master's slave, repairs the range from it
    good = (bs.data_dirs[healthy] / "commitlog" / victim.name).read_bytes()[AT - 2048 : AT + 2048]
    wait_until(
        lambda: victim.read_bytes()[AT - 2048 : AT + 2048] == good,
        30,
        what="the damaged replica to repair the range from the new master",
    )
    # and it counts as healthy again (its heartbeats carry its own priority once more)
    wait_until(
        lambda: "is whole again" in log_path.read_text(errors="replace"),
        15,
        what="the repaired replica's scrub to find the range whole",
    )
