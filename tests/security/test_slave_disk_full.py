"""Disk full on one replica only, the slave (docs/SECURITY.md, probe 8): while a producer runs,
the slave's store fails and it steps down, the master leaves it out of the SyncStateSet and goes
on acknowledging, nothing acknowledged is lost, and the slave catches up once space returns.

Each broker's data dir is its own small tmpfs (tests/tmpfs.py: needs root, else skipped), so
ENOSPC is real; the slave's is filled to 600 KiB free while the master's has room."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.conftest import QUEUES, TOPIC
from tests.broker.test_disk_full import _cluster, produce_while
from tests.brokers import read_queues, status_of
from tests.procs import wait_until
from tests.tmpfs import fill

pytestmark = pytest.mark.slow

AFTER = 200  # messages acknowledged after the slave left, by the master alone


def test_a_full_disk_on_the_slave_leaves_the_master_serving(tmp_path: Path) -> None:
    with _cluster(tmp_path, 2, 64, flush="sync") as (cc, bs):
        master = bs.wait_in_sync(2)
        slave = 1 - master
        master_id = bs.clients[master].status().broker_id
        filler = fill(bs.data_dirs[slave], leave_bytes=600 << 10)
        left_at: int | None = None

        def master_alone_then_more(n: int, acked: list[bytes]) -> bool:
            nonlocal left_at
            if left_at is None and n % 20 == 0:
                s = status_of(bs, master)
                if s is not None and list(s.sync_state_set) == [master_id]:
                    left_at = len(acked)
            return left_at is not None and len(acked) >= left_at + AFTER

        acked, errors = produce_while(cc.address_list, b"d", 60, master_alone_then_more)
        assert left_at is not None, f"the slave never left the SyncStateSet (errors: {set(errors)})"
        assert len(acked) >= left_at + AFTER, f"the master stopped acknowledging (errors: {set(errors)})"
        s = status_of(bs, master)
        assert s is not None and s.role == "master", "the master lost its role over the slave's disk"
        assert bs.procs[slave].alive(), "the slave exited instead of stepping down"
        assert "the store failed" in bs.procs[slave].log_path.read_text(errors="replace"), "no ENOSPC met"
        stored = {b for q in read_queues(bs.clients[master], TOPIC, QUEUES).values() for b in q}
        lost = [b for b in acked if b not in stored]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost"

        filler.unlink()  # room again: the slave recovers in place and catches up
        end = bs.clients[master].status().max_offset
        wait_until(
            lambda: (t := status_of(bs, slave)) is not None and t.role == "slave" and t.max_offset >= end,
            40,
            what="the slave to recover and catch up",
        )
        bs.wait_in_sync(2, timeout=30)
        copied = {b for q in read_queues(bs.clients[slave], TOPIC, QUEUES).values() for b in q}
        assert not [b for b in acked if b not in copied], "the recovered slave lacks acknowledged messages"
