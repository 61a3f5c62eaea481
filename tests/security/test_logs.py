"""Logs that cannot fill the disk: a process logging to `log_file` rotates it by size and keeps
`log_backups` old files, private, in either format (tidelog/logs.py); the configs take the keys."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog import logs
from tidelog.broker.config import from_mapping
from tidelog.controller.config import parse
from tidelog.errors import ConfigError


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, umask = list(root.handlers), root.level, os.umask(0o022)
    os.umask(umask)
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        os.umask(umask)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_log_file_is_rotated_by_size_and_its_total_is_bounded(
    tmp_path: Path, fmt: str, restore_logging: None
) -> None:
    path = tmp_path / "broker.log"
    logs.configure(fmt, "INFO", tag="t", file=str(path), max_bytes=4096, backups=2)
    log = logging.getLogger("tidelog.test")
    for i in range(2000):
        log.info("line %d %s", i, "x" * 40)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["broker.log", "broker.log.1", "broker.log.2"]
    for name in files:
        p = tmp_path / name
        assert p.stat().st_size <= 4096 and stat.S_IMODE(p.stat().st_mode) == 0o600
    last = path.read_text().splitlines()[-1]
    if fmt == "json":
        assert json.loads(last)["message"].startswith("line 1999")
    else:
        assert "line 1999" in last


def test_the_configs_take_the_log_keys() -> None:
    broker = {"broker_set": "a", "data_dir": "d", "controllers": "127.0.0.1:1", "secret": "s"}
    cfg = from_mapping({**broker, "log_file": "/var/log/b.log", "log_max_bytes": 1 << 20, "log_backups": 1})
    assert (cfg.log_file, cfg.log_max_bytes, cfg.log_backups) == ("/var/log/b.log", 1 << 20, 1)
    with pytest.raises(ConfigError):
        from_mapping({**broker, "log_max_bytes": 0})
    nodes = [{"id": "c1", "raft": "127.0.0.1:9801", "grpc": "127.0.0.1:9701"}]
    ctrl = parse({"data_dir": "d", "nodes": nodes, "secret": "s", "log_file": "/var/log/{node_id}.log"})
    assert ctrl.log_file == "/var/log/c1.log" and ctrl.log_max_bytes == 64 << 20 and ctrl.log_backups == 4
    with pytest.raises(ConfigError):
        parse({"data_dir": "d", "nodes": nodes, "secret": "s", "log_backups": 0})
