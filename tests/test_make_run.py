"""Scenario: a newcomer runs `make run` from the repository root. It starts the embedded default
cluster, produces, consumes with a group, kills the master, prints a summary in which no
acknowledged message was lost, and leaves no process behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tidelog.localcluster.procs import PORT_SLICE_ENV

REPO = Path(__file__).resolve().parents[1]


def tidelog_processes() -> dict[int, str]:
    """Running (not zombie) `tidelog.cli` processes: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if "tidelog.cli" in line:
            out[int(entry.name)] = line
    return out


def summary_value(output: str, label: str) -> str:
    m = re.search(rf"^\W*{re.escape(label)}\s*\W\s*(\S+)\s*\W*$", output, re.MULTILINE)
    assert m, f"no {label!r} row in the summary:\n{output}"
    return m.group(1)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run(tmp_path: Path) -> None:
    # The demo keeps its cluster under the temporary directory: point it at this test's own, so
    # its processes are told apart from any other tidelog process running on the machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_") or k == PORT_SLICE_ENV}
    # A shorter drill than the newcomer's 15 s: it still waits for the failover and the old
    # master's rejoin however long they take (drill/killmaster.py).
    env.update(TMPDIR=str(tmp_path), COLUMNS="120", TIDE_DEMO_DRILL_DURATION="5")
    # `make run` installs only when its stamp is older than pyproject.toml. This test checks the
    # run, not the install (which needs the network): if the stamp is stale, keep it as it is.
    fresh = subprocess.run(["make", "-q", "install"], cwd=REPO, env=env, capture_output=True).returncode == 0
    command = ["make", "run"] if fresh else ["make", "-o", ".venv/.installed", "run"]
    before = set(tidelog_processes())
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    leftovers = {
        pid: line for pid, line in tidelog_processes().items() if pid not in before and str(tmp_path) in line
    }
    for pid in leftovers:  # do not leave them running even when the assertion below fails
        os.kill(pid, 9)

    assert proc.returncode == 0, output
    assert "Traceback" not in output
    assert summary_value(output, "drill acked lost") == "0"
    assert int(summary_value(output, "drill acked")) > 0
    produced = int(summary_value(output, "produced"))
    assert produced > 0 and int(summary_value(output, "consumed")) == produced
    assert leftovers == {}, f"make run left tidelog processes running: {leftovers}"
