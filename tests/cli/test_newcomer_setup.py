"""A newcomer's first hour (issue 40) around the cluster rather than its data: `tide cluster up`
from any directory (row 7), a quiet install (13), the Spark examples without Spark (14), a
restart that returns once the process serves (15), the same ports on every `up` of a data
directory (16), and a clone that stays clean (17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.client.conftest import REPO, TIDE, LocalCluster, stop_cluster, tide, tide_env
from tidelog.cli.cluster import topology_path


def test_row7_a_deploy_topology_is_found_from_any_directory(tmp_path: Path) -> None:
    os.chdir(tmp_path)  # pytest's tmp_path: nothing named deploy/ here
    try:
        assert topology_path("deploy/local.yaml").read_text() == (REPO / "deploy" / "local.yaml").read_text()
        assert topology_path("secure.yaml").read_text() == (REPO / "deploy" / "secure.yaml").read_text()
        assert topology_path("deploy/nosuch.yaml") == Path("deploy/nosuch.yaml"), "still refused by name"
        assert topology_path("/elsewhere/deploy/local.yaml") == Path("/elsewhere/deploy/local.yaml")
    finally:
        os.chdir(REPO)


@pytest.mark.slow
def test_rows_7_15_16_up_from_a_subdirectory_restart_and_up_again_after_a_crash(tmp_path: Path) -> None:
    where = tmp_path / "somewhere" / "deeper"
    where.mkdir(parents=True)
    data_dir = tmp_path / "data"

    def up() -> subprocess.CompletedProcess[str]:
        # as a user runs it: no -c, from a directory that is not the clone
        return subprocess.run(
            [*TIDE, "cluster", "up", "--data-dir", str(data_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=where,
            stdin=subprocess.DEVNULL,
            env=tide_env(),
        )

    first = up()
    assert first.returncode == 0, first.stderr
    cluster = LocalCluster(data_dir.resolve(), first.stdout, json.loads(first.stdout))
    try:
        controllers = cluster.controllers
        # row 15: restart returns once the broker serves again; it is alive in the very next call
        restarted = tide("cluster", "restart", "broker-a-0", "--data-dir", str(data_dir), "--json")
        assert restarted.returncode == 0, restarted.stderr
        assert json.loads(restarted.stdout)["serving"] is True
        metrics = next(p["metrics"] for p in cluster.up_doc["processes"] if p["name"] == "broker-a-0")
        ready = tide("health", "--address", metrics)  # asked once, no --wait
        assert ready.returncode == 0, ready.stdout + ready.stderr
        # row 16: every process killed at once, then `up` again on the same data directory
        for pid in cluster.pids().values():
            os.kill(pid, signal.SIGKILL)
        again = up()
        assert again.returncode == 0, again.stderr
        doc = json.loads(again.stdout)
        assert doc["controllers"] == controllers, "the exported TIDE_CONTROLLERS still names the controller"
        assert [p["address"] for p in doc["processes"]] == [p["address"] for p in cluster.up_doc["processes"]]
        cluster.up_doc = doc
    finally:
        stop_cluster(cluster)


@pytest.mark.slow
def test_row13_the_package_builds_without_warnings_and_carries_the_topologies(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore:Editable installation"},
    )
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr and "would be ignored" not in out.stderr, out.stderr
    (wheel,) = tmp_path.glob("tidelog-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"tidelog/deploy/local.yaml", "tidelog/deploy/secure.yaml"} <= names
    assert "tidelog/proto/rocketmq/apache/rocketmq/v2/service.proto" in names


def test_row13_make_install_quiets_the_editable_notice() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert 'QUIET_BUILD := PYTHONWARNINGS="ignore:Editable installation"' in makefile
    installs = [line for line in makefile.splitlines() if "pip install -q -e" in line]
    assert len(installs) == 2 and all(line.strip().startswith("$(QUIET_BUILD)") for line in installs)


@pytest.mark.parametrize("example", ["topic_to_parquet.py", "key_counts_stream.py"])
def test_row14_an_example_without_spark_says_run_make_spark(example: str) -> None:
    # as if PySpark were not installed (whether or not it is in this environment)
    run = (
        "import runpy, sys; sys.modules['pyspark'] = None; "
        f"sys.argv = [{example!r}]; runpy.run_path('examples/{example}', run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", run],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert (out.returncode, out.stderr) == (
        1,
        "error: this example needs PySpark, which is not installed: run `make spark` first (it installs "
        "the spark extra into .venv, and Java 17 when missing)\n",
    )


@pytest.mark.parametrize(
    "path", ["tide-data/x", "tide-data2/x", "lab-data/x", "spark-warehouse/x", "metastore_db/x", "derby.log"]
)
def test_row17_what_the_readme_and_examples_leave_is_ignored(path: str) -> None:
    out = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, capture_output=True, timeout=30)
    assert out.returncode == 0, f"{path} would show in git status"
