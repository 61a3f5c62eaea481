"""Progress bars on every command that can run longer than two seconds (issue 40): drawn on a
terminal's standard error, never into a pipe, and not with --quiet. Each command runs as a user
runs it, its standard error on a pseudo-terminal (tests/client/test_progress.py's `on_terminal`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.client.conftest import LocalCluster, tide
from tests.client.test_progress import on_terminal
from tidelog.cli import common

pytestmark = pytest.mark.slow


def at(cluster: LocalCluster) -> dict[str, str]:
    return {"TIDE_CONTROLLERS": cluster.controllers}


@pytest.fixture(scope="module")
def stocked(cluster: LocalCluster) -> str:
    assert tide("topic", "create", "bars", "--queues", "2", env=at(cluster)).returncode == 0
    sent = tide("produce", "bars", "--count", "400", env=at(cluster))
    assert sent.returncode == 0, sent.stderr
    return "bars"


def test_quiet_turns_progress_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    monkeypatch.delenv(common.QUIET_ENV, raising=False)
    assert common.progress_shown(as_json=False)
    monkeypatch.setenv(common.QUIET_ENV, "1")
    assert not common.progress_shown(as_json=False)


def test_produce_draws_a_bar_unless_quiet(cluster: LocalCluster, stocked: str) -> None:
    _, shown, code = on_terminal("produce", stocked, "--count", "300", "--batch", "10", env=at(cluster))
    assert code == 0 and "producing to bars" in shown, shown
    for quiet in (("--quiet", "produce", stocked), ("produce", stocked, "--quiet")):
        _, shown, code = on_terminal(*quiet, "--count", "300", "--batch", "10", env=at(cluster))
        assert code == 0 and shown == "", f"{quiet}: {shown!r}"


def test_consume_with_a_count_into_a_pipe_draws_a_bar(cluster: LocalCluster, stocked: str) -> None:
    out, shown, code = on_terminal(
        "consume", stocked, "--group", "bars-g", "--from-beginning", "--max-messages", "300", env=at(cluster)
    )
    assert code == 0 and "consuming bars" in shown, shown
    assert len(out.splitlines()) == 300
    out, shown, code = on_terminal(
        "consume",
        stocked,
        "--group",
        "bars-q",
        "--from-beginning",
        "--max-messages",
        "5",
        "--quiet",
        env=at(cluster),
    )
    assert (code, shown, len(out.splitlines())) == (0, "", 5)


def test_broker_verify_draws_a_bar(cluster: LocalCluster, stocked: str) -> None:
    config = Path(next(p["args"] for p in cluster.state()["processes"] if p["name"] == "broker-a-1")[2])
    data_dir = next(
        line.split(":", 1)[1].strip()
        for line in config.read_text().splitlines()
        if line.startswith("data_dir:")
    )
    out, shown, code = on_terminal("broker", "verify", "--data-dir", data_dir)
    assert code == 0 and "verifying" in shown, shown
    assert "no damaged record" in out
    _, shown, code = on_terminal("broker", "verify", "--data-dir", data_dir, "--quiet")
    assert (code, shown) == (0, "")


def test_placement_repair_draws_a_spinner(cluster: LocalCluster) -> None:
    args = ("placement", "repair", "--data-dir", str(cluster.data_dir))
    out, shown, code = on_terminal(*args, env=at(cluster))
    assert code == 0 and "re-replicating up to 100 ledgers" in shown, shown
    assert "nothing to re-replicate" in out
    doc, shown, code = on_terminal(*args, "--json", env=at(cluster))
    assert (code, shown) == (0, "") and json.loads(doc)["repaired"] == []
