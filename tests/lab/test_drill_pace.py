"""A drill's pace (drill/scenarios.py): `--hold` scales how long every fault of a named
scenario or a random schedule lasts, and nothing else about it. No cluster: the drill's sleeps are
recorded instead of slept."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidelog.drill import scenarios
from tidelog.errors import ConfigError


class _RecordedSleeps:
    """The drill module's view of `time`: its sleeps recorded, not slept; the rest is the real module.
    Patching `time.sleep` itself would change it for every thread of the test process, and any
    thread still running there would spin and add its own sleeps to the record."""

    def __init__(self, slept: list[float]) -> None:
        self.sleep = slept.append

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _held(
    tmp_path: Path,
    hold_scale: float,
    schedule: Callable[[scenarios.Drill], None],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[float]]:
    """Run `schedule` on a drill of that hold scale: (the fault steps, every hold slept)."""
    (tmp_path / "cluster.json").write_text(
        json.dumps({"processes": [{"name": "controller-c1", "kind": "controller"}]})
    )
    d = scenarios.Drill(tmp_path, "broker-a", client=None, note=lambda _msg: None, hold_scale=hold_scale)  # type: ignore[arg-type]
    steps: list[str] = []
    slept: list[float] = []
    monkeypatch.setattr(scenarios, "time", _RecordedSleeps(slept))
    monkeypatch.setattr(d, "master", lambda: {"name": "broker-a-0", "datacenter": "dc-a"})
    monkeypatch.setattr(d, "dcs", lambda: ["dc-a", "dc-b"])
    monkeypatch.setattr(d, "proc", lambda verb, name: steps.append(f"{verb} {name}"))
    monkeypatch.setattr(d, "heal", lambda: steps.append("heal"))
    schedule(d)
    return steps, slept


def test_a_named_scenario_holds_its_fault_for_its_time_times_the_scale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = scenarios.SCENARIOS["kill-master"][0]
    assert _held(tmp_path, 1.0, schedule, monkeypatch) == (["kill broker-a-0"], [8])
    assert _held(tmp_path, 0.5, schedule, monkeypatch) == (["kill broker-a-0"], [4])


def test_a_random_schedule_keeps_its_faults_and_scales_its_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps, slept = _held(tmp_path, 1.0, scenarios.random_schedule(7, 4, lab=False), monkeypatch)
    half_steps, half_slept = _held(tmp_path, 0.5, scenarios.random_schedule(7, 4, lab=False), monkeypatch)
    # the same faults (a controller fault takes two: pause them, kill the master), a heal per step
    assert half_steps == steps and steps.count("heal") == 4 and len(steps) >= 8
    assert half_slept == pytest.approx([s / 2 for s in slept])
    assert all(1.0 <= s <= 5.0 for s in slept[::2]), slept  # each fault's hold


@pytest.mark.parametrize("scale", [0.0, -1.0, 11.0])
def test_a_hold_scale_out_of_range_is_refused_before_anything_runs(tmp_path: Path, scale: Any) -> None:
    with pytest.raises(ConfigError, match="hold scale"):
        scenarios.run(tmp_path / "no-cluster-here", "kill-master", hold_scale=scale)
