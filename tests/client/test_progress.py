"""Progress bars of long commands (`tide produce --count`, `tide cluster up`, the drills): drawn on
a terminal's standard error only, never into --json output or a pipe."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.conftest import TIDE, LocalCluster, tide, tide_env
from tidelog.cli import common

SMALL = """
host: 127.0.0.1
ports: auto
controller: {nodes: 1, heartbeat_interval_ms: 500, heartbeat_timeout_ms: 2500}
broker_sets: [{name: broker-a, replicas: 1}]
broker: {flush: async, replication: async, heartbeat_interval_ms: 500}
"""


def test_progress_is_shown_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert common.progress_shown(as_json=False)
    assert not common.progress_shown(as_json=True), "never beside --json output"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not common.progress_shown(as_json=False), "never into a pipe or a file"


def on_terminal(
    *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
) -> tuple[str, str, int]:
    """Run `tide ARGS` with standard error on a pseudo-terminal and standard output on a pipe:
    (stdout, what the terminal showed, exit code). `env` adds variables to its environment."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*TIDE, *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=tide_env({"TERM": "xterm", **(env or {})}),
    )
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], timeout)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return out, shown.decode(errors="replace"), proc.wait(timeout=timeout)


@pytest.mark.slow
def test_produce_and_cluster_up_draw_progress_on_a_terminal_only(
    tmp_path: Path, cluster_factory: Callable[..., LocalCluster]
) -> None:
    topology = tmp_path / "small.yaml"
    topology.write_text(SMALL)
    data_dir = tmp_path / "up"
    out, shown, code = on_terminal("cluster", "up", "-c", str(topology), "--data-dir", str(data_dir))
    try:
        assert code == 0, shown
        assert "starting" in shown, f"no progress on the terminal: {shown!r}"
        assert "export TIDE_CONTROLLERS=" in out
        controllers = out.split("export TIDE_CONTROLLERS=")[1].split()[0]
        assert tide("topic", "create", "p", "--queues", "1", "--controllers", controllers).returncode == 0
        args = ("produce", "p", "--count", "20000", "--batch", "50", "--controllers", controllers)
        out, shown, code = on_terminal(*args)
        assert code == 0 and "producing to p" in shown, shown
        out, shown, code = on_terminal(*args, "--json")
        assert code == 0 and "producing" not in shown, "no progress beside --json"
        assert json.loads(out)["sent"] == 20000
        piped = tide(*args)
        assert piped.returncode == 0 and "producing" not in piped.stderr + piped.stdout
    finally:
        tide("cluster", "down", "--data-dir", str(data_dir))
