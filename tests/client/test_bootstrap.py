"""The command line while no controller answers: `tide cluster up --json` names every address a
client may bootstrap from, `tide cluster status` shows each broker's own view, what needs the
controllers fails with one CONTROLLER_UNAVAILABLE line within seconds, and the controller drills
(`tide drill run controllers-down ...`) report their outage (docs/ARCHITECTURE.md §7.5, §11).

Every controller paused here (SIGSTOP) is resumed by the test that paused it. One cluster serves
the module: the controllers come back whole from the first test, and the drills, last, heal what
they break (each asserts the cluster whole after its heal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.client.conftest import LocalCluster, tide
from tests.procs import wait_until

pytestmark = pytest.mark.slow


def ok_json(*args: str, timeout: float = 120.0) -> Any:
    out = tide(*args, "--json", timeout=timeout)
    assert out.returncode == 0, f"tide {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
    assert "Traceback" not in out.stderr
    return json.loads(out.stdout)


@contextlib.contextmanager
def controllers_paused(c: LocalCluster) -> Iterator[None]:
    pids = [p["pid"] for p in c.state()["processes"] if p["kind"] == "controller"]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_status_and_refusals_while_the_controllers_are_away(cluster: LocalCluster) -> None:
    c = cluster
    state = c.state()
    brokers = [p["address"] for p in state["processes"] if p["kind"] == "broker"]
    assert c.up_doc["bootstrap"] == [c.controllers, *brokers]
    bootstrap = ",".join(c.up_doc["bootstrap"])
    ok_json("topic", "create", "t", "--queues", "2", "--controllers", c.controllers)
    # each broker's cluster view holds t before the controllers go away (a heartbeat, every 0.5 s,
    # brings it): paused sooner, the brokers would route nothing to t, rightly
    for b in brokers:
        wait_until(
            lambda b=b: "t" in [x["name"] for x in ok_json("topic", "list", "--controllers", b)],
            30,
            what=f"the view of broker {b} to hold topic t",
        )
    before = ok_json("cluster", "status", "--controllers", bootstrap)
    assert before["controllers"] == {"reachable": True}
    master = before["broker_sets"][0]["master"]
    with controllers_paused(c):
        # the brokers notice within a few heartbeats (0.5 s each in deploy/local.yaml)
        status: dict[str, Any] = {}

        def away() -> bool:
            nonlocal status
            status = ok_json("cluster", "status", "--controllers", bootstrap, timeout=60)
            # every member's own view too: each broker says when it last heard a controller, and
            # one may have had a reply a moment after the other
            members = [m for bs in status["broker_sets"] for m in bs["members"]]
            return (
                not status["controllers"]["reachable"]
                and status["controllers"]["view_age_ms"] > 1500
                and all((m.get("controller_heard_ms_ago") or 0) > 1500 for m in members)
            )

        wait_until(away, 60, what="cluster status to say the controllers are unreachable")
        (bs,) = status["broker_sets"]
        assert bs["master"] == master and bs["epoch"] == before["broker_sets"][0]["epoch"]
        roles = sorted(m["role"] for m in bs["members"])
        assert roles == ["master", "slave"], bs
        assert all(m["max_offset"] is not None and m["controller_heard_ms_ago"] > 1500 for m in bs["members"])
        assert sorted(bs["sync_state_set"]) == sorted(m["broker_id"] for m in bs["members"])

        # The table, the refusals and a produce each wait on their own (seconds, for the quorum's
        # refusals), and none of them needs another: they run at once.
        def create(where: str) -> tuple[subprocess.CompletedProcess[str], float]:
            started = time.monotonic()
            out = tide("topic", "create", "u", "--queues", "2", "--controllers", where, timeout=60)
            return out, time.monotonic() - started

        wheres = (c.controllers, brokers[0])
        with ThreadPoolExecutor(2 + len(wheres)) as pool:
            table_run = pool.submit(tide, "cluster", "status", "--controllers", bootstrap, timeout=60)
            creates = [pool.submit(create, where) for where in wheres]
            sent_run = pool.submit(
                tide, "produce", "t", "--count", "10", "--controllers", brokers[1], timeout=60
            )

        # the table says it on one line of its own
        table = table_run.result()
        assert table.returncode == 0 and "controllers unreachable" in table.stderr, table.stderr

        # what needs a quorum: one line, CONTROLLER_UNAVAILABLE, within seconds, from either address
        for where, created in zip(wheres, creates, strict=True):
            out, took = created.result()
            assert out.returncode != 0 and "Traceback" not in out.stderr
            lines = [ln for ln in out.stderr.strip().splitlines() if not ln.startswith("waiting:")]
            assert len(lines) == 1 and "CONTROLLER_UNAVAILABLE" in lines[0], out.stderr
            assert took < 20, f"{where}: {took:.1f} s"

        # writes go on, through a broker's address alone
        sent = sent_run.result()
        assert sent.returncode == 0, sent.stderr


def run_drill(c: LocalCluster, scenario: str) -> dict[str, Any]:
    out = tide(
        "drill",
        "run",
        scenario,
        "--warmup",
        "1",
        "--settle",
        "1",
        "--hold",
        "0.2",  # 6 s without controllers
        "--data-dir",
        str(c.data_dir),
        "--json",
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    assert report["acked"] > 0 and report["acked_lost"] == 0, report
    assert not report["split_brain"] and report["replicas_identical"], report
    return report


def test_the_controller_drills(cluster: LocalCluster) -> None:
    c = cluster
    down = run_drill(c, "controllers-down")["controllers_down"]
    assert down["outage_s"] >= 5 and down["acked"] > 0, down
    assert isinstance(down["max_write_gap_s"], float)

    report = run_drill(c, "controllers-down-then-master-dies")
    dies = report["controllers_down"]
    assert dies["elected_without_controllers"] is False, dies
    assert dies["elected_after_return_s"] is not None, report["steps"]
    steps = [s["step"] for s in report["steps"]]
    resumed = next(i for i, s in enumerate(steps) if s.startswith("resume controller-"))
    assert resumed < next(i for i, s in enumerate(steps) if "is master" in s), steps
    assert report["whole_after_heal"]
