"""The narrow ports (broker/ports.py): the ledger, shared-subscription and retention shells name
only the port they use, never the whole Replica, and a real Replica provides every port."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.broker.conftest import replica_over_log
from tidelog.broker.ports import ConfirmWaits, LedgerHost, RetentionHost, SharedHost, WritePath

BROKER = Path(__file__).resolve().parents[2] / "broker"
SHELLS = {"ledgers.py": "LedgerHost", "shared.py": "SharedHost", "retention.py": "RetentionHost"}


def test_a_replica_provides_every_port(tmp_path: Path) -> None:
    replica, log = replica_over_log(tmp_path)
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
