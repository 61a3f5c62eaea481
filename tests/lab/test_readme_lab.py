"""The README's network-lab block ("Two datacenters in a lab"), run as shown on a lab cluster of
its own (tests/cli/test_readme_blocks.py runs the others). Here so that it runs with the lab's
tests, first in the suite (tests/conftest.py: the longest modules first)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_readme_blocks import block, run_script, shown
from tests.lab.test_lab import assert_drill_checks, faults_of
from tidelog.lab import net
from tidelog.lab.plan import lab_prefix

pytestmark = pytest.mark.slow

#: The network lab's block, as shown, at a suite's pace: each alternative of `kill|pause|resume`
#: in turn (a killed broker is started again by `resume`), and the drills with shorter phases.
_PACE = "--warmup 1.5 --settle 2 --hold 0.5"
LAB = {
    "tide fault partition dc-a dc-b [--one-way]": "tide fault partition dc-a dc-b --one-way",
    "tide fault kill|pause|resume broker-a-0": (
        "tide fault pause broker-a-0 ; tide fault resume broker-a-0 ; tide fault kill broker-a-0 ; "
        "tide fault resume broker-a-0"
    ),
    "tide drill run isolate-master-dc --data-dir ./lab-data [--json]": (
        f"tide drill run isolate-master-dc --data-dir ./lab-data --json {_PACE}"
    ),
    "tide drill random --seed 7 --steps 5 --data-dir ./lab-data": (
        f"tide drill random --seed 7 --steps 2 --data-dir ./lab-data --json {_PACE}"
    ),
}


@pytest.mark.skipif(net.unavailable_reason() is not None, reason=f"network lab: {net.unavailable_reason()}")
def test_the_network_lab_section_runs_as_shown(tmp_path: Path) -> None:
    script = shown(block("sh", "Two datacenters in a lab: faults and drills"), LAB)
    prefix = lab_prefix(str((tmp_path / "lab-data").resolve()))
    try:
        out = run_script(script, tmp_path, 600, data_dir="lab-data")
    finally:
        leftover = {ns for ns in net.existing_namespaces() if ns.startswith(prefix)}
        for ns in leftover:  # never leave a namespace behind
            subprocess.run(["ip", "netns", "del", ns], check=False)
    assert not leftover, f"`tide cluster down` left {sorted(leftover)}"
    # the drills' --json reports (tests/lab/test_lab.py leaves these two runs to this test), each
    # document the lines from a lone "{" to the next lone "}": isolate-master-dc, then the random one
    found = [
        json.loads(m.group(0)) for m in re.finditer(r"^\{$.*?^\}$", out.stdout, re.MULTILINE | re.DOTALL)
    ]
    scenarios = [r["scenario"] for r in found]
    assert scenarios == ["isolate-master-dc", "random seed 7, 2 steps"], out.stdout[-3000:]
    for report in found:
        assert_drill_checks(report)
    isolate, random_run = found
    assert isolate["whole_after_heal"] is True
    assert isolate["max_write_gap_s"] < 30  # liveness, not speed: writes came back after the fault
    assert len(faults_of(random_run)) == 2  # the random schedule drew the 2 faults asked for
