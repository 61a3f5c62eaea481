"""The narrow ports (broker/ports.py): the ledger, shared-subscription and retention shells name
only the port they use, never the whole Replica, and a real Replica provides every port."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tidelog.broker import config
from tidelog.broker.ports import ConfirmWaits, LedgerHost, RetentionHost, SharedHost, WritePath
from tidelog.broker.replica import Replica
from tidelog.commitlog import CommitLog

BROKER = Path(__file__).resolve().parents[2] / "broker"
SHELLS = {"ledgers.py": "LedgerHost", "shared.py": "SharedHost", "retention.py": "RetentionHost"}


def _replica(tmp_path: Path) -> tuple[Replica, CommitLog]:
    cfg = config.from_mapping(
        {
            "broker_set": "broker-a",
            "data_dir": str(tmp_path),
            "controllers": "127.0.0.1:1",
            "secret": "a-real-secret-for-the-tests-0123456789",
            "flush": "sync",
        }
    )
    log = CommitLog.open(tmp_path, segment_bytes=1 << 20, flush="sync")
    return Replica(cfg, log, broker_id=1), log


def test_a_replica_provides_every_port(tmp_path: Path) -> None:
    replica, log = _replica(tmp_path)
    try:
        for port in (WritePath, ConfirmWaits, LedgerHost, SharedHost, RetentionHost):
            assert isinstance(replica, port), port.__name__
        assert not isinstance(object(), WritePath)
    finally:
        log.close()


@pytest.mark.parametrize("module", sorted(SHELLS))
def test_a_shell_names_its_port_and_not_the_replica(module: str) -> None:
    tree = ast.parse((BROKER / module).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert "Replica" not in names and "Replica" not in imported
    assert "tidelog.broker.replica" not in imported
    assert SHELLS[module] in names | imported
