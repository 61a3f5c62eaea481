"""Row 1 of docs/SECURITY.md's probe table: what `tide cluster up -c deploy/secure.yaml` and its
processes write is readable by their owner only, users' signing keys are not in the Raft journal
in clear, and a process refuses a data directory, key or config that others could read."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.client.conftest import REPO, LocalCluster, tide
from tidelog import access

pytestmark = pytest.mark.slow


def loose(path: Path) -> bool:
    return bool(stat.S_IMODE(os.lstat(path).st_mode) & 0o077)


def test_every_file_and_directory_of_a_secure_cluster_is_private(secure: LocalCluster) -> None:
    env = {"TIDE_CONTROLLERS": secure.controllers}
    env.update(
        TIDE_CA_FILE=secure.up_doc["ca_file"],
        TIDE_ACCESS_KEY=secure.up_doc["credentials"]["access_key"],
        TIDE_SECRET_KEY=secure.up_doc["credentials"]["secret_key"],
    )
    made = tide("user", "create", "alice", "--json", env=env)
    assert made.returncode == 0, made.stderr
    found = []
    for root, dirs, files in os.walk(secure.data_dir):
        found += [Path(root) / n for n in dirs + files]
    assert any(p.name == "raft.journal" for p in found) and any(p.name == "cluster.json" for p in found)
    assert any(p.name.isdigit() and len(p.name) == 20 for p in found)  # segments
    offenders = [
        f"{p} {stat.S_IMODE(os.lstat(p).st_mode):04o}" for p in [secure.data_dir, *found] if loose(p)
    ]
    assert offenders == []


def test_the_journal_holds_no_signing_key_in_clear(secure: LocalCluster) -> None:
    creds = secure.up_doc["credentials"]
    key = access.signing_key(creds["secret_key"], creds["access_key"])
    journals = list(secure.data_dir.rglob("raft.journal")) + list(secure.data_dir.rglob("raft.snapshot"))
    assert journals
    for path in journals:
        data = path.read_bytes()
        assert key.encode() not in data and bytes.fromhex(key) not in data, path


def run_broker(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "broker", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )


def test_a_broker_refuses_a_data_dir_key_or_config_others_can_read(
    secure: LocalCluster, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "identity.json").write_text("{}")
    os.chmod(data, 0o755)
    doc = {**yaml.safe_load((secure.data_dir / "broker-a-0.yaml").read_text()), "data_dir": str(data)}
    copy = tmp_path / "broker.yaml"
    copy.write_text(yaml.safe_dump(doc))
    os.chmod(copy, 0o600)
    out = run_broker(copy)
    assert out.returncode != 0 and "INSECURE_PERMISSIONS" in out.stderr and "chmod -R go-rwx" in out.stderr

    os.chmod(data, 0o700)
    key = tmp_path / "broker.key"
    key.write_bytes(Path(doc["tls"]["key"]).read_bytes())
    os.chmod(key, 0o644)
    copy.write_text(yaml.safe_dump({**doc, "tls": {**doc["tls"], "key": str(key)}}))
    out = run_broker(copy)
    assert out.returncode != 0 and "INSECURE_PERMISSIONS" in out.stderr and str(key) in out.stderr

    os.chmod(copy, 0o644)  # it holds the cluster secret
    out = run_broker(copy)
    assert out.returncode != 0 and "INSECURE_PERMISSIONS" in out.stderr and str(copy) in out.stderr
