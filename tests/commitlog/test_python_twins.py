"""The commit log's tests once more on the Python twins of the C loops (commitlog/speedups.py):
the other tests of this folder, in a pytest process of their own with `TIDELOG_PURE_PYTHON=1`
(read at import, so for a whole process), while the suite's other modules run beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
PURE = "TIDELOG_PURE_PYTHON"


@pytest.mark.slow  # `make check` leaves it to `make test`: a whole second run of the folder
@pytest.mark.skipif(os.environ.get(PURE) == "1", reason="this process already runs the Python twins")
def test_the_commit_log_tests_pass_on_the_python_twins(tmp_path: Path) -> None:
    env = {**os.environ, PURE: "1"}
    # the variable reaches the module that chooses: no C loop serves a process that has it
    chosen = [sys.executable, "-c", "from tidelog.commitlog import speedups; print(speedups.native)"]
    assert (
        subprocess.run(chosen, capture_output=True, text=True, env=env, check=True).stdout.strip() == "None"
    )
    env.pop("PYTEST_XDIST_WORKER", None)  # a pytest of its own, not a worker of this run's
    env.pop("PYTEST_ADDOPTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider"]
    command += [f"--basetemp={tmp_path / 'basetemp'}", "--ignore", str(HERE), str(HERE.parent)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=HERE.parents[2], env=env)
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and " failed" not in out.stdout, tail
