"""Disk full on one replica only, the master (docs/SECURITY.md, probe 12; docs/ARCHITECTURE.md
§3.9): sends to it get a typed error at once (no hang), the broker process survives and steps
down, the slave is elected with everything acknowledged, and once space returns the old master
recovers in place, catches up, and takes writes on its own disk again when it is elected.

Each broker's data dir is its own small tmpfs (tests/tmpfs.py: needs root, else skipped), so
ENOSPC is real; the master's is filled to 600 KiB free while the slave's has room."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.broker.conftest import QUEUES, TOPIC
from tests.broker.test_disk_full import _cluster
from tests.brokers import BrokerSetProcs, read_queues, status_of
from tests.procs import wait_until
from tests.tmpfs import fill
from tidelog.errors import TidelogError

pytestmark = pytest.mark.slow

# what a send to a master whose disk filled may answer: the store's refusal, then its port closed
TYPED = {"DISK_FULL", "STORE_ERROR", "NOT_MASTER", "UNAVAILABLE"}


def _stored(bs: BrokerSetProcs, i: int) -> set[bytes]:
    return {b for q in read_queues(bs.clients[i], TOPIC, QUEUES).values() for b in q}


def _send_until_refused(
    bs: BrokerSetProcs, i: int, limit_s: float = 60
) -> tuple[list[bytes], list[TidelogError]]:
    """Batches of 20 1 KiB messages straight to replica `i` until three are refused: (the bodies
    acknowledged, the refusals)."""
    acked: list[bytes] = []
    refused: list[TidelogError] = []
    deadline = time.monotonic() + limit_s
    n = 0
    while time.monotonic() < deadline and len(refused) < 3:
        bodies = [b"full-%06d-" % (n + k) + b"x" * 1000 for k in range(20)]
        n += len(bodies)
        try:
            bs.clients[i].produce(TOPIC, bodies, timeout=10)
        except TidelogError as exc:
            refused.append(exc)
            continue
        acked.extend(bodies)
    return acked, refused


def test_a_full_disk_on_the_master_refuses_sends_and_loses_nothing(tmp_path: Path) -> None:
    with _cluster(tmp_path, 2, 64, flush="sync") as (_, bs):
        old = bs.wait_in_sync(2)
        new = 1 - old
        pid = bs.procs[old].pid
        filler = fill(bs.data_dirs[old], leave_bytes=600 << 10)

        acked, refused = _send_until_refused(bs, old)
        assert acked and refused, "the master's disk never filled"
        seen = [(e.code, e.message) for e in refused]
        # typed, and none a deadline (a send that hung until the client gave up)
        assert all(e.code in TYPED and "DEADLINE_EXCEEDED" not in e.message for e in refused), seen
        assert refused[0].code in {"DISK_FULL", "STORE_ERROR"}, seen
        assert bs.procs[old].alive() and bs.procs[old].pid == pid, "the master exited"
        assert "the store failed" in bs.procs[old].log_path.read_text(errors="replace")

        # it gave mastership up: the slave is elected holding everything acknowledged
        assert bs.wait_master(timeout=30, exclude=old) == new
        assert status_of(bs, old) is None, "the failed master still answers"
        # the replica's queues are read once, not once per acknowledged body (hundreds of them)
        on_new = _stored(bs, new)
        lost = [b for b in acked if b not in on_new]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost in the failover"
        during = [b"during-%03d" % i for i in range(50)]
        bs.clients[new].produce(TOPIC, during)

        # room again: the old master recovers in place (same process), follows and catches up
        filler.unlink()
        end = bs.clients[new].status().max_offset
        wait_until(
            lambda: (s := status_of(bs, old)) is not None and s.role == "slave" and s.max_offset >= end,
            40,
            what="the old master to recover and catch up as a slave",
        )
        assert bs.procs[old].pid == pid
        bs.wait_in_sync(2, timeout=30)

        # and its own disk takes writes again once it is master
        bs.procs[new].stop()
        assert bs.wait_master(timeout=30) == old
        after = [b"after-%03d" % i for i in range(50)]
        bs.clients[old].produce(TOPIC, after, timeout=10)
        on_old = _stored(bs, old)
        missing = [b for b in [*acked, *during, *after] if b not in on_old]
        assert not missing, f"{len(missing)} acknowledged messages missing on the recovered replica"
