"""Ledger recovery over real processes: a writer process dies or stalls mid-stream, another
client recovers the ledger; recovery never closes below an acknowledged entry.

The writer (`tests/broker/ledger_writer.py`) records every acknowledged id durably before its
next add, so `acked ⊆ [0, recovered end]` is checked against what the writer really saw, and
every recovered entry must read back byte-identical to what it wrote.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.broker.conftest import SET, BrokerCluster
from tests.broker.ledger_writer import PASSWORD, payload
from tests.brokers import BrokerSetProcs
from tests.procs import ControllerCluster, free_address, wait_until
from tidelog.client import Client
from tidelog.errors import LedgerRecoveryError, NotEnoughBookiesError, TidelogError, UnauthorizedAccessError
from tidelog.ledger import Ledgers

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: The recoveries that are expected to abort (AQ = 2 with one replica dead or empty) try to
#: rewrite for one RPC timeout: 1.5 s here instead of the client's 10 s, the outcome is the same
#: (a recovery that gives up early aborts retryably; one that completes must not close short).
RECOVERY_RPC_S = 1.5


class Writer:
    def __init__(self, controllers: str, out: Path, aq: int = 2) -> None:
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.broker.ledger_writer", controllers, str(out), str(aq)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    def ledger_id(self) -> int:
        ids = [int(x.split()[1]) for x in self.lines() if x.startswith("ledger ")]
        assert ids, "the writer did not create its ledger"
        return ids[0]

    def acked(self) -> list[int]:
        return [int(x.split()[1]) for x in self.lines() if x.startswith("acked ")]

    def errors(self) -> list[str]:
        return [x.split()[1] for x in self.lines() if x.startswith("error ")]

    def wait_acked(self, n: int, timeout: float = 30.0) -> None:
        def enough() -> bool:
            assert self.proc.poll() is None, f"the writer exited: {self.proc.stderr.read().decode()[-3000:]}"  # type: ignore[union-attr]
            return len(self.acked()) >= n

        wait_until(enough, timeout, 0.1, what=f"{n} acknowledged entries")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a SIGSTOPped process too
        self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def start_writer(tmp_path: Path) -> Iterator[Callable[[str, int], Writer]]:
    """`start_writer(controllers, n)`: a writer process that has seen `n` acknowledgements."""
    started: list[Writer] = []

    def start(controllers: str, acked: int) -> Writer:
        w = Writer(controllers, tmp_path / f"writer{len(started)}.txt")
        started.append(w)
        w.wait_acked(acked)
        return w

    yield start
    for w in started:
        w.kill()


@pytest.fixture(scope="module")
def whole_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    """One controller and broker set broker-a of two replicas, shared by the tests that leave every
    broker running (each writes a ledger of its own)."""
    root: Path = tmp_path_factory.mktemp("ledgers")
    (root / "controllers").mkdir()
    cc = ControllerCluster(root / "controllers", 1)
    bs = BrokerSetProcs(root, SET, 2, cc.address_list)
    try:
        cc.start()
        bs.start()
        bs.wait_master(timeout=20)
        bs.wait_in_sync(2, timeout=20)
        yield BrokerCluster(cc, bs)
    finally:
        bs.stop()
        cc.stop()


@pytest.fixture
def cluster(whole_cluster: BrokerCluster, request: pytest.FixtureRequest) -> Iterator[BrokerCluster]:
    """The module's cluster, whole; its logs are shown when the test failed."""
    whole_cluster.bs.wait_in_sync(2, timeout=30)
    yield whole_cluster
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed:
        print(whole_cluster.bs.logs())
        print(whole_cluster.cc.logs())


def _recover(controllers: str, ledger_id: int, attempts_s: float = 60.0) -> Any:
    """Recovery open, retried while it aborts retryably; returns the read handle."""
    deadline = time.monotonic() + attempts_s
    with Client(controllers) as client:
        while True:
            try:
                handle = Ledgers(client).open_ledger(ledger_id, PASSWORD, recovery=True)
                entries = (
                    handle.read_entries(0, handle.last_add_confirmed)
                    if handle.last_add_confirmed >= 0
                    else []
                )
                return handle.last_add_confirmed, [(e.entry_id, e.data) for e in entries]
            except (LedgerRecoveryError, NotEnoughBookiesError) as exc:
                if time.monotonic() > deadline:
                    raise
                print("recovery aborted, retrying:", exc)
                time.sleep(0.5)


def _check(writer: Writer, end: int, entries: list[tuple[int, bytes]]) -> None:
    acked = writer.acked()
    assert acked == list(range(len(acked))), "the writer saw acknowledgements out of order"
    assert acked and end >= acked[-1], f"recovery closed at {end}, below acknowledged entry {acked[-1]}"
    assert [e for e, _ in entries] == list(range(end + 1))
    for e, data in entries:
        assert data == payload(e), f"entry {e} reads back different bytes"


def test_stalled_writer_is_fenced_and_recovery_keeps_every_ack(
    cluster: BrokerCluster, start_writer: Callable[[str, int], Writer]
) -> None:
    c = cluster
    w = start_writer(c.controllers, 40)
    os.kill(w.proc.pid, signal.SIGSTOP)
    end, entries = _recover(c.controllers, w.ledger_id())
    os.kill(w.proc.pid, signal.SIGCONT)
    w.proc.wait(30)
    # the writer's next add after the recovery fails, fenced (BookKeeper's LedgerFencedException)
    assert w.errors() == ["LEDGER_FENCED"], w.lines()[-5:]
    _check(w, end, entries)  # after the writer exited: an add in flight at SIGSTOP may have been acked
    # recovering a CLOSED ledger again changes nothing
    again_end, again = _recover(c.controllers, w.ledger_id())
    assert (again_end, again) == (end, entries)


def test_killed_writer_recovered_while_master_is_killed(
    broker_cluster: Callable[..., Any], start_writer: Callable[[str, int], Writer]
) -> None:
    c = broker_cluster(2)
    w = start_writer(c.controllers, 30)
    w.kill()
    ledger_id = w.ledger_id()
    m = c.bs.wait_master()
    # kill the master while the recovery runs: it completes after the failover, or aborts retryably
    # (with AQ = 2 of 2 it cannot rewrite until the old master is back), never closes short
    with Client(c.controllers) as client:
        outcome: dict[str, Any] = {}

        def recover() -> None:
            try:
                # a rewrite that cannot be confirmed gives up after RECOVERY_RPC_S, not 10 s
                h = Ledgers(client, rpc_timeout=RECOVERY_RPC_S).open_ledger(
                    ledger_id, PASSWORD, recovery=True
                )
                outcome["end"] = h.last_add_confirmed
            except TidelogError as exc:
                outcome["error"] = exc

        t = threading.Thread(target=recover)
        t.start()
        time.sleep(0.05)
        c.bs.procs[m].kill9()
        t.join(90)
        assert not t.is_alive()
    if "error" in outcome:
        assert getattr(outcome["error"], "retryable", False), f"not retryable: {outcome['error']!r}"
    c.bs.procs[m].start()
    end, entries = _recover(c.controllers, ledger_id, attempts_s=90)
    if "end" in outcome:
        assert outcome["end"] == end
    _check(w, end, entries)


@pytest.mark.parametrize("same_id", [False, True], ids=["new-identity", "kept-identity"])
def test_wiped_replica_does_not_make_recovery_close_short(
    broker_cluster: Callable[..., Any], start_writer: Callable[[str, int], Writer], same_id: bool
) -> None:
    c = broker_cluster(2)
    w = start_writer(c.controllers, 30)
    w.kill()
    m = c.bs.wait_master()
    # The master loses its disk. The slave takes over, and knows the LAC only as carried by the
    # entries (one behind the last acknowledged). The old master comes back empty: as a new broker
    # (its identity went with the disk), or under its old id (identity restored), which is the
    # dangerous case: a replica of the ensemble whose log lacks entries it once held must answer
    # "I cannot tell", never "no such entry", or recovery would close below an acknowledged entry.
    c.bs.procs[m].kill9()
    identity = (c.bs.data_dirs[m] / "identity.json").read_bytes()
    shutil.rmtree(c.bs.data_dirs[m])
    c.bs.wait_master(exclude=m, timeout=30)
    if same_id:
        c.bs.data_dirs[m].mkdir(mode=0o700)  # a broker refuses a data dir others can read
        (c.bs.data_dirs[m] / "identity.json").write_bytes(identity)
        # First it comes back cut off from the controller, so it stays empty while it answers
        # ledger requests under its old id: a recovery now must not close short (with AQ = 2 it
        # cannot rewrite either, so it aborts retryably).
        cfg = c.bs.root / f"{c.bs.name}-{m}.yaml"
        good = cfg.read_text()
        doc = yaml.safe_load(good)
        doc["controllers"] = free_address()
        cfg.write_text(yaml.safe_dump(doc))
        c.bs.procs[m].start()
        wait_until(lambda: c.bs.clients[m].status(timeout=1.0) is not None, 20, 0.2, what="the empty replica")
        with Client(c.controllers) as client:
            try:
                ledgers = Ledgers(client, rpc_timeout=RECOVERY_RPC_S)
                h = ledgers.open_ledger(w.ledger_id(), PASSWORD, recovery=True)
                early_end = h.last_add_confirmed
            except (LedgerRecoveryError, NotEnoughBookiesError):
                early_end = None
        if early_end is not None:
            assert early_end >= w.acked()[-1], f"recovery closed at {early_end}, below an acknowledged entry"
        # stopped while it still retries its registration with the unreachable controller
        assert c.bs.procs[m].stop(timeout=10) == 0
        cfg.write_text(good)
    c.bs.procs[m].start()
    end, entries = _recover(c.controllers, w.ledger_id(), attempts_s=90)
    _check(w, end, entries)


def test_recovery_with_wrong_password_fences_nothing(
    cluster: BrokerCluster, start_writer: Callable[[str, int], Writer]
) -> None:
    c = cluster
    w = start_writer(c.controllers, 10)
    with Client(c.controllers) as client, pytest.raises(UnauthorizedAccessError):
        Ledgers(client).open_ledger(w.ledger_id(), b"not-the-password", recovery=True)
    before = len(w.acked())
    w.wait_acked(before + 10)  # the writer goes on: nothing was fenced
    assert w.errors() == []
    assert w.proc.poll() is None
